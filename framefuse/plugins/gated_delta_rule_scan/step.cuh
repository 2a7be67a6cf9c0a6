// Gated DeltaNet, one step of one state element (S is [Dk, Dv]):
//   S'[i, v] = α·S[i, v] + β·k_i·(v_v − α·(kᵀS)_v),  α = exp(g)
// the expanded α(I − β k kᵀ)S + β k vᵀ. Shared by gated_delta_rule_scan.cu and the step compiler.
#pragma once

namespace ff {
__device__ __forceinline__ float gated_delta_state(float s, float g, float beta, float k_i, float v_v, float ks_v) {
    const float alpha = expf(g);
    return alpha * s + beta * k_i * (v_v - alpha * ks_v);
}
}  // namespace ff
