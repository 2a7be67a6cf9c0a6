// Attention over a window, the pieces that are not plain math: a fully masked row (its max is
// −inf, its weights sum to 0) gives 0, not NaN. The step compiler's (compiler/ops.py).
#pragma once

namespace ff {
// exp(s − max) with max taken as 0 on a fully masked row (every weight is then exp(−inf) = 0)
__device__ __forceinline__ float attention_weight(float s, float row_max) {
    return expf(s - (row_max == -__int_as_float(0x7f800000) ? 0.0f : row_max));
}
// Σ p·v / Σ p, or 0 on a fully masked row: the one row whose weights sum to 0, since a row with a
// finite max weighs its max's score exp(0) = 1 (NaN scores give NaN)
__device__ __forceinline__ float attention_finish(float acc, float total) {
    return total == 0.0f ? 0.0f : acc / total;
}
}  // namespace ff
