// RWKV-4 WKV, one step per channel with the running max p. Shared by wkv_scan.cu and the step
// compiler (OPS.md has the formula). fmaxf would drop a NaN; torch.maximum propagates it.
#pragma once

namespace ff {
__device__ __forceinline__ float wkv_nanmax(float a, float b) { return (a != a || a > b) ? a : b; }
// y = (e^{p−q}·num + e^{k+u−q}·v) / (e^{p−q}·den + e^{k+u−q}),  q = max(p, k + u)
__device__ __forceinline__ float wkv_output(float num, float den, float p, float k, float v, float u) {
    const float q = wkv_nanmax(p, k + u);
    const float e1 = expf(p - q);
    const float e2 = expf(k + u - q);
    return (e1 * num + e2 * v) / (e1 * den + e2);
}
// p' = max(p + w, k)
__device__ __forceinline__ float wkv_max(float p, float w, float k) { return wkv_nanmax(p + w, k); }
// num' = e^{p+w−p'}·num + e^{k−p'}·v  (den' is the same with v = 1)
__device__ __forceinline__ float wkv_carry(float acc, float p, float w, float k, float v, float p_next) {
    return expf(p + w - p_next) * acc + expf(k - p_next) * v;
}
}  // namespace ff
