// Attention (domain `framefuse`): o = softmax(scale · q kᵀ + mask) v per head, GQA, causal aligned
// bottom-right (query i sees keys j ≤ i + Tk − Tq), a fully masked row gives 0. See OPS.md.
//
// Three kernels, one extern "C" entry per (kernel, storage dtype, head dim):
//
//   attention_mma_<f16|bf16>_d<32|64|128>   flash-attention-2 style, tensor cores (mma.sync
//       m16n8k16, fp32 accumulation), sm_80+. A block = 4 warps = 64 query rows of one
//       (batch, head); K/V tiles of BN keys are double-buffered in shared memory with cp.async;
//       S = Q Kᵀ and the online softmax stay in registers (each thread holds 2 rows × BN/4
//       scores); P is re-packed from the S accumulators into the A operand of P·V without
//       going through shared memory. Causal tiles past the diagonal are skipped.
//   attention_simt_<f32|f16|bf16>_d<...>   CUDA cores, fp32 throughout (the fp32 path, and the
//       fallback for sm_75 or unaligned pointers). A block = 128 threads = 32 query rows, 4
//       threads per row; Q, K, V tiles staged in shared memory as float.
//   attention_decode_<f32|f16|bf16>_d<...>  Tq = 1 (the step form): one block per (batch, head);
//       the keys are split over groups of lanes (G lanes per key, 8 head dims per lane), each
//       group keeps its own online softmax, and the groups are merged through shared memory.
//
// Softmax arithmetic (all three): scores in log2 units x = (s·scale + mask)·log2(e); running
// max m, running sum l, p = exp2(x − m'), where m' = 0 while the row has seen only −inf (so a
// fully masked row keeps p = 0, l = 0 and is written as 0). fmaxf ignores NaN, but a NaN score
// still gives p = NaN, so NaN reaches l and the output as in the reference.
//
// Arguments (every entry): q, k, v, mask (nullable), o, B, Hq, Hkv, Tq, Tk, mask_batch_stride,
// mask_head_stride (elements; 0 = broadcast), mask_is_f32 (mask dtype float32, else the storage
// dtype), scale, causal.

#include "../common.cuh"

namespace {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// An additive mask element (storage dtype or float32), row-major [.., Tq, Tk].
template <typename T>
__device__ __forceinline__ float mask_value(const void* mask, long long idx, int mask_is_f32) {
    return mask_is_f32 ? static_cast<const float*>(mask)[idx] : ff::load(static_cast<const T*>(mask) + idx);
}

// The last key (exclusive) any of query rows [row_begin, row_end) may see.
__device__ __forceinline__ int visible_key_end(int row_end, int Tq, int Tk, int causal) {
    if (!causal) return Tk;
    const int last_row = min(row_end, Tq) - 1;
    return max(0, min(Tk, last_row + (Tk - Tq) + 1));
}

// ---------------------------------------------------------------------------------------------
// CUDA-core kernel (any storage dtype): 32 query rows per block, 4 threads per row.

constexpr int kSimtRows = 32;
constexpr int kSimtKeys = 32;
constexpr int kSimtThreads = 128;

template <typename T, int DH>
__device__ __forceinline__ void attention_simt(const T* __restrict__ q, const T* __restrict__ k,
                                               const T* __restrict__ v, const void* __restrict__ mask,
                                               T* __restrict__ o, int B, int Hq, int Hkv, int Tq, int Tk,
                                               long long mask_batch_stride, long long mask_head_stride,
                                               int mask_is_f32, float scale, int causal) {
    static_assert(DH % 16 == 0, "head dim must be a multiple of 16");
    constexpr int PAD = 4;              // keeps float4 rows 16-byte aligned and spreads banks
    constexpr int COLS4 = DH / 16;      // float4 chunks of the output row per thread
    __shared__ __align__(16) float sQ[kSimtRows][DH + PAD];
    __shared__ __align__(16) float sKV[kSimtKeys][DH + PAD];  // K tile, then V tile
    __shared__ float sP[kSimtRows][kSimtKeys + 1];

    const int tid = threadIdx.x;
    const int r = tid >> 2;   // query row within the tile
    const int c = tid & 3;    // which quarter of the keys / head dims this thread owns
    const int BH = B * Hq;
    const int n_qtiles = (Tq + kSimtRows - 1) / kSimtRows;
    // Heaviest (last, under causal) query tiles get the lowest block ids: they start first.
    const int bh = blockIdx.x % BH;
    const int qtile = n_qtiles - 1 - blockIdx.x / BH;
    const int b = bh / Hq, h = bh % Hq;
    const int hk = h / (Hq / Hkv);
    const int m0 = qtile * kSimtRows;
    const int i = m0 + r;  // global query row of this thread

    const T* qh = q + (long long)bh * Tq * DH;
    const T* kh = k + ((long long)b * Hkv + hk) * Tk * DH;
    const T* vh = v + ((long long)b * Hkv + hk) * Tk * DH;
    const long long mask_base = (long long)b * mask_batch_stride + (long long)h * mask_head_stride;

    for (int idx = tid; idx < kSimtRows * DH; idx += kSimtThreads) {
        const int row = idx / DH, col = idx % DH;
        sQ[row][col] = (m0 + row < Tq) ? ff::load(qh + (long long)(m0 + row) * DH + col) : 0.0f;
    }

    const int key_end = visible_key_end(m0 + kSimtRows, Tq, Tk, causal);
    const int n_tiles = (key_end + kSimtKeys - 1) / kSimtKeys;
    const int causal_limit = i + (Tk - Tq);  // this row sees keys j <= causal_limit
    const float scale_log2 = scale * kLog2e;

    float m_run = neg_inf(), l_part = 0.0f;
    float acc[COLS4 * 4];
#pragma unroll
    for (int e = 0; e < COLS4 * 4; ++e) acc[e] = 0.0f;

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int j0 = tile * kSimtKeys;
        __syncthreads();  // sQ written (first tile) / previous P·V finished reading sKV and sP
        for (int idx = tid; idx < kSimtKeys * DH; idx += kSimtThreads) {
            const int row = idx / DH, col = idx % DH;
            sKV[row][col] = (j0 + row < Tk) ? ff::load(kh + (long long)(j0 + row) * DH + col) : 0.0f;
        }
        __syncthreads();

        float s[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < DH; d += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(&sQ[r][d]);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const float4 kv = *reinterpret_cast<const float4*>(&sKV[c + 4 * e][d]);
                s[e] = fmaf(qv.x, kv.x, s[e]);
                s[e] = fmaf(qv.y, kv.y, s[e]);
                s[e] = fmaf(qv.z, kv.z, s[e]);
                s[e] = fmaf(qv.w, kv.w, s[e]);
            }
        }

        // scores → log2 units, masked
        float row_max = neg_inf();
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int j = j0 + c + 4 * e;
            float x;
            if (mask != nullptr) {
                const float add = (i < Tq && j < Tk)
                                      ? mask_value<T>(mask, mask_base + (long long)i * Tk + j, mask_is_f32)
                                      : 0.0f;
                x = fmaf(s[e], scale, add) * kLog2e;
            } else {
                x = s[e] * scale_log2;
            }
            if (j >= Tk || (causal && j > causal_limit)) x = neg_inf();
            s[e] = x;
            row_max = fmaxf(row_max, x);
        }
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
        const float m_new = fmaxf(m_run, row_max);
        const float m_use = (m_new == neg_inf()) ? 0.0f : m_new;
        const float alpha = exp2f(m_run - m_use);
        m_run = m_new;
        float p_sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float p = exp2f(s[e] - m_use);
            p_sum += p;
            sP[r][c + 4 * e] = p;
        }
        l_part = l_part * alpha + p_sum;
#pragma unroll
        for (int e = 0; e < COLS4 * 4; ++e) acc[e] *= alpha;

        __syncthreads();  // every thread is done with the K tile
        for (int idx = tid; idx < kSimtKeys * DH; idx += kSimtThreads) {
            const int row = idx / DH, col = idx % DH;
            sKV[row][col] = (j0 + row < Tk) ? ff::load(vh + (long long)(j0 + row) * DH + col) : 0.0f;
        }
        __syncthreads();

#pragma unroll 4
        for (int jj = 0; jj < kSimtKeys; ++jj) {
            const float p = sP[r][jj];
#pragma unroll
            for (int cc = 0; cc < COLS4; ++cc) {
                const float4 vv = *reinterpret_cast<const float4*>(&sKV[jj][cc * 16 + c * 4]);
                acc[cc * 4 + 0] = fmaf(p, vv.x, acc[cc * 4 + 0]);
                acc[cc * 4 + 1] = fmaf(p, vv.y, acc[cc * 4 + 1]);
                acc[cc * 4 + 2] = fmaf(p, vv.z, acc[cc * 4 + 2]);
                acc[cc * 4 + 3] = fmaf(p, vv.w, acc[cc * 4 + 3]);
            }
        }
    }

    float l = l_part + __shfl_xor_sync(0xffffffffu, l_part, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (i < Tq) {
        T* orow = o + ((long long)bh * Tq + i) * DH;
#pragma unroll
        for (int cc = 0; cc < COLS4; ++cc) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float out = (l == 0.0f) ? 0.0f : acc[cc * 4 + e] / l;  // fully masked row → 0
                ff::store(orow + cc * 16 + c * 4 + e, out);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decode kernel (Tq = 1): one block per (batch, head), keys split over groups of lanes.

constexpr int kDecodeThreads = 128;
constexpr int kDecodeVec = 8;  // head dims per lane

template <typename T, int DH>
__device__ __forceinline__ void attention_decode(const T* __restrict__ q, const T* __restrict__ k,
                                                 const T* __restrict__ v, const void* __restrict__ mask,
                                                 T* __restrict__ o, int B, int Hq, int Hkv, int Tq, int Tk,
                                                 long long mask_batch_stride, long long mask_head_stride,
                                                 int mask_is_f32, float scale, int causal) {
    constexpr int G = DH / kDecodeVec;           // lanes per key: 4, 8 or 16
    constexpr int NG = kDecodeThreads / G;       // keys in flight per block
    static_assert(G >= 1 && G <= 32 && (32 % G) == 0, "a key's lanes must sit inside one warp");
    __shared__ float s_m[NG];
    __shared__ float s_l[NG];
    __shared__ float s_acc[NG][DH + 1];

    const int tid = threadIdx.x;
    const int group = tid / G;
    const int sub = tid % G;
    const int bh = blockIdx.x;
    const int b = bh / Hq, h = bh % Hq;
    const int hk = h / (Hq / Hkv);
    const int d0 = sub * kDecodeVec;

    const T* qh = q + (long long)bh * DH;  // Tq == 1
    const T* kh = k + ((long long)b * Hkv + hk) * Tk * DH;
    const T* vh = v + ((long long)b * Hkv + hk) * Tk * DH;
    const long long mask_base = (long long)b * mask_batch_stride + (long long)h * mask_head_stride;
    // With Tq = 1 the causal limit is j ≤ Tk − 1: every key is visible.
    (void)causal;
    (void)Tq;

    float qv[kDecodeVec];
#pragma unroll
    for (int e = 0; e < kDecodeVec; ++e) qv[e] = ff::load(qh + d0 + e);

    float m_run = neg_inf(), l_run = 0.0f;
    float acc[kDecodeVec];
#pragma unroll
    for (int e = 0; e < kDecodeVec; ++e) acc[e] = 0.0f;

    // Every lane runs the same number of iterations (the group shuffles need whole warps).
    for (int base = 0; base < Tk; base += NG) {
        const int j = base + group;
        const bool valid = j < Tk;
        float dot = 0.0f;
        if (valid) {
            const T* krow = kh + (long long)j * DH + d0;
#pragma unroll
            for (int e = 0; e < kDecodeVec; ++e) dot = fmaf(qv[e], ff::load(krow + e), dot);
        }
        dot = ff::group_sum<G>(dot);
        float x = neg_inf();
        if (valid) {
            x = (mask != nullptr) ? fmaf(dot, scale, mask_value<T>(mask, mask_base + j, mask_is_f32)) * kLog2e
                                  : dot * (scale * kLog2e);
        }
        const float m_new = fmaxf(m_run, x);
        const float m_use = (m_new == neg_inf()) ? 0.0f : m_new;
        const float alpha = exp2f(m_run - m_use);
        const float p = exp2f(x - m_use);
        m_run = m_new;
        l_run = l_run * alpha + p;
        if (valid) {
            const T* vrow = vh + (long long)j * DH + d0;
#pragma unroll
            for (int e = 0; e < kDecodeVec; ++e) acc[e] = fmaf(p, ff::load(vrow + e), acc[e] * alpha);
        } else {
#pragma unroll
            for (int e = 0; e < kDecodeVec; ++e) acc[e] *= alpha;
        }
    }

    if (sub == 0) {
        s_m[group] = m_run;
        s_l[group] = l_run;
    }
#pragma unroll
    for (int e = 0; e < kDecodeVec; ++e) s_acc[group][d0 + e] = acc[e];
    __syncthreads();

    if (tid < DH) {
        float m_all = neg_inf();
        for (int g = 0; g < NG; ++g) m_all = fmaxf(m_all, s_m[g]);
        const float m_use = (m_all == neg_inf()) ? 0.0f : m_all;
        float l = 0.0f, out = 0.0f;
        for (int g = 0; g < NG; ++g) {
            const float w = exp2f(s_m[g] - m_use);
            l = fmaf(s_l[g], w, l);
            out = fmaf(s_acc[g][tid], w, out);
        }
        ff::store(o + (long long)bh * DH + tid, (l == 0.0f) ? 0.0f : out / l);
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel (fp16 / bf16, sm_80+).

constexpr int kMmaWarps = 4;
constexpr int kMmaRows = 16 * kMmaWarps;  // query rows per block
constexpr int kMmaThreads = 32 * kMmaWarps;

template <int DH> struct MmaTile { static constexpr int BN = (DH >= 128) ? 32 : 64; };  // keys per tile (smem < 48 KB)

template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    __half2 h2 = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h2);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h2 = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h2);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
}
// D = A·B + D for one 16x8x16 tile: A row-major 16x16 (4 regs), B "col" 16x8 (2 regs), D fp32.
template <typename T> __device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <> __device__ __forceinline__ void mma16816<__half>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Fragment layouts (PTX ISA, mma.m16n8k16, lane = 4·g + t):
//   A (16x16): a[0] = (row g,   cols 2t, 2t+1), a[1] = (row g+8, cols 2t, 2t+1),
//              a[2] = (row g,   cols 2t+8, +9), a[3] = (row g+8, cols 2t+8, +9)
//   B (16x8):  b0 = (k 2t, 2t+1; col g), b1 = (k 2t+8, 2t+9; col g)
//   C (16x8):  c[0], c[1] = (row g, cols 2t, 2t+1), c[2], c[3] = (row g+8, cols 2t, 2t+1)
// So the C fragments of two adjacent 8-key tiles of S are exactly the A fragment of P for a
// 16-key step of P·V.
template <typename T, int DH>
__device__ __forceinline__ void attention_mma(const T* __restrict__ q, const T* __restrict__ k,
                                              const T* __restrict__ v, const void* __restrict__ mask,
                                              T* __restrict__ o, int B, int Hq, int Hkv, int Tq, int Tk,
                                              long long mask_batch_stride, long long mask_head_stride,
                                              int mask_is_f32, float scale, int causal) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int BN = MmaTile<DH>::BN;
    constexpr int STRIDE = DH + 8;   // +16 bytes per row: ldmatrix rows land in distinct banks
    constexpr int KSTEPS = DH / 16;  // k-steps of Q·Kᵀ
    constexpr int NT = BN / 8;       // 8-key tiles of S per warp row-block
    constexpr int DT = DH / 8;       // 8-dim tiles of O
    constexpr int CHUNKS = DH / 8;   // 16-byte chunks per K/V row
    __shared__ __align__(128) T sK[2][BN][STRIDE];
    __shared__ __align__(128) T sV[2][BN][STRIDE];

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int BH = B * Hq;
    const int n_qtiles = (Tq + kMmaRows - 1) / kMmaRows;
    const int bh = blockIdx.x % BH;
    const int qtile = n_qtiles - 1 - blockIdx.x / BH;  // heaviest causal tiles first
    const int b = bh / Hq, h = bh % Hq;
    const int hk = h / (Hq / Hkv);
    const int m0 = qtile * kMmaRows;
    const int row0 = m0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
    const int row1 = row0 + 8;

    const T* qh = q + (long long)bh * Tq * DH;
    const T* kh = k + ((long long)b * Hkv + hk) * Tk * DH;
    const T* vh = v + ((long long)b * Hkv + hk) * Tk * DH;
    T* oh = o + (long long)bh * Tq * DH;
    const long long mask_base = (long long)b * mask_batch_stride + (long long)h * mask_head_stride;

    const int key_end = visible_key_end(m0 + kMmaRows, Tq, Tk, causal);
    const int n_tiles = (key_end + BN - 1) / BN;

    auto load_tile = [&](int tile, int buf) {
        const int j0 = tile * BN;
        for (int idx = tid; idx < BN * CHUNKS; idx += kMmaThreads) {
            const int row = idx / CHUNKS, chunk = idx % CHUNKS;
            const int j = j0 + row;
            const bool in = j < Tk;
            const long long off = in ? (long long)j * DH + chunk * 8 : 0;  // zero-fill rows past Tk
            cp_async16(&sK[buf][row][chunk * 8], kh + off, in ? 16 : 0);
            cp_async16(&sV[buf][row][chunk * 8], vh + off, in ? 16 : 0);
        }
        cp_async_commit();
    };
    if (n_tiles > 0) load_tile(0, 0);

    // Q fragments stay in registers for the whole block (rows past Tq read as 0).
    unsigned qf[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        const int c0 = kk * 16 + 2 * t4;
        qf[kk][0] = row0 < Tq ? *reinterpret_cast<const unsigned*>(qh + (long long)row0 * DH + c0) : 0u;
        qf[kk][1] = row1 < Tq ? *reinterpret_cast<const unsigned*>(qh + (long long)row1 * DH + c0) : 0u;
        qf[kk][2] = row0 < Tq ? *reinterpret_cast<const unsigned*>(qh + (long long)row0 * DH + c0 + 8) : 0u;
        qf[kk][3] = row1 < Tq ? *reinterpret_cast<const unsigned*>(qh + (long long)row1 * DH + c0 + 8) : 0u;
    }

    float acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
    float m_run[2] = {neg_inf(), neg_inf()};
    float l_part[2] = {0.0f, 0.0f};
    const float scale_log2 = scale * kLog2e;
    const int diag = Tk - Tq;
    // ldmatrix source row/column of this lane: lanes 8·mi .. 8·mi+7 address matrix mi.
    const int lm_row = lane & 7, lm_mat = lane >> 3;

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int buf = tile & 1;
        if (tile + 1 < n_tiles) {
            load_tile(tile + 1, buf ^ 1);  // its buffer was last read before the previous barrier
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int j0 = tile * BN;

        // S = Q Kᵀ (16 rows × BN keys per warp)
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                // matrices: 0 = (keys lo, dims lo) b0, 1 = (keys lo, dims hi) b1 of tile 2np;
                //           2, 3 = the same for keys hi (tile 2np+1)
                unsigned kb[4];
                ldmatrix_x4(kb, &sK[buf][np * 16 + (lm_mat >> 1) * 8 + lm_row][kk * 16 + (lm_mat & 1) * 8]);
                mma16816<T>(s[2 * np], qf[kk], kb[0], kb[1]);
                mma16816<T>(s[2 * np + 1], qf[kk], kb[2], kb[3]);
            }
        }

        // scale, mask, online softmax (each thread: rows row0/row1, keys j0 + 8nt + 2t4 + {0,1})
        const bool need_bound = j0 + BN > Tk;
        const bool need_causal = causal && (j0 + BN - 1 > m0 + diag);
        float tile_max[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = (e < 2) ? row0 : row1;
                const int j = j0 + nt * 8 + 2 * t4 + (e & 1);
                float x;
                if (mask != nullptr) {
                    const float add = (row < Tq && j < Tk)
                                          ? mask_value<T>(mask, mask_base + (long long)row * Tk + j, mask_is_f32)
                                          : 0.0f;
                    x = fmaf(s[nt][e], scale, add) * kLog2e;
                } else {
                    x = s[nt][e] * scale_log2;
                }
                if ((need_bound && j >= Tk) || (need_causal && j > row + diag)) x = neg_inf();
                s[nt][e] = x;
                tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
            }
        }
        float alpha[2], m_use[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float mx = tile_max[rr];
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[rr], mx);
            m_use[rr] = (m_new == neg_inf()) ? 0.0f : m_new;
            alpha[rr] = exp2f(m_run[rr] - m_use[rr]);
            m_run[rr] = m_new;
        }
        float p_sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[nt][e] - m_use[e >> 1]);
                s[nt][e] = p;
                p_sum[e >> 1] += p;
            }
        }
        l_part[0] = l_part[0] * alpha[0] + p_sum[0];
        l_part[1] = l_part[1] * alpha[1] + p_sum[1];
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            acc[dt][0] *= alpha[0];
            acc[dt][1] *= alpha[0];
            acc[dt][2] *= alpha[1];
            acc[dt][3] *= alpha[1];
        }

        // O += P V, 16 keys per step; P's A fragment comes straight from two S tiles.
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks) {
            unsigned pa[4];
            pa[0] = pack2<T>(s[2 * ks][0], s[2 * ks][1]);
            pa[1] = pack2<T>(s[2 * ks][2], s[2 * ks][3]);
            pa[2] = pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]);
            pa[3] = pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                // transposed matrices: 0 = (keys lo, dims lo) b0, 1 = (keys hi, dims lo) b1 of dim
                // tile 2dp; 2, 3 = the same for dims hi (dim tile 2dp+1)
                unsigned vb[4];
                ldmatrix_x4_trans(vb, &sV[buf][ks * 16 + (lm_mat & 1) * 8 + lm_row][dp * 16 + (lm_mat >> 1) * 8]);
                mma16816<T>(acc[2 * dp], pa, vb[0], vb[1]);
                mma16816<T>(acc[2 * dp + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads();  // all warps done with `buf` before the next iteration refills it
    }

    float l[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        float x = l_part[rr] + __shfl_xor_sync(0xffffffffu, l_part[rr], 1);
        l[rr] = x + __shfl_xor_sync(0xffffffffu, x, 2);
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        const int col = dt * 8 + 2 * t4;
        if (row0 < Tq) {
            const float lo = (l[0] == 0.0f) ? 0.0f : acc[dt][0] / l[0];  // fully masked row → 0
            const float hi = (l[0] == 0.0f) ? 0.0f : acc[dt][1] / l[0];
            *reinterpret_cast<unsigned*>(oh + (long long)row0 * DH + col) = pack2<T>(lo, hi);
        }
        if (row1 < Tq) {
            const float lo = (l[1] == 0.0f) ? 0.0f : acc[dt][2] / l[1];
            const float hi = (l[1] == 0.0f) ? 0.0f : acc[dt][3] / l[1];
            *reinterpret_cast<unsigned*>(oh + (long long)row1 * DH + col) = pack2<T>(lo, hi);
        }
    }
#else
    // Never launched below sm_80 (the launcher picks the CUDA-core kernel there).
    __trap();
#endif
}

}  // namespace

#define FF_ATTN_PARAMS(T)                                                                                      \
    const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const void *__restrict__ mask,  \
        T *__restrict__ o, int B, int Hq, int Hkv, int Tq, int Tk, long long mask_batch_stride,               \
        long long mask_head_stride, int mask_is_f32, float scale, int causal
#define FF_ATTN_ARGS q, k, v, mask, o, B, Hq, Hkv, Tq, Tk, mask_batch_stride, mask_head_stride, mask_is_f32, scale, causal

#define FF_ATTN_SIMT(SUFFIX, T, DH)                                                                       \
    extern "C" __global__ void __launch_bounds__(kSimtThreads, 2) attention_simt_##SUFFIX##_d##DH(FF_ATTN_PARAMS(T)) { \
        attention_simt<T, DH>(FF_ATTN_ARGS);                                                                  \
    }
#define FF_ATTN_DECODE(SUFFIX, T, DH)                                                                         \
    extern "C" __global__ void __launch_bounds__(kDecodeThreads) attention_decode_##SUFFIX##_d##DH(FF_ATTN_PARAMS(T)) { \
        attention_decode<T, DH>(FF_ATTN_ARGS);                                                                \
    }
#define FF_ATTN_MMA(SUFFIX, T, DH)                                                                        \
    extern "C" __global__ void __launch_bounds__(kMmaThreads) attention_mma_##SUFFIX##_d##DH(FF_ATTN_PARAMS(T)) { \
        attention_mma<T, DH>(FF_ATTN_ARGS);                                                                   \
    }

#define FF_ATTN_ALL_DH(MACRO, SUFFIX, T) MACRO(SUFFIX, T, 32) MACRO(SUFFIX, T, 64) MACRO(SUFFIX, T, 128)

FF_ATTN_ALL_DH(FF_ATTN_SIMT, f32, float)
FF_ATTN_ALL_DH(FF_ATTN_SIMT, f16, __half)
FF_ATTN_ALL_DH(FF_ATTN_SIMT, bf16, __nv_bfloat16)
FF_ATTN_ALL_DH(FF_ATTN_DECODE, f32, float)
FF_ATTN_ALL_DH(FF_ATTN_DECODE, f16, __half)
FF_ATTN_ALL_DH(FF_ATTN_DECODE, bf16, __nv_bfloat16)
FF_ATTN_ALL_DH(FF_ATTN_MMA, f16, __half)
FF_ATTN_ALL_DH(FF_ATTN_MMA, bf16, __nv_bfloat16)
