// Attention over a window, the pieces that are not plain math: a fully masked row (its max is
// −inf) gives 0, not NaN. Shared by attention.cu and the step compiler.
#pragma once

namespace ff {
// exp(s − max) with max taken as 0 on a fully masked row (every weight is then exp(−inf) = 0)
__device__ __forceinline__ float attention_weight(float s, float row_max) {
    return expf(s - (row_max == -__int_as_float(0x7f800000) ? 0.0f : row_max));
}
// Σ p·v / Σ p, or 0 on a fully masked row
__device__ __forceinline__ float attention_finish(float acc, float total, float row_max) {
    return row_max == -__int_as_float(0x7f800000) ? 0.0f : acc / total;
}
}  // namespace ff
