"""LiquidScan: the CfC closed-form liquid cell over a sequence as one persistent kernel.
See plugins/OPS.md."""

from framefuse.plugins.liquid_scan.interface import launch, liquid_scan
from framefuse.plugins.liquid_scan.naive import reference
from framefuse.plugins.liquid_scan.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "liquid_scan"]
