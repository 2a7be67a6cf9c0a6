// GatedDeltaRuleScan (domain `framefuse`, gated DeltaNet). See OPS.md and naive.py.
//
//   S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,  α_t = exp(g_t),   o_t = S_tᵀ q_t   (S is [Dk, Dv], fp32)
//
// computed per value column of S as transformers' Qwen3-Next recurrent form does; the kernel is the
// delta-rule family's (../delta_rule_scan/delta_rule_kernel.cuh) with the decay.
// Entries gated_delta_rule_scan_<f32|f16|bf16>_k<32|64|128> (P = 2, 4, 8). Arguments: q, k, v, g,
// beta, S0 (nullable: zeros), o, S_last, BH (= B·H), T, Dk, Dv. S0/S_last are [B, H, Dk, Dv].

#include "../delta_rule_scan/delta_rule_kernel.cuh"

#define FF_GDELTA_ENTRY(SUFFIX, T, DK, P)                                                                     \
    extern "C" __global__ void __launch_bounds__(kThreads, 2) gated_delta_rule_scan_##SUFFIX##_k##DK(            \
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ g,       \
        const T* __restrict__ beta, const float* __restrict__ S0, T* __restrict__ o, float* __restrict__ S_last,  \
        int BH, int T_len, int Dk, int Dv) {                                                                     \
        delta_rule_scan_block<T, P, true>(q, k, v, g, beta, S0, o, S_last, BH, T_len, Dk, Dv);              \
    }
#define FF_GDELTA_ALL(SUFFIX, T) \
    FF_GDELTA_ENTRY(SUFFIX, T, 32, 2) FF_GDELTA_ENTRY(SUFFIX, T, 64, 4) FF_GDELTA_ENTRY(SUFFIX, T, 128, 8)

FF_GDELTA_ALL(f32, float)
FF_GDELTA_ALL(f16, __half)
FF_GDELTA_ALL(bf16, __nv_bfloat16)
