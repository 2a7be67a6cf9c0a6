"""SelectiveScan: the Mamba S6 scan with fused discretisation, C contraction, D skip and gate."""

from framefuse.plugins.selective_scan.interface import launch, plan, selective_scan
from framefuse.plugins.selective_scan.naive import reference
from framefuse.plugins.selective_scan.schema import SCHEMA

__all__ = ["SCHEMA", "launch", "plan", "reference", "selective_scan"]
