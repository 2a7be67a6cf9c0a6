"""GatedDeltaRuleScan (domain `framefuse`, gated DeltaNet): S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1}
+ β_t k_t v_tᵀ with α_t = exp(g_t), o_t = S_tᵀ q_t, S [Dk, Dv] as transformers' Qwen3-Next and
flash-linear-attention keep it. See OPS.md.

Exports SCHEMA, reference (torch ground truth), launch (GPU kernel entry) and `gated_delta_rule_scan`.
Importing this package needs neither a GPU nor cuda-python.
"""

from framefuse.plugins.gated_delta_rule_scan.interface import gated_delta_rule_scan, launch
from framefuse.plugins.gated_delta_rule_scan.naive import reference
from framefuse.plugins.gated_delta_rule_scan.schema import SCHEMA

__all__ = ["SCHEMA", "reference", "launch", "gated_delta_rule_scan"]
