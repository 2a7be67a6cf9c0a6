// The delta-rule family's one kernel (DeltaRuleScan, GatedDeltaRuleScan; see OPS.md and each op's
// naive.py): for every value index r of the state, with s its Dk key entries,
//
//   s = α_t s (Gated: α_t = exp(g_t));  u = s·k_t;  s += β_t (v_t[r] − u) k_t;  o_t[r] = s·q_t
//
// which is α(I − β kkᵀ)S + β k vᵀ for the state S [Dk, Dv] of both ops (s is column r of S; α = 1
// for DeltaRuleScan). The value indices never interact, so:
//
// - a block owns ROWS value indices of one (batch, head) for all T steps; grid = (B·H, ⌈Dv / ROWS⌉);
// - P consecutive lanes share a value index, each keeping 16 of its Dk entries in registers
//   (entries sub, sub + P, ...; Dk ≤ 16·P); dot products are reduced with P-lane shuffles and no
//   block barrier is needed between steps;
// - q, k, v, β (and g) are staged through shared memory (fp32) in chunks of kChunk steps,
//   double-buffered: the loads of chunk c+1 are issued into registers before chunk c is computed
//   and stored to the other buffer after it, so global latency hides behind kChunk steps of math.
//
// The ops' .cu files instantiate it as their extern "C" entries (P = 2, 4, 8 for Dk ≤ 32, 64, 128).
#pragma once

#include "../common.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kCols = 16;    // key entries of S per thread
constexpr int kChunk = 16;   // time steps staged per chunk

template <typename T, int P, bool Gated>
__device__ __forceinline__ void delta_rule_scan_block(const T* __restrict__ q, const T* __restrict__ k,
                                                const T* __restrict__ v, const T* __restrict__ g, const T* __restrict__ beta,
                                                const float* __restrict__ S0, T* __restrict__ o,
                                                float* __restrict__ S_last, int BH, int T_len, int Dk, int Dv) {
    constexpr int DK = P * kCols;       // largest Dk this instantiation holds
    constexpr int ROWS = kThreads / P;  // value indices (columns of S) per block
    constexpr int QK_PER_THREAD = kChunk * DK / kThreads;
    constexpr int V_PER_THREAD = kChunk * ROWS / kThreads;
    static_assert(kChunk * DK % kThreads == 0 && kChunk * ROWS % kThreads == 0, "chunk must tile the block");
    static_assert(kChunk <= kThreads, "one thread per β of a chunk");

    __shared__ __align__(16) float sQ[2][kChunk][DK];
    __shared__ __align__(16) float sK[2][kChunk][DK];
    __shared__ float sV[2][kChunk][ROWS];
    __shared__ float sB[2][kChunk];
    __shared__ float sG[2][kChunk];

    const int tid = threadIdx.x;
    const int row_local = tid / P;
    const int sub = tid % P;
    const int bh = blockIdx.x;
    const int row0 = blockIdx.y * ROWS;
    const int row = row0 + row_local;
    const bool row_valid = row < Dv;

    const T* qh = q + (long long)bh * T_len * Dk;
    const T* kh = k + (long long)bh * T_len * Dk;
    const T* vh = v + (long long)bh * T_len * Dv;
    const T* bh_beta = beta + (long long)bh * T_len;
    const T* bh_g = Gated ? g + (long long)bh * T_len : nullptr;
    // State element (key index `col`, value index `row`) of this (batch, head): S is [Dk, Dv].
    auto state_at = [&](int col) -> long long { return ((long long)bh * Dk + col) * Dv + row; };

    // This thread's slice of the state of value index `row`: key entries sub + P·i. Entries past Dk
    // stay exactly 0 (they are never updated, and k, q read as 0 there), so they add nothing to the dot products even
    // when an Inf in the inputs would turn an update into Inf·0.
    float S[kCols];
    unsigned col_valid = 0u;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
        const int col = sub + P * i;
        if (col < Dk) col_valid |= 1u << i;
        S[i] = (S0 != nullptr && row_valid && col < Dk) ? S0[state_at(col)] : 0.0f;
    }

    // Register staging of one chunk (flat index tid + kThreads·i over [kChunk][DK] / [kChunk][ROWS]).
    float rq[QK_PER_THREAD], rk[QK_PER_THREAD], rv[V_PER_THREAD], rb = 0.0f, rg = 0.0f;
    auto load_chunk = [&](int t0) {
#pragma unroll
        for (int i = 0; i < QK_PER_THREAD; ++i) {
            const int idx = tid + kThreads * i;
            const int t = t0 + idx / DK, col = idx % DK;
            const bool in = t < T_len && col < Dk;
            const long long off = (long long)t * Dk + col;
            rq[i] = in ? ff::load(qh + off) : 0.0f;
            rk[i] = in ? ff::load(kh + off) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < V_PER_THREAD; ++i) {
            const int idx = tid + kThreads * i;
            const int t = t0 + idx / ROWS, r = row0 + idx % ROWS;
            rv[i] = (t < T_len && r < Dv) ? ff::load(vh + (long long)t * Dv + r) : 0.0f;
        }
        if (tid < kChunk) {
            rb = (t0 + tid < T_len) ? ff::load(bh_beta + t0 + tid) : 0.0f;
            if (Gated) rg = (t0 + tid < T_len) ? ff::load(bh_g + t0 + tid) : 0.0f;
        }
    };
    auto store_chunk = [&](int buf) {
#pragma unroll
        for (int i = 0; i < QK_PER_THREAD; ++i) {
            const int idx = tid + kThreads * i;
            (&sQ[buf][0][0])[idx] = rq[i];
            (&sK[buf][0][0])[idx] = rk[i];
        }
#pragma unroll
        for (int i = 0; i < V_PER_THREAD; ++i) (&sV[buf][0][0])[tid + kThreads * i] = rv[i];
        if (tid < kChunk) {
            sB[buf][tid] = rb;
            if (Gated) sG[buf][tid] = rg;
        }
    };

    const int n_chunks = (T_len + kChunk - 1) / kChunk;
    load_chunk(0);
    store_chunk(0);
    __syncthreads();

    for (int c = 0; c < n_chunks; ++c) {
        const int buf = c & 1;
        const int t0 = c * kChunk;
        const bool has_next = c + 1 < n_chunks;
        if (has_next) load_chunk(t0 + kChunk);  // in flight while this chunk is computed

        const int steps = min(kChunk, T_len - t0);
        for (int s = 0; s < steps; ++s) {
            float kr[kCols], qr[kCols];
#pragma unroll
            for (int i = 0; i < kCols; ++i) {
                kr[i] = sK[buf][s][sub + P * i];
                qr[i] = sQ[buf][s][sub + P * i];
            }
            if (Gated) {  // decay first (entries past Dk stay exactly 0 even for an infinite α)
                const float alpha = expf(sG[buf][s]);
#pragma unroll
                for (int i = 0; i < kCols; ++i) {
                    if (col_valid & (1u << i)) S[i] *= alpha;
                }
            }
            // u = S[row,:]·k  (4 partial sums for ILP, then the P lanes of the row)
            float u0 = 0.0f, u1 = 0.0f, u2 = 0.0f, u3 = 0.0f;
#pragma unroll
            for (int i = 0; i < kCols; i += 4) {
                u0 = fmaf(S[i], kr[i], u0);
                u1 = fmaf(S[i + 1], kr[i + 1], u1);
                u2 = fmaf(S[i + 2], kr[i + 2], u2);
                u3 = fmaf(S[i + 3], kr[i + 3], u3);
            }
            const float u = ff::group_sum<P>((u0 + u1) + (u2 + u3));
            const float delta = sB[buf][s] * (sV[buf][s][row_local] - u);
#pragma unroll
            for (int i = 0; i < kCols; ++i) {
                if (col_valid & (1u << i)) S[i] = fmaf(delta, kr[i], S[i]);
            }
            float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
#pragma unroll
            for (int i = 0; i < kCols; i += 4) {
                o0 = fmaf(S[i], qr[i], o0);
                o1 = fmaf(S[i + 1], qr[i + 1], o1);
                o2 = fmaf(S[i + 2], qr[i + 2], o2);
                o3 = fmaf(S[i + 3], qr[i + 3], o3);
            }
            const float out = ff::group_sum<P>((o0 + o1) + (o2 + o3));
            if (sub == 0 && row_valid) ff::store(o + ((long long)bh * T_len + t0 + s) * Dv + row, out);
        }

        if (has_next) store_chunk(buf ^ 1);  // that buffer was last read before the previous barrier
        __syncthreads();
    }

    if (row_valid) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
            const int col = sub + P * i;
            if (col < Dk) S_last[state_at(col)] = S[i];
        }
    }
}

}  // namespace
