"""LinearScan: h_t = a_t ⊙ h_{t-1} + b_t (MinGRU, MinLSTM, gated linear recurrences)."""

from framefuse.plugins.linear_scan.interface import launch, linear_scan, plan
from framefuse.plugins.linear_scan.naive import reference
from framefuse.plugins.linear_scan.schema import SCHEMA

__all__ = ["SCHEMA", "launch", "linear_scan", "plan", "reference"]
