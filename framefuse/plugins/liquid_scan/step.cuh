// CfC liquid cell, one step. Shared by liquid_scan.cu and the step compiler.
//   g = xg + h·Rᵀ split into (g1, g2, ga, gb); τ = σ(ga·ts + gb); h' = tanh(g1)·(1 − τ) + τ·tanh(g2)
#pragma once

namespace ff {
__device__ __forceinline__ float liquid_hidden(float g1, float g2, float ga, float gb, float ts) {
    const float tau = 1.0f / (1.0f + expf(-(ga * ts + gb)));
    return tanhf(g1) * (1.0f - tau) + tau * tanhf(g2);
}
}  // namespace ff
