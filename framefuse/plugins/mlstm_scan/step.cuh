// xLSTM mLSTM, one step (stabilised exponential gating; OPS.md has the formula). Shared by
// mlstm_scan.cu and the step compiler.
#pragma once

namespace ff {
__device__ __forceinline__ float mlstm_nanmax(float a, float b) { return (a != a || a > b) ? a : b; }
// log σ(x) = −softplus(−x), torch's threshold 20
__device__ __forceinline__ float mlstm_logsigmoid(float x) {
    const float nx = -x;
    return -(nx > 20.0f ? nx : log1pf(expf(nx)));
}
// m' = max(log σ(f) + m, i)
__device__ __forceinline__ float mlstm_m(float f_pre, float m, float i_pre) {
    return mlstm_nanmax(mlstm_logsigmoid(f_pre) + m, i_pre);
}
__device__ __forceinline__ float mlstm_fgate(float f_pre, float m, float m_new) {
    return expf(mlstm_logsigmoid(f_pre) + m - m_new);
}
__device__ __forceinline__ float mlstm_igate(float i_pre, float m_new) { return expf(i_pre - m_new); }
// max(|nᵀq|, exp(−m')) + eps
__device__ __forceinline__ float mlstm_denominator(float nq, float m_new, float eps) {
    return mlstm_nanmax(fabsf(nq), expf(-m_new)) + eps;
}
}  // namespace ff
