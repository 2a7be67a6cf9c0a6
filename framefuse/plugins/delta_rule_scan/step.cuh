// DeltaNet, one step of one state element: S'[v, j] = S[v, j] + β·k_j·(v_v − (S·k)_v), the
// expanded S(I − β k kᵀ) + β v kᵀ. Shared by delta_rule_scan.cu and the step compiler.
#pragma once

namespace ff {
__device__ __forceinline__ float delta_rule_state(float s, float beta, float k_j, float v_v, float sk_v) {
    return s + beta * k_j * (v_v - sk_v);
}
}  // namespace ff
