"""Attention (domain `framefuse`): o = softmax(scale · q kᵀ + mask) v per head, GQA, bottom-right
causal alignment, fully masked rows → 0. See OPS.md.

Exports SCHEMA, reference (torch ground truth), launch (GPU kernel entry) and `attention`.
Importing this package needs neither a GPU nor cuda-python.
"""

from framefuse.plugins.attention.interface import attention, launch
from framefuse.plugins.attention.naive import reference
from framefuse.plugins.attention.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "attention"]
