// MLSTMScan (domain `framefuse`, xLSTM mLSTM, stabilised exponential gating). See OPS.md.
//
// Per (batch, head), with f̃ = logsigmoid(f_pre):
//   m_t = max(f̃_t + m_{t−1}, i_pre_t);  i' = exp(i_pre_t − m_t);  f' = exp(f̃_t + m_{t−1} − m_t)
//   C_t = f'·C_{t−1} + i'·v_t k_tᵀ  ([Dv, Dk]);   n_t = f'·n_{t−1} + i'·k_t  ([Dk])
//   h_t = C_t q_t / (max(|n_tᵀ q_t|, exp(−m_t)) + eps)
// all in fp32 on chip for the whole sequence.
//
// Layout (as DeltaRuleScan): a block owns ROWS rows of C of one (batch, head); P consecutive lanes
// share a row, 16 columns each (Dk ≤ 16·P); grid = (B·H, ⌈Dv / ROWS⌉). The rows of C only share
// n and m, which every row group keeps its own copy of (same arithmetic, so bitwise the same
// values everywhere; 16 extra FMAs per step per thread buy freedom from block barriers). q, k, v,
// i_pre and logsigmoid(f_pre) are staged through shared memory in double-buffered chunks of TC
// steps (loads of the next chunk in flight while the current one is computed).
//
// max() propagates NaN like torch.maximum (fmaxf would drop it).
//
// Entries mlstm_scan_<f32|f16|bf16>_k<32|64|128> (P = 2, 4, 8). Arguments: q, k, v, i_pre, f_pre,
// C0, n0, m0 (each nullable: zeros), h, C_last, n_last, m_last, BH, T, Dk, Dv, eps (the attribute;
// 0 adds exactly nothing: the denominator is never −0, so the result is bitwise that of no eps).

#include "../common.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kCols = 16;
constexpr int kChunk = 16;

__device__ __forceinline__ float nan_max(float a, float b) {
    return (a != a || b != b) ? a + b : fmaxf(a, b);  // a + b is NaN when either is
}

// torch's log_sigmoid: min(x, 0) − log1p(exp(−|x|)) (NaN stays NaN through the log1p term).
__device__ __forceinline__ float log_sigmoid(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }

template <typename T, int P>
__device__ __forceinline__ void mlstm_scan(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                           const T* __restrict__ i_pre, const T* __restrict__ f_pre,
                                           const float* __restrict__ C0, const float* __restrict__ n0,
                                           const float* __restrict__ m0, T* __restrict__ h,
                                           float* __restrict__ C_last, float* __restrict__ n_last,
                                           float* __restrict__ m_last, int BH, int T_len, int Dk, int Dv,
                                           float eps) {
    constexpr int DK = P * kCols;
    constexpr int ROWS = kThreads / P;
    constexpr int QK_PER_THREAD = kChunk * DK / kThreads;
    constexpr int V_PER_THREAD = kChunk * ROWS / kThreads;
    static_assert(kChunk * DK % kThreads == 0 && kChunk * ROWS % kThreads == 0, "chunk must tile the block");
    static_assert(kChunk <= kThreads, "one thread per gate value of a chunk");

    __shared__ __align__(16) float sQ[2][kChunk][DK];
    __shared__ __align__(16) float sK[2][kChunk][DK];
    __shared__ float sV[2][kChunk][ROWS];
    __shared__ float sI[2][kChunk];
    __shared__ float sLogF[2][kChunk];

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
    const T* ih = i_pre + (long long)bh * T_len;
    const T* fh = f_pre + (long long)bh * T_len;

    // Columns sub + P·i of row `row` of C, and of n. Columns past Dk stay exactly 0 (never updated;
    // k and q read as 0 there), so they add nothing even when an Inf input makes an update Inf·0.
    float C[kCols], n[kCols];
    unsigned col_valid = 0u;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
        const int col = sub + P * i;
        if (col < Dk) col_valid |= 1u << i;
        C[i] = (C0 != nullptr && row_valid && col < Dk) ? C0[((long long)bh * Dv + row) * Dk + col] : 0.0f;
        n[i] = (n0 != nullptr && col < Dk) ? n0[(long long)bh * Dk + col] : 0.0f;
    }
    float m = (m0 != nullptr) ? m0[bh] : 0.0f;

    float rq[QK_PER_THREAD], rk[QK_PER_THREAD], rv[V_PER_THREAD], ri = 0.0f, rf = 0.0f;
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
            const bool in = t0 + tid < T_len;
            ri = in ? ff::load(ih + t0 + tid) : 0.0f;
            rf = in ? ff::load(fh + t0 + tid) : 0.0f;
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
            sI[buf][tid] = ri;
            sLogF[buf][tid] = log_sigmoid(rf);
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
        if (has_next) load_chunk(t0 + kChunk);

        const int steps = min(kChunk, T_len - t0);
        for (int s = 0; s < steps; ++s) {
            const float log_f = sLogF[buf][s];
            const float ig_pre = sI[buf][s];
            const float m_new = nan_max(log_f + m, ig_pre);
            const float i_gate = expf(ig_pre - m_new);
            const float f_gate = expf(log_f + m - m_new);
            m = m_new;
            const float vr = sV[buf][s][row_local];

            float cq0 = 0.0f, cq1 = 0.0f, nq0 = 0.0f, nq1 = 0.0f;
#pragma unroll
            for (int i = 0; i < kCols; ++i) {
                const float kc = sK[buf][s][sub + P * i];
                const float qc = sQ[buf][s][sub + P * i];
                if (col_valid & (1u << i)) {
                    C[i] = f_gate * C[i] + i_gate * (vr * kc);
                    n[i] = f_gate * n[i] + i_gate * kc;
                }
                if (i & 1) {
                    cq1 = fmaf(C[i], qc, cq1);
                    nq1 = fmaf(n[i], qc, nq1);
                } else {
                    cq0 = fmaf(C[i], qc, cq0);
                    nq0 = fmaf(n[i], qc, nq0);
                }
            }
            const float cq = ff::group_sum<P>(cq0 + cq1);
            const float nq = ff::group_sum<P>(nq0 + nq1);
            // eps after the max, as the reference (and transformers' xLSTM) add it.
            const float denominator = nan_max(fabsf(nq), expf(-m_new)) + eps;
            if (sub == 0 && row_valid) ff::store(h + ((long long)bh * T_len + t0 + s) * Dv + row, cq / denominator);
        }

        if (has_next) store_chunk(buf ^ 1);
        __syncthreads();
    }

    if (row_valid) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
            const int col = sub + P * i;
            if (col < Dk) C_last[((long long)bh * Dv + row) * Dk + col] = C[i];
        }
    }
    // n and m are the same in every row group: block row 0's first row group writes them.
    if (blockIdx.y == 0 && row_local == 0) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
            const int col = sub + P * i;
            if (col < Dk) n_last[(long long)bh * Dk + col] = n[i];
        }
        if (sub == 0) m_last[bh] = m;
    }
}

}  // namespace

#define FF_MLSTM_ENTRY(SUFFIX, T, DK, P)                                                                    \
    extern "C" __global__ void __launch_bounds__(kThreads, 2) mlstm_scan_##SUFFIX##_k##DK(                     \
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ i_pre, \
        const T* __restrict__ f_pre, const float* __restrict__ C0, const float* __restrict__ n0,           \
        const float* __restrict__ m0, T* __restrict__ h, float* __restrict__ C_last, float* __restrict__ n_last, \
        float* __restrict__ m_last, int BH, int T_len, int Dk, int Dv, float eps) {                        \
        mlstm_scan<T, P>(q, k, v, i_pre, f_pre, C0, n0, m0, h, C_last, n_last, m_last, BH, T_len, Dk, Dv, eps); \
    }
#define FF_MLSTM_ALL(SUFFIX, T) FF_MLSTM_ENTRY(SUFFIX, T, 32, 2) FF_MLSTM_ENTRY(SUFFIX, T, 64, 4) FF_MLSTM_ENTRY(SUFFIX, T, 128, 8)

FF_MLSTM_ALL(f32, float)
FF_MLSTM_ALL(f16, __half)
FF_MLSTM_ALL(bf16, __nv_bfloat16)
