"""DeltaRuleScan (domain `framefuse`, DeltaNet): S_t = S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,
o_t = S_t q_t. See OPS.md.

Exports SCHEMA, reference (torch ground truth), launch (GPU kernel entry) and `delta_rule_scan`.
Importing this package needs neither a GPU nor cuda-python.
"""

from framefuse.plugins.delta_rule_scan.interface import delta_rule_scan, launch
from framefuse.plugins.delta_rule_scan.naive import reference
from framefuse.plugins.delta_rule_scan.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "delta_rule_scan"]
