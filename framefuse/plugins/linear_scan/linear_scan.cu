// LinearScan: h_t = a_t * h_{t-1} + b_t over time, elementwise over channels (see OPS.md).
//
// Two designs, chosen by interface.py:
//  * sequential: one thread per VEC consecutive channels of one batch row walks all T steps with
//    the state in registers. Loads are coalesced across channels (and vectorised to 16 bytes
//    when D allows); SEQ_UNROLL steps of a and b are loaded ahead of the dependent FMAs, so the
//    recurrence waits on arithmetic, not on memory latency. Reads a, b once and writes h once.
//  * chunked: when B*D channels cannot fill the GPU, T is split into NC chunks too. One block
//    holds CH channels x NC chunks (blockDim = (CH, NC)), so the whole scan of a channel lives in
//    one block and needs no global workspace:
//      pass 1  each thread reduces its chunk to the affine map  state_out = A * state_in + Bc,
//      pass 2  a Kogge-Stone scan over the NC chunk maps in shared memory gives each chunk its
//              incoming state (carry),
//      pass 3  each thread re-runs its chunk from the carry and writes h (the second read of a
//              and b mostly hits L2).
//
// Arithmetic: state in float32; each step is a rounded multiply then a rounded add
// (__fmul_rn/__fadd_rn, no FMA contraction) like the float32 reference loop, so the sequential
// design reproduces the reference bit for bit in float32; the chunked one differs only through
// the reassociated carries. NaN propagates as in the loop. The first step of a chunk summary
// starts from (A, Bc) = (a, b) instead of multiplying a zero state, so an infinite `a` is kept.

#include "../common.cuh"

namespace {

constexpr int SEQ_UNROLL = 8;
constexpr int MAX_CHUNK_THREADS = 1024;

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

__device__ __forceinline__ float step(float a, float h, float b) { return __fadd_rn(__fmul_rn(a, h), b); }

template <typename T, int VEC>
__device__ __forceinline__ void scan_sequential(const T* __restrict__ a, const T* __restrict__ b,
                                                const float* __restrict__ h0, T* __restrict__ h,
                                                float* __restrict__ h_last, int batch, int steps, int channels) {
    using P = Pack<T, VEC>;
    const int vecs_per_row = channels / VEC;
    const long long lane = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (lane >= (long long)batch * vecs_per_row) return;
    const long long bi = lane / vecs_per_row;
    const int d0 = (int)(lane % vecs_per_row) * VEC;

    float state[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) state[v] = h0 ? h0[bi * channels + d0 + v] : 0.0f;

    const size_t base = (size_t)bi * steps * channels + d0;
    const P* pa = reinterpret_cast<const P*>(a + base);
    const P* pb = reinterpret_cast<const P*>(b + base);
    P* ph = reinterpret_cast<P*>(h + base);
    const size_t stride = (size_t)vecs_per_row;  // one time step, in packs

    for (int t0 = 0; t0 < steps; t0 += SEQ_UNROLL) {
        P ra[SEQ_UNROLL], rb[SEQ_UNROLL];
#pragma unroll
        for (int u = 0; u < SEQ_UNROLL; ++u) {
            if (t0 + u < steps) {
                ra[u] = pa[(size_t)(t0 + u) * stride];
                rb[u] = pb[(size_t)(t0 + u) * stride];
            }
        }
#pragma unroll
        for (int u = 0; u < SEQ_UNROLL; ++u) {
            if (t0 + u < steps) {
                P out;
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    state[v] = step(ff::to_float(ra[u].v[v]), state[v], ff::to_float(rb[u].v[v]));
                    out.v[v] = ff::from_float<T>(state[v]);
                }
                ph[(size_t)(t0 + u) * stride] = out;
            }
        }
    }
#pragma unroll
    for (int v = 0; v < VEC; ++v) h_last[bi * channels + d0 + v] = state[v];
}

template <typename T>
__device__ __forceinline__ void scan_chunked(const T* __restrict__ a, const T* __restrict__ b,
                                             const float* __restrict__ h0, T* __restrict__ h,
                                             float* __restrict__ h_last, int batch, int steps, int channels,
                                             int chunk_len) {
    __shared__ float s_mul[MAX_CHUNK_THREADS];
    __shared__ float s_add[MAX_CHUNK_THREADS];
    const int n_channels_block = blockDim.x;  // CH
    const int n_chunks = blockDim.y;           // NC
    const int x = threadIdx.x;
    const int y = threadIdx.y;
    const int idx = y * n_channels_block + x;
    const long long channel = (long long)blockIdx.x * n_channels_block + x;  // flattened (b, d)
    const bool active = channel < (long long)batch * channels;
    const long long bi = active ? channel / channels : 0;
    const int d = active ? (int)(channel % channels) : 0;
    const int t_begin = min(y * chunk_len, steps);
    const int t_end = min(t_begin + chunk_len, steps);
    const size_t base = (size_t)bi * steps * channels + d;

    // pass 1: chunk summary, state_out = mul * state_in + add
    float mul = 1.0f, add = 0.0f;
    if (active && t_begin < t_end) {
        mul = ff::load(a + base + (size_t)t_begin * channels);
        add = ff::load(b + base + (size_t)t_begin * channels);
        for (int t0 = t_begin + 1; t0 < t_end; t0 += SEQ_UNROLL) {
            float ra[SEQ_UNROLL], rb[SEQ_UNROLL];
#pragma unroll
            for (int u = 0; u < SEQ_UNROLL; ++u) {
                if (t0 + u < t_end) {
                    ra[u] = ff::load(a + base + (size_t)(t0 + u) * channels);
                    rb[u] = ff::load(b + base + (size_t)(t0 + u) * channels);
                }
            }
#pragma unroll
            for (int u = 0; u < SEQ_UNROLL; ++u) {
                if (t0 + u < t_end) {
                    mul = __fmul_rn(ra[u], mul);
                    add = step(ra[u], add, rb[u]);
                }
            }
        }
    }

    // pass 2: inclusive scan of the chunk maps over y (earlier chunk applied first)
    s_mul[idx] = mul;
    s_add[idx] = add;
    __syncthreads();
    for (int offset = 1; offset < n_chunks; offset <<= 1) {
        const bool has_prev = y >= offset;
        float prev_mul = 1.0f, prev_add = 0.0f;
        if (has_prev) {
            prev_mul = s_mul[idx - offset * n_channels_block];
            prev_add = s_add[idx - offset * n_channels_block];
        }
        __syncthreads();
        if (has_prev) {
            add = step(mul, prev_add, add);  // mul * prev_add + add
            mul = __fmul_rn(mul, prev_mul);
            s_mul[idx] = mul;
            s_add[idx] = add;
        }
        __syncthreads();
    }

    if (!active) return;
    const float h_init = h0 ? h0[channel] : 0.0f;
    float state = h_init;
    if (y > 0) state = step(s_mul[idx - n_channels_block], h_init, s_add[idx - n_channels_block]);

    // pass 3: re-run the chunk from its carry and write every h_t
    for (int t0 = t_begin; t0 < t_end; t0 += SEQ_UNROLL) {
        float ra[SEQ_UNROLL], rb[SEQ_UNROLL];
#pragma unroll
        for (int u = 0; u < SEQ_UNROLL; ++u) {
            if (t0 + u < t_end) {
                ra[u] = ff::load(a + base + (size_t)(t0 + u) * channels);
                rb[u] = ff::load(b + base + (size_t)(t0 + u) * channels);
            }
        }
#pragma unroll
        for (int u = 0; u < SEQ_UNROLL; ++u) {
            if (t0 + u < t_end) {
                state = step(ra[u], state, rb[u]);
                ff::store(h + base + (size_t)(t0 + u) * channels, state);
            }
        }
    }
    // the launcher makes every chunk non-empty, so the last chunk ends at t = T-1
    if (y == n_chunks - 1) h_last[channel] = state;
}

}  // namespace

#define FF_LINEAR_SCAN_SEQ(SUFFIX, T, VEC)                                                              \
    extern "C" __global__ void __launch_bounds__(128) linear_scan_seq_v##VEC##_##SUFFIX(                  \
        const T* a, const T* b, const float* h0, T* h, float* h_last, int batch, int steps, int channels) { \
        scan_sequential<T, VEC>(a, b, h0, h, h_last, batch, steps, channels);                           \
    }

#define FF_LINEAR_SCAN_CHUNKED(SUFFIX, T)                                                               \
    extern "C" __global__ void __launch_bounds__(MAX_CHUNK_THREADS) linear_scan_chunked_##SUFFIX(         \
        const T* a, const T* b, const float* h0, T* h, float* h_last, int batch, int steps, int channels, \
        int chunk_len) {                                                                                \
        scan_chunked<T>(a, b, h0, h, h_last, batch, steps, channels, chunk_len);                        \
    }

FF_LINEAR_SCAN_SEQ(f32, float, 1)
FF_LINEAR_SCAN_SEQ(f32, float, 2)
FF_LINEAR_SCAN_SEQ(f32, float, 4)
FF_LINEAR_SCAN_SEQ(f16, __half, 1)
FF_LINEAR_SCAN_SEQ(f16, __half, 2)
FF_LINEAR_SCAN_SEQ(f16, __half, 4)
FF_LINEAR_SCAN_SEQ(f16, __half, 8)
FF_LINEAR_SCAN_SEQ(bf16, __nv_bfloat16, 1)
FF_LINEAR_SCAN_SEQ(bf16, __nv_bfloat16, 2)
FF_LINEAR_SCAN_SEQ(bf16, __nv_bfloat16, 4)
FF_LINEAR_SCAN_SEQ(bf16, __nv_bfloat16, 8)

FF_LINEAR_SCAN_CHUNKED(f32, float)
FF_LINEAR_SCAN_CHUNKED(f16, __half)
FF_LINEAR_SCAN_CHUNKED(bf16, __nv_bfloat16)
