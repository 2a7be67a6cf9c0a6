"""ToySilu (domain `framefuse`): y = x · sigmoid(x), the op README's "Adding an op" adds.

Exports SCHEMA, reference (naive.py) and launch (the CUDA entry), as every op package does.
Importing it needs neither a GPU nor cuda-python.
"""

from toy_ops.toy_silu.interface import launch
from toy_ops.toy_silu.naive import reference
from toy_ops.toy_silu.schema import SCHEMA

__all__ = ["SCHEMA", "launch", "reference"]
