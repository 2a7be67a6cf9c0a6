// WKVScan (domain `framefuse`, RWKV-4 WKV). See OPS.md and naive.py (same order of operations as
// transformers' rwkv_linear_attention_cpu):
//
//   q = max(p, k+u);  y = (e^{p−q} num + e^{k+u−q} v) / (e^{p−q} den + e^{k+u−q})
//   p' = max(p+w, k); num' = e^{p+w−p'} num + e^{k−p'} v;  den' = e^{p+w−p'} den + e^{k−p'}
//
// Channels never interact, so one thread owns one (batch, channel) for all T steps and keeps
// (num, den, p) in registers (fp32). Neighbouring threads read neighbouring channels, so every
// load of k, v and store of y is coalesced; the loads of the next kChunk steps are issued before
// the current chunk is computed so global latency hides behind the exp chain.
// grid = (B·⌈C / kThreads⌉) (batch on x: no 65535 limit). Entries wkv_scan_<f32|f16|bf16>. Arguments: k, v, w, u,
// num0, den0, max0 (each nullable: 0, 0, −1e38), y, num_last, den_last, max_last, B, T, C.

#include "../common.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 8;
constexpr float kMaxInit = -1e38f;

// torch.maximum propagates NaN; fmaxf would drop it.
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

template <typename T>
__device__ __forceinline__ void wkv_scan(const T* __restrict__ k, const T* __restrict__ v,
                                         const float* __restrict__ w, const float* __restrict__ u,
                                         const float* __restrict__ num0, const float* __restrict__ den0,
                                         const float* __restrict__ max0, T* __restrict__ y,
                                         float* __restrict__ num_last, float* __restrict__ den_last,
                                         float* __restrict__ max_last, int B, int T_len, int C) {
    const int blocks_per_row = (C + kThreads - 1) / kThreads;
    const int b = blockIdx.x / blocks_per_row;
    const int c = (blockIdx.x % blocks_per_row) * kThreads + threadIdx.x;
    if (c >= C) return;  // no barriers below: an early exit is safe
    const long long state_off = (long long)b * C + c;
    float num = num0 != nullptr ? num0[state_off] : 0.0f;
    float den = den0 != nullptr ? den0[state_off] : 0.0f;
    float p = max0 != nullptr ? max0[state_off] : kMaxInit;
    const float wc = w[c];
    const float uc = u[c];
    const T* kb = k + (long long)b * T_len * C + c;
    const T* vb = v + (long long)b * T_len * C + c;
    T* yb = y + (long long)b * T_len * C + c;

    float rk[kChunk], rv[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
        rk[i] = i < T_len ? ff::load_ro(kb + (long long)i * C) : 0.0f;
        rv[i] = i < T_len ? ff::load_ro(vb + (long long)i * C) : 0.0f;
    }
    for (int t0 = 0; t0 < T_len; t0 += kChunk) {
        float ck[kChunk], cv[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
            ck[i] = rk[i];
            cv[i] = rv[i];
            const int t = t0 + kChunk + i;
            rk[i] = t < T_len ? ff::load_ro(kb + (long long)t * C) : 0.0f;
            rv[i] = t < T_len ? ff::load_ro(vb + (long long)t * C) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
            const int t = t0 + i;
            if (t >= T_len) break;
            const float kt = ck[i], vt = cv[i];
            const float ku = kt + uc;
            const float q = max_nan(p, ku);
            float e1 = expf(p - q);
            float e2 = expf(ku - q);
            ff::store(yb + (long long)t * C, (e1 * num + e2 * vt) / (e1 * den + e2));
            const float pw = p + wc;
            const float p_next = max_nan(pw, kt);
            e1 = expf(pw - p_next);
            e2 = expf(kt - p_next);
            num = e1 * num + e2 * vt;
            den = e1 * den + e2;
            p = p_next;
        }
    }
    num_last[state_off] = num;
    den_last[state_off] = den;
    max_last[state_off] = p;
}

}  // namespace

#define FF_WKV_ENTRY(SUFFIX, T)                                                                               \
    extern "C" __global__ void __launch_bounds__(kThreads) wkv_scan_##SUFFIX(                                  \
        const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ w,                         \
        const float* __restrict__ u, const float* __restrict__ num0, const float* __restrict__ den0,           \
        const float* __restrict__ max0, T* __restrict__ y, float* __restrict__ num_last,                       \
        float* __restrict__ den_last, float* __restrict__ max_last, int B, int T_len, int C) {                 \
        wkv_scan<T>(k, v, w, u, num0, den0, max0, y, num_last, den_last, max_last, B, T_len, C);               \
    }

FF_WKV_ENTRY(f32, float)
FF_WKV_ENTRY(f16, __half)
FF_WKV_ENTRY(bf16, __nv_bfloat16)
