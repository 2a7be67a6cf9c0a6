// Persistent recurrent kernel shared by LSTMSeq, GRUSeq and LiquidScan.
//
// One launch runs all T steps of a recurrence  g_t = xg_t + R h_{t-1} (+ biases),  h_t = cell(g_t, ...).
// The input part xg_t of every step is computed before the kernel (one GEMM for all t, or given by
// the graph for LiquidScan); this kernel does the serial part only.
//
// Design (the persistent-RNN scheme):
// - A "group" of NB blocks (NB = 8: one thread-block cluster on sm_90+; NB = 1: one block on any
//   GPU) owns the whole recurrence for BB batch rows. Groups are independent (grid.y = groups),
//   so no grid-wide barrier is needed.
// - Block r of a group owns hidden units [r*HB, r*HB + HB) and keeps its G*HB rows of R resident
//   in shared memory for all T steps, stored transposed (RT[k][local_row], storage dtype) so that
//   a warp reads consecutive rows at one k: conflict-free 128-bit (fp32) / 64-bit (fp16/bf16)
//   loads. When the slice does not fit in shared memory the same code reads R from global memory
//   (L2) each step: correct, slower (the R_SMEM = false entries).
// - Every block holds the full h_{t-1} (fp32, double-buffered). Per step: each thread computes a
//   4-row x KC-column tile of R h for up to 4 batch rows, partial sums go to shared memory and are
//   summed over the K splits, then one thread per (batch row, hidden unit) applies the cell (fp32 math, precise
//   expf/tanhf so NaN/Inf behave as in the reference) and writes y_t and h_t. With NB = 8 it
//   stores h_t into the h buffer of all 8 blocks of the cluster (distributed shared memory) and
//   the cluster barrier (release/acquire) publishes it: one barrier per step, no global memory
//   round trip. Double buffering makes one barrier per step enough: a block writes buffer t+1
//   only after every block passed barrier t-1, i.e. finished reading that buffer.
// - Recurrent state (h, and c for LSTM) is fp32 throughout.
//
// Shared memory layout (floats unless noted; the host mirrors this in `smem_bytes`):
//   hbuf [2][BBP][HP]   h_{t-1} / h_t of the group's batch rows; padding rows/columns stay 0
//   part [KS][BBP][NRP] partial dot products, one slice per K split (then summed into slice 0)
//   cbuf [BBP*HB -> round4]   LSTM cell state of the owned units
//   wb   [round4(G*HB)] input bias,  rb [round4(G*HB)] recurrent bias of the owned rows
//   RT   [HP][NRPS] storage dtype, only when R_SMEM
// with HP = round4(H), NRP = round4(G*HB), NRPS = NRP + 4 (the +4 spreads the banks of the
// transposed one-time fill), BBP = BB == 1 ? 1 : round4(BB).
#pragma once

#include "../common.cuh"

namespace ffrnn {

enum CellKind { kLSTM = 0, kGRU = 1, kLiquid = 2 };

constexpr int kThreads = 512;       // threads per block (the host launches exactly this)
constexpr int kClusterBlocks = 8;   // blocks per cluster in the sm_90+ entries (portable maximum)

template <int CELL> struct CellGates;
template <> struct CellGates<kLSTM> { static constexpr int G = 4; };
template <> struct CellGates<kGRU> { static constexpr int G = 3; };
template <> struct CellGates<kLiquid> { static constexpr int G = 4; };

__device__ __forceinline__ int round4(int x) { return (x + 3) & ~3; }

// Four consecutive storage elements (16-byte aligned for float, 8-byte aligned for 16-bit types).
__device__ __forceinline__ void load4(const float* p, float out[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
}
__device__ __forceinline__ void load4(const __half* p, float out[4]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float out[4]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}

// Generic load of one xg element: fp32 workspace (LSTM/GRU) or storage dtype (LiquidScan).
template <typename X> __device__ __forceinline__ float load_x(const X* p) { return ff::load(p); }

__device__ __forceinline__ float sigmoidf_ref(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- cluster primitives (sm_90+), written as PTX so no cooperative_groups header is needed ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_size() {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned shared_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Address of the same shared-memory variable in block `rank` of this cluster.
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
    unsigned out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
    return out;
}
__device__ __forceinline__ void store_cluster(unsigned addr, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
#endif

// One thread's share of the mat-vec: row quads q_first, q_first + QT, ... and columns
// [k_begin, k_end) of R against BT batch rows at a time; writes part[ks][b][4q .. 4q+3].
template <int BT, typename S, bool R_SMEM>
__device__ __forceinline__ void matvec_split(const S* RT, const S* __restrict__ R, const float* hcur, float* part,
                                             int ks, int q_first, int QT, int NQ, int k_begin, int k_end, int nb,
                                             int H, int HP, int NR, int NRP, int NRPS, int BBP, int HB, int j0) {
    for (int q = q_first; q < NQ; q += QT) {
        for (int bt = 0; bt < nb; bt += BT) {
            float acc[BT][4];
#pragma unroll
            for (int bi = 0; bi < BT; ++bi)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[bi][i] = 0.0f;
            for (int k = k_begin; k < k_end; k += 4) {
                float r[4][4];  // r[kk][i] = R(local row 4q+i, column k+kk)
                if (R_SMEM) {
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) load4(RT + (k + kk) * NRPS + 4 * q, r[kk]);
                } else {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int lr = 4 * q + i;
                        const int g = lr / HB, j = j0 + (lr - g * HB);
                        const bool row_ok = lr < NR && j < H;
                        const S* row = R + (static_cast<long long>(row_ok ? g : 0) * H + (row_ok ? j : 0)) * H;
#pragma unroll
                        for (int kk = 0; kk < 4; ++kk)
                            r[kk][i] = (row_ok && k + kk < H) ? ff::load_ro(row + k + kk) : 0.0f;
                    }
                }
#pragma unroll
                for (int bi = 0; bi < BT; ++bi) {
                    // rows of hbuf past nb are zero, so a partial batch tile is harmless
                    const float4 h4 = *reinterpret_cast<const float4*>(hcur + (bt + bi) * HP + k);
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        float a = acc[bi][i];
                        a = fmaf(r[0][i], h4.x, a);
                        a = fmaf(r[1][i], h4.y, a);
                        a = fmaf(r[2][i], h4.z, a);
                        a = fmaf(r[3][i], h4.w, a);
                        acc[bi][i] = a;
                    }
                }
            }
#pragma unroll
            for (int bi = 0; bi < BT; ++bi) {
                const float4 out = make_float4(acc[bi][0], acc[bi][1], acc[bi][2], acc[bi][3]);
                *reinterpret_cast<float4*>(part + (ks * BBP + bt + bi) * NRP + 4 * q) = out;
            }
        }
    }
}

// The recurrence. CELL: kLSTM / kGRU / kLiquid. S: storage dtype of R, bias, y. X: dtype of xg.
// NB: blocks per group (1, or kClusterBlocks when launched as clusters). R_SMEM: R slice resident.
//
// xg element (b, t, row) is at xg[b*xg_sb + t*xg_st + row] (row in [0, G*H)); y element (b, t, j)
// at y[b*y_sb + t*y_st + j]. bias: [G*H input bias | G*H recurrent bias] or null (LiquidScan: null).
// h0/c0: [B,H] fp32 or null (zeros). h_last/c_last: [B,H] fp32 (c_last only for LSTM, else unused).
// BB: batch rows per group, HB: hidden units per block, KS/KC: K splits of the mat-vec and the
// number of columns (multiple of 4) per split. ts: LiquidScan timespan.
template <int CELL, typename S, typename X, int NB, bool R_SMEM>
__device__ __forceinline__ void persistent_rnn(
    const X* __restrict__ xg, long long xg_sb, long long xg_st,
    const S* __restrict__ R, const S* __restrict__ bias,
    const float* __restrict__ h0, const float* __restrict__ c0,
    S* __restrict__ y, long long y_sb, long long y_st,
    float* __restrict__ h_last, float* __restrict__ c_last,
    int T, int B, int H, int BB, int HB, int KS, int KC, float ts) {
    constexpr int G = CellGates<CELL>::G;
    const int tid = threadIdx.x;
    const int HP = round4(H);
    const int NR = G * HB;          // local rows of R owned by this block
    const int NRP = round4(NR);
    const int NRPS = NRP + 4;
    const int BBP = BB == 1 ? 1 : round4(BB);  // batch rows as stored (a tile of 4 when BB > 1)
    const int NQ = NRP / 4;         // row quads
    const int QT = NQ < kThreads ? NQ : kThreads;

    int rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (NB > 1) {
        // Launched without the compile-time cluster shape, the h exchange would address blocks
        // that are not there: fail loudly instead.
        if (cluster_size() != static_cast<unsigned>(NB)) __trap();
        rank = static_cast<int>(cluster_rank());
    }
#endif
    const int j0 = rank * HB;                        // first hidden unit owned by this block
    const int b0 = blockIdx.y * BB;                  // first batch row of this group
    const int nb = min(BB, B - b0);                  // valid batch rows of this group (>= 1)

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* hbuf = reinterpret_cast<float*>(smem_raw);            // [2][BBP][HP]
    float* part = hbuf + 2 * BBP * HP;                            // [KS][BBP][NRP]
    float* cbuf = part + KS * BBP * NRP;                          // [BBP*HB]
    float* wb_s = cbuf + round4(BBP * HB);                        // [G*HB]
    float* rb_s = wb_s + round4(G * HB);                          // [G*HB]
    S* RT = reinterpret_cast<S*>(rb_s + round4(G * HB));          // [HP][NRPS]

    // ---- one-time setup: R slice, biases, initial state ----
    if (R_SMEM) {
        // Row-major reads along k (coalesced), transposed stores into RT[k][lr].
        const int total = NRP * HP;
        for (int idx = tid; idx < total; idx += kThreads) {
            const int lr = idx / HP, k = idx - lr * HP;
            const int g = lr / HB, jj = lr - g * HB, j = j0 + jj;
            S v = ff::from_float<S>(0.0f);
            if (lr < NR && j < H && k < H) v = R[(static_cast<long long>(g) * H + j) * H + k];
            RT[k * NRPS + lr] = v;
        }
    }
    for (int lr = tid; lr < NR; lr += kThreads) {
        const int g = lr / HB, j = j0 + (lr - g * HB);
        float wb = 0.0f, rb = 0.0f;
        if (bias != nullptr && j < H) {
            wb = ff::load(bias + g * H + j);
            rb = ff::load(bias + G * H + g * H + j);
        }
        wb_s[lr] = wb;
        rb_s[lr] = rb;
    }
    for (int idx = tid; idx < 2 * BBP * HP; idx += kThreads) {
        const int buf = idx / (BBP * HP), rem = idx - buf * BBP * HP;
        const int b = rem / HP, k = rem - b * HP;
        float v = 0.0f;
        if (buf == 0 && b < nb && k < H && h0 != nullptr) v = h0[static_cast<long long>(b0 + b) * H + k];
        hbuf[idx] = v;
    }
    for (int idx = tid; idx < BBP * HB; idx += kThreads) {
        const int b = idx / HB, j = j0 + (idx - b * HB);
        float v = 0.0f;
        if (CELL == kLSTM && b < nb && j < H && c0 != nullptr) v = c0[static_cast<long long>(b0 + b) * H + j];
        cbuf[idx] = v;
    }
    // Every block of the cluster must have started (and zeroed its buffers) before any block
    // stores into its shared memory.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (NB > 1) cluster_sync(); else __syncthreads();
#else
    __syncthreads();
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned hbuf_remote[NB > 1 ? NB : 1];
    if (NB > 1) {
        const unsigned local = shared_addr(hbuf);
#pragma unroll
        for (int r = 0; r < NB; ++r) hbuf_remote[r] = map_to_rank(local, static_cast<unsigned>(r));
    }
#endif

    const int npairs = nb * HB;  // (batch row, owned unit) pairs handled in the cell phase
    const int q_first = tid % QT;
    const int ks = tid / QT;
    const bool mv_active = ks < KS;
    const int k_begin = ks * KC;
    const int k_end = min(HP, k_begin + KC);

    for (int t = 0; t < T; ++t) {
        const int cur = t & 1, nxt = cur ^ 1;
        const float* hcur = hbuf + cur * BBP * HP;

        // Prefetch this step's input part for the thread's first (batch, unit) pair; the load
        // latency overlaps the mat-vec below.
        float xpre[G];
        if (tid < npairs) {
            const int b = tid / HB, jj = tid - b * HB, j = j0 + jj;
            const X* src = xg + static_cast<long long>(b0 + b) * xg_sb + static_cast<long long>(t) * xg_st;
#pragma unroll
            for (int g = 0; g < G; ++g) xpre[g] = (j < H) ? load_x(src + g * H + j) : 0.0f;
        }

        // ---- mat-vec: part[ks][b][lr] = sum_{k in split ks} R[lr][k] * h[b][k] ----
        if (mv_active) {
            if (nb == 1)
                matvec_split<1, S, R_SMEM>(RT, R, hcur, part, ks, q_first, QT, NQ, k_begin, k_end, nb, H, HP, NR,
                                           NRP, NRPS, BBP, HB, j0);
            else
                matvec_split<4, S, R_SMEM>(RT, R, hcur, part, ks, q_first, QT, NQ, k_begin, k_end, nb, H, HP, NR,
                                           NRP, NRPS, BBP, HB, j0);
        }
        __syncthreads();
        // Sum the K splits into split 0 (one thread per element, so the in-place sum is race-free):
        // keeps the cell phase's dependent load chain at G loads instead of G*KS.
        if (KS > 1) {
            for (int e = tid; e < nb * NRP; e += kThreads) {
                const int b = e / NRP, lr = e - b * NRP;
                float s = part[b * NRP + lr];
                for (int s_ = 1; s_ < KS; ++s_) s += part[(s_ * BBP + b) * NRP + lr];
                part[b * NRP + lr] = s;
            }
            __syncthreads();
        }

        // ---- cell: one thread per (batch row, owned unit) ----
        float* hnext = hbuf + nxt * BBP * HP;
        for (int p = tid; p < npairs; p += kThreads) {
            const int b = p / HB, jj = p - b * HB, j = j0 + jj;
            if (j >= H) continue;
            float xv[G];
            if (p == tid) {
#pragma unroll
                for (int g = 0; g < G; ++g) xv[g] = xpre[g];
            } else {
                const X* src = xg + static_cast<long long>(b0 + b) * xg_sb + static_cast<long long>(t) * xg_st;
#pragma unroll
                for (int g = 0; g < G; ++g) xv[g] = load_x(src + g * H + j);
            }
            float rh[G];  // (R h)[g*H + j]
#pragma unroll
            for (int g = 0; g < G; ++g) rh[g] = part[b * NRP + g * HB + jj];
            float h_new;
            if (CELL == kLSTM) {
                // ONNX gate order i, o, f, c
                const float gi = sigmoidf_ref(xv[0] + wb_s[0 * HB + jj] + rh[0] + rb_s[0 * HB + jj]);
                const float go = sigmoidf_ref(xv[1] + wb_s[1 * HB + jj] + rh[1] + rb_s[1 * HB + jj]);
                const float gf = sigmoidf_ref(xv[2] + wb_s[2 * HB + jj] + rh[2] + rb_s[2 * HB + jj]);
                const float gc = tanhf(xv[3] + wb_s[3 * HB + jj] + rh[3] + rb_s[3 * HB + jj]);
                const float c = gf * cbuf[b * HB + jj] + gi * gc;
                cbuf[b * HB + jj] = c;
                h_new = go * tanhf(c);
            } else if (CELL == kGRU) {
                // ONNX gate order z, r, h; linear_before_reset = 1
                const float z = sigmoidf_ref(xv[0] + wb_s[0 * HB + jj] + rh[0] + rb_s[0 * HB + jj]);
                const float r = sigmoidf_ref(xv[1] + wb_s[1 * HB + jj] + rh[1] + rb_s[1 * HB + jj]);
                const float n = tanhf(xv[2] + wb_s[2 * HB + jj] + r * (rh[2] + rb_s[2 * HB + jj]));
                const float h_prev = hcur[b * HP + j];
                h_new = (1.0f - z) * n + z * h_prev;
            } else {
                // CfC: g = (g1, g2, ga, gb)
                const float ff1 = tanhf(xv[0] + rh[0]);
                const float ff2 = tanhf(xv[1] + rh[1]);
                const float tau = sigmoidf_ref((xv[2] + rh[2]) * ts + (xv[3] + rh[3]));
                h_new = ff1 * (1.0f - tau) + tau * ff2;
            }
            ff::store(y + static_cast<long long>(b0 + b) * y_sb + static_cast<long long>(t) * y_st + j, h_new);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (NB > 1) {
                const unsigned offset = static_cast<unsigned>((nxt * BBP * HP + b * HP + j) * sizeof(float));
#pragma unroll
                for (int r = 0; r < NB; ++r) store_cluster(hbuf_remote[r] + offset, h_new);
            } else {
                hnext[b * HP + j] = h_new;
            }
#else
            hnext[b * HP + j] = h_new;
#endif
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (NB > 1) cluster_sync(); else __syncthreads();
#else
        __syncthreads();
#endif
    }

    // ---- final state of the owned units (valid after the last barrier; T = 0 gives h0/c0) ----
    const float* hfin = hbuf + (T & 1) * BBP * HP;
    for (int p = tid; p < npairs; p += kThreads) {
        const int b = p / HB, jj = p - b * HB, j = j0 + jj;
        if (j >= H) continue;
        h_last[static_cast<long long>(b0 + b) * H + j] = hfin[b * HP + j];
        if (CELL == kLSTM) c_last[static_cast<long long>(b0 + b) * H + j] = cbuf[b * HB + jj];
    }
}

}  // namespace ffrnn

// Kernel parameter list shared by every entry (see persistent_rnn for the meaning).
#define FFRNN_PARAMS(S, X)                                                                        \
    const X *xg, long long xg_sb, long long xg_st, const S *R, const S *bias, const float *h0,  \
        const float *c0, S *y, long long y_sb, long long y_st, float *h_last, float *c_last, int T, \
        int B, int H, int BB, int HB, int KS, int KC, float ts
#define FFRNN_ARGS \
    xg, xg_sb, xg_st, R, bias, h0, c0, y, y_sb, y_st, h_last, c_last, T, B, H, BB, HB, KS, KC, ts

// Portable entries: one block per group, any GPU. NAME (R resident) and NAME_rg (R from global).
#define FFRNN_SINGLE_ENTRIES(NAME, CELL, S, X)                                                    \
    extern "C" __global__ void __launch_bounds__(ffrnn::kThreads, 1) NAME(FFRNN_PARAMS(S, X)) {     \
        ffrnn::persistent_rnn<CELL, S, X, 1, true>(FFRNN_ARGS);                                   \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(ffrnn::kThreads, 1) NAME##_rg(FFRNN_PARAMS(S, X)) { \
        ffrnn::persistent_rnn<CELL, S, X, 1, false>(FFRNN_ARGS);                                  \
    }

// Cluster entries (sm_90+ only): 8 blocks per group, compile-time cluster shape so a plain
// cuLaunchKernel launches them as clusters (grid.x must be 8).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define FFRNN_CLUSTER_ENTRIES(NAME, CELL, S, X)                                                      \
    extern "C" __global__ void __cluster_dims__(ffrnn::kClusterBlocks, 1, 1)                          \
        __launch_bounds__(ffrnn::kThreads, 1) NAME(FFRNN_PARAMS(S, X)) {                             \
        ffrnn::persistent_rnn<CELL, S, X, ffrnn::kClusterBlocks, true>(FFRNN_ARGS);                  \
    }                                                                                                \
    extern "C" __global__ void __cluster_dims__(ffrnn::kClusterBlocks, 1, 1)                          \
        __launch_bounds__(ffrnn::kThreads, 1) NAME##_rg(FFRNN_PARAMS(S, X)) {                        \
        ffrnn::persistent_rnn<CELL, S, X, ffrnn::kClusterBlocks, false>(FFRNN_ARGS);                 \
    }
#else
#define FFRNN_CLUSTER_ENTRIES(NAME, CELL, S, X)
#endif
