"""WKVScan (domain `framefuse`, RWKV-4 time mixing): the numerator/denominator recurrence with a
running max, as transformers' `rwkv_linear_attention_cpu` writes it. See OPS.md.

Exports SCHEMA, reference (torch ground truth), launch (GPU kernel entry) and `wkv_scan`.
Importing this package needs neither a GPU nor cuda-python.
"""

from framefuse.plugins.wkv_scan.interface import launch, wkv_scan
from framefuse.plugins.wkv_scan.naive import reference
from framefuse.plugins.wkv_scan.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "wkv_scan"]
