// DeltaRuleScan (domain `framefuse`, DeltaNet). See OPS.md and naive.py.
//
//   S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t      (S is [Dk, Dv], fp32)
//
// The kernel is the delta-rule family's (delta_rule_kernel.cuh) without the decay.
// Entries delta_rule_scan_<f32|f16|bf16>_k<32|64|128> (P = 2, 4, 8 lanes per value index; the host
// picks the smallest that holds Dk). Arguments: q, k, v, beta, S0 (nullable: zeros), o, S_last,
// BH (= B·H), T, Dk, Dv. S0/S_last are [B, H, Dk, Dv].

#include "delta_rule_kernel.cuh"

#define FF_DELTA_ENTRY(SUFFIX, T, DK, P)                                                                    \
    extern "C" __global__ void __launch_bounds__(kThreads, 2) delta_rule_scan_##SUFFIX##_k##DK(                \
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ beta, \
        const float* __restrict__ S0, T* __restrict__ o, float* __restrict__ S_last, int BH, int T_len, int Dk, \
        int Dv) {                                                                                          \
        delta_rule_scan_block<T, P, false>(q, k, v, nullptr, beta, S0, o, S_last, BH, T_len, Dk, Dv);  \
    }
#define FF_DELTA_ALL(SUFFIX, T) FF_DELTA_ENTRY(SUFFIX, T, 32, 2) FF_DELTA_ENTRY(SUFFIX, T, 64, 4) FF_DELTA_ENTRY(SUFFIX, T, 128, 8)

FF_DELTA_ALL(f32, float)
FF_DELTA_ALL(f16, __half)
FF_DELTA_ALL(bf16, __nv_bfloat16)
