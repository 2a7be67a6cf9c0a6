// SelectiveScan (Mamba S6), one step. Shared by selective_scan.cu and the step compiler.
//   Δ = softplus(dt + dt_bias) (or dt + dt_bias);  h' = exp(Δ·A)·h + (Δ·x)·B;  y = Σ_n C·h' + D·x;
//   y *= silu(z) when a gate is given.
#pragma once

namespace ff {
// softplus as torch.nn.functional.softplus (beta 1, threshold 20)
__device__ __forceinline__ float ssm_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float ssm_delta(float dt, float dt_bias, int delta_softplus) {
    const float d = dt + dt_bias;
    return delta_softplus ? ssm_softplus(d) : d;
}
// one state element: exp(Δ·A)·h + (Δ·x)·B
__device__ __forceinline__ float ssm_state(float h, float delta, float a, float delta_x, float b) {
    return expf(delta * a) * h + delta_x * b;
}
// the output gate y·silu(z)
__device__ __forceinline__ float ssm_gate(float y, float z) { return y * (z / (1.0f + expf(-z))); }
}  // namespace ff
