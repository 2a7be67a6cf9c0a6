// What one dependency level of a step kernel costs, by transport (H100 calibration for the step
// compiler's design; framefuse/compiler/README.md records the results).
//
// A level is y = tanh(W x) with W 256x256 fp32 in shared memory and x the previous level's output,
// computed by several thread blocks, so every level is a cross-block exchange. A launch runs L
// levels; the per-level cost is the slope of the launch time over L.
//
//   block     G blocks x 256 threads, 256/G rows a block: x staged from flag-tagged words (value +
//             epoch in one 64-bit word, global memory) by every thread, __syncthreads, a warp per
//             row, lane 0 stores the tagged word. `extra` more __syncthreads-separated phases per
//             level measure what a phase costs.
//   warp      256 warps (32 blocks x 8), a warp per row, no __syncthreads: each lane loads 8 tagged
//             words (all in flight), polls again only those not yet current.
//   cluster   one thread-block cluster of C blocks: each row's value is written into every block's
//             shared memory (distributed shared memory), then a cluster barrier.
//   dsmem     as cluster, but the written words carry a tag and readers spin on their own shared
//             memory: no barrier.
//   mbar      as cluster, but each value goes out with st.async, which counts its 4 bytes on the
//             reader's mbarrier (complete_tx), and a block waits on its own mbarrier for the level's
//             N values (mbarrier.try_wait, acquire at cluster scope): no cluster barrier, no tags,
//             no polling of memory another SM writes (session 56; issue 18's per-level transport:
//             the hardware's own producer / consumer path between the SMs of a cluster).
//   copies    block mode with the level's words stored R times (lanes 0..R-1 of the row's warp each
//             store one copy), block b staging copy b % R: R times fewer blocks poll each line.
//             (Session 67, H100: no cheaper with 2-16 copies, 0.85-0.92 us a level on 128 blocks
//             against 0.84 with one.)
//   unrolled  block mode with the level loop unrolled at compile time (code size x L): the
//             instruction-cache cost of straight-line code run once per launch.
//   splitk    a level as a split product (compiler/simplify.SplitProducts, session 62): P blocks,
//             each holding C = 256/P columns of W, publish the partial sums of all 256 rows over
//             their columns (256 tagged words a block); every block stages all P x 256 words, sums
//             them and takes x = tanh(y - mean(y)) (the whole vector, as a LayerNorm needs it),
//             then computes its partial sums from its own columns of x. What a level costs when
//             its readers stage P x N words instead of N: `x4` stages them 4 loads a thread at a
//             time (ffk_ll_stage_n), `wide` all at once (ffk_ll_stage_wide). A split saves a model a
//             level a layer only if its level costs less than two of block mode's.
//
// Build: nvcc -O3 -arch=sm_90 -o level_cost level_cost.cu ; run: ./level_cost [iters]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#include "check.cuh"

constexpr int N = 256;
constexpr int MAXL = 64;

__device__ __forceinline__ void ll_store(unsigned long long* p, float v, unsigned tag) {
    const unsigned long long w = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned long long ll_load(const unsigned long long* p) {
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    return w;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// every thread loads its words, then re-polls only the ones not yet current, all in flight
template <int PER>
__device__ __forceinline__ void stage(float* dst, const unsigned long long* src, int first, int stride, unsigned tag) {
    unsigned long long w[PER];
    bool done;
#pragma unroll
    for (int u = 0; u < PER; ++u) w[u] = ll_load(src + first + u * stride);
    do {
        done = true;
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            if ((unsigned)(w[u] >> 32) != tag) {
                done = false;
                w[u] = ll_load(src + first + u * stride);
            }
        }
    } while (!done);
#pragma unroll
    for (int u = 0; u < PER; ++u) dst[first + u * stride] = __uint_as_float((unsigned)w[u]);
}

__device__ unsigned next_epoch(unsigned long long* counters, unsigned* s_epoch) {
    if (threadIdx.x == 0) *s_epoch = (unsigned)(counters[blockIdx.x] + 1);
    __syncthreads();
    return *s_epoch;
}

// ---- block mode ----------------------------------------------------------------------------------------
template <bool UNROLL, int LU>
__global__ void __launch_bounds__(256, 1) k_block(const float* W, const float* x0, float* out,
                                                   unsigned long long* ll, unsigned long long* counters, int L,
                                                   int extra, int reps = 1) {
    extern __shared__ __align__(16) float sm[];
    __shared__ unsigned s_epoch;
    const int rows = N / gridDim.x;
    float* w = sm;                // rows x N
    float* x = sm + rows * N;     // N
    float* tmp = x + N;           // N
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < rows * N; i += blockDim.x) w[i] = W[blockIdx.x * rows * N + i];
    for (int i = tid; i < N; i += blockDim.x) x[i] = x0[i];
    const unsigned epoch = next_epoch(counters, &s_epoch);
    const int levels = UNROLL ? LU : L;
#pragma unroll(UNROLL ? LU : 1)
    for (int l = 0; l < levels; ++l) {
        if (l > 0) {  // this block's replica of the level's words
            stage<1>(x, ll + ((size_t)(l - 1) * reps + blockIdx.x % reps) * N, tid, 0, epoch);
            __syncthreads();
        }
        for (int p = 0; p < extra; ++p) {  // a phase: every thread touches shared memory, then a barrier
            tmp[tid] = x[(tid + p) & (N - 1)] * 0.5f;
            __syncthreads();
        }
        for (int r = warp; r < rows; r += blockDim.x / 32) {
            float acc = 0.f;
#pragma unroll
            for (int k = lane; k < N; k += 32) acc += w[r * N + k] * x[k];
            acc = warp_sum(acc);
            const float y = tanhf(acc);
            if (lane < reps) ll_store(ll + ((size_t)l * reps + lane) * N + blockIdx.x * rows + r, y, epoch);
        }
        __syncthreads();
    }
    if (blockIdx.x == 0) {
        stage<1>(x, ll + (size_t)(levels - 1) * reps * N, tid, 0, epoch);
        out[tid] = x[tid];
    }
    if (tid == 0) counters[blockIdx.x] += 1;
}

// ---- warp mode: a warp per row, no block barrier ------------------------------------------------------------
__global__ void __launch_bounds__(256, 1) k_warp(const float* W, const float* x0, float* out,
                                                  unsigned long long* ll, unsigned long long* counters, int L) {
    extern __shared__ __align__(16) float sm[];
    __shared__ unsigned s_epoch;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row = blockIdx.x * 8 + warp;  // 32 blocks x 8 warps = 256 rows
    float wreg[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) wreg[j] = W[row * N + lane + 32 * j];
    float xv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) xv[j] = x0[lane + 32 * j];
    (void)sm;
    const unsigned epoch = next_epoch(counters, &s_epoch);
    for (int l = 0; l < L; ++l) {
        if (l > 0) {
            const unsigned long long* src = ll + (l - 1) * N;
            unsigned long long w[8];
            bool done;
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j] = ll_load(src + lane + 32 * j);
            do {
                done = true;
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    if ((unsigned)(w[j] >> 32) != epoch) {
                        done = false;
                        w[j] = ll_load(src + lane + 32 * j);
                    }
            } while (!done);
#pragma unroll
            for (int j = 0; j < 8; ++j) xv[j] = __uint_as_float((unsigned)w[j]);
        }
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += wreg[j] * xv[j];
        acc = warp_sum(acc);
        if (lane == 0) ll_store(ll + l * N + row, tanhf(acc), epoch);
    }
    if (blockIdx.x == 0 && warp == 0) {
        const unsigned long long* src = ll + (L - 1) * N;
        for (int j = 0; j < 8; ++j) {
            unsigned long long w;
            do w = ll_load(src + lane + 32 * j);
            while ((unsigned)(w >> 32) != epoch);
            out[lane + 32 * j] = __uint_as_float((unsigned)w);
        }
    }
    __syncthreads();
    if (tid == 0) counters[blockIdx.x] += 1;
}

// ---- splitk mode: partial sums over a block's columns, every block staging all of them -----------------------
template <int P, int BATCH>
__global__ void __launch_bounds__(256, 1) k_splitk(const float* W, const float* x0, float* out,
                                                    unsigned long long* ll, unsigned long long* counters, int L) {
    constexpr int C = N / P;        // columns a block
    constexpr int PER = P * N / 256;  // staged words a thread
    static_assert(PER % BATCH == 0, "a thread's words in whole batches");
    extern __shared__ __align__(16) float sm[];
    __shared__ unsigned s_epoch;
    __shared__ float s_sums[8];
    float* w = sm;             // w[n * C + j] = W[n][p * C + j]
    float* part = w + N * C;   // P x N staged partial sums
    float* x = part + P * N;   // N
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, p = blockIdx.x;
    for (int i = tid; i < N * C; i += blockDim.x) w[i] = W[(i / C) * N + p * C + i % C];
    for (int i = tid; i < N; i += blockDim.x) x[i] = x0[i];
    const unsigned epoch = next_epoch(counters, &s_epoch);
    auto whole = [&](const unsigned long long* src) {  // x = tanh(y - mean(y)), y = the P slices' sum
#pragma unroll
        for (int b = 0; b < PER / BATCH; ++b) stage<BATCH>(part, src, tid + b * BATCH * 256, 256, epoch);
        __syncthreads();
        float y = 0.f;
#pragma unroll
        for (int q = 0; q < P; ++q) y += part[q * N + tid];
        const float total = warp_sum(y);
        if (lane == 0) s_sums[warp] = total;
        __syncthreads();
        float mean = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) mean += s_sums[i];
        mean *= 1.f / N;
        x[tid] = tanhf(y - mean);
        __syncthreads();
    };
    for (int l = 0; l < L; ++l) {
        if (l > 0) whole(ll + (size_t)(l - 1) * P * N);
        float acc = 0.f;  // thread n: row n over this block's columns
#pragma unroll
        for (int j = 0; j < C; ++j) acc += w[tid * C + ((j + tid) % C)] * x[p * C + ((j + tid) % C)];
        ll_store(ll + (size_t)l * P * N + p * N + tid, acc, epoch);
        __syncthreads();
    }
    if (blockIdx.x == 0 && L > 0) {
        whole(ll + (size_t)(L - 1) * P * N);
        out[tid] = x[tid];
    }
    if (tid == 0) counters[blockIdx.x] += 1;
}

static std::vector<float> reference_splitk(const std::vector<float>& W, const std::vector<float>& x0, int L) {
    std::vector<float> x = x0, y(N);
    for (int l = 0; l < L; ++l) {
        double mean = 0;
        for (int r = 0; r < N; ++r) {
            double acc = 0;
            for (int k = 0; k < N; ++k) acc += (double)W[r * N + k] * x[k];
            y[r] = (float)acc;
            mean += acc;
        }
        mean /= N;
        for (int r = 0; r < N; ++r) x[r] = (float)std::tanh(y[r] - mean);
    }
    return x;
}

// ---- cluster mode: distributed shared memory and a cluster barrier ------------------------------------------
__device__ __forceinline__ void cluster_sync_relacq() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

template <bool TAGGED>
__global__ void __launch_bounds__(256, 1) k_cluster(const float* W, const float* x0, float* out, int L) {
    extern __shared__ __align__(16) float sm[];
    cg::cluster_group cluster = cg::this_cluster();
    const int C = cluster.num_blocks();
    const int me = cluster.block_rank();
    const int rows = N / C;
    float* w = sm;                                                        // rows x N
    float* xb = sm + rows * N;                                            // untagged: 2 x N floats
    unsigned long long* xt = reinterpret_cast<unsigned long long*>(xb);  // tagged: 2 x N words
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < rows * N; i += blockDim.x) w[i] = W[me * rows * N + i];
    for (int i = tid; i < N; i += blockDim.x) {
        if (TAGGED) {
            xt[i] = (unsigned long long)__float_as_uint(x0[i]);  // tag 0 = level 0's input
            xt[N + i] = 0xffffffff00000000ull;
        } else {
            xb[i] = x0[i];
        }
    }
    cluster.sync();  // every block's buffers initialised before anyone writes into them
    float xv[8];
    for (int l = 0; l < L; ++l) {
        const int p = l & 1;
        if (TAGGED) {
            // spin on our own shared memory until every word carries this level's tag
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                unsigned long long v;
                do {
                    asm volatile("ld.volatile.shared.b64 %0, [%1];"
                                 : "=l"(v)
                                 : "r"((unsigned)__cvta_generic_to_shared(xt + p * N + lane + 32 * j))
                                 : "memory");
                } while ((unsigned)(v >> 32) != (unsigned)l);
                xv[j] = __uint_as_float((unsigned)v);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) xv[j] = xb[p * N + lane + 32 * j];
        }
        for (int r = warp; r < rows; r += blockDim.x / 32) {
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) acc += w[r * N + lane + 32 * j] * xv[j];
            acc = warp_sum(acc);
            const float y = tanhf(acc);
            // lanes 0..C-1 each write the value into one block's buffer
            if (lane < C) {
                const int idx = (p ^ 1) * N + me * rows + r;
                if (TAGGED) {
                    unsigned long long* dst = cluster.map_shared_rank(xt + idx, lane);
                    const unsigned long long word = ((unsigned long long)(l + 1) << 32) | __float_as_uint(y);
                    asm volatile("st.relaxed.cluster.b64 [%0], %1;" ::"l"(dst), "l"(word) : "memory");
                } else {
                    float* dst = cluster.map_shared_rank(xb + idx, lane);
                    *dst = y;
                }
            }
        }
        if (!TAGGED) cluster_sync_relacq();
        else __syncwarp();
    }
    if (me == 0) {
        const int p = L & 1;
        for (int i = tid; i < N; i += blockDim.x) {
            if (TAGGED) {
                unsigned long long v;
                do {
                    asm volatile("ld.volatile.shared.b64 %0, [%1];"
                                 : "=l"(v)
                                 : "r"((unsigned)__cvta_generic_to_shared(xt + p * N + i))
                                 : "memory");
                } while ((unsigned)(v >> 32) != (unsigned)L);
                out[i] = __uint_as_float((unsigned)v);
            } else {
                out[i] = xb[p * N + i];
            }
        }
    }
    cluster.sync();  // nobody leaves while others may still write into its shared memory
}

// ---- mbar mode: st.async into every block's shared memory, counted by its mbarrier --------------------------
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_arm(unsigned bar, unsigned bytes) {  // this block's arrival, and the bytes to come
    asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [%0], %1;\n\t}" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
// a protocol error traps (the launch fails, CHECK says where) instead of hanging the GPU call
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done, polls = 0;
    do {
        if (++polls > (1u << 22)) __trap();
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

__global__ void __launch_bounds__(256, 1) k_mbar(const float* W, const float* x0, float* out, int L) {
    extern __shared__ __align__(16) float sm[];
    __shared__ __align__(8) unsigned long long bars[2];  // bars[p] counts the values of buffer p
    cg::cluster_group cluster = cg::this_cluster();
    const int C = cluster.num_blocks();
    const int me = cluster.block_rank();
    const int rows = N / C;
    float* w = sm;               // rows x N
    float* xb = sm + rows * N;   // 2 x N: level l reads buffer l & 1
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < rows * N; i += blockDim.x) w[i] = W[me * rows * N + i];
    for (int i = tid; i < N; i += blockDim.x) xb[i] = x0[i];
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[0])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[1])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (L >= 1) mbar_arm(smem_u32(&bars[1]), N * 4);  // level 1's input
        if (L >= 2) mbar_arm(smem_u32(&bars[0]), N * 4);  // level 2's; later ones as each phase ends
    }
    cluster.sync();  // every block's barriers initialised and armed before anyone sends
    // where lane c (< C) sends: block c's buffers and barriers, as shared::cluster addresses
    unsigned remote_x = 0, remote_bar0 = 0;
    if (lane < C) {
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_x) : "r"(smem_u32(xb)), "r"(lane));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar0) : "r"(smem_u32(&bars[0])), "r"(lane));
    }
    float xv[8];
    for (int l = 0; l < L; ++l) {
        const int p = l & 1;
        if (l > 0) {
            // the k-th use of barrier p: level 2k + 1 (p = 1) or 2k + 2 (p = 0)
            const unsigned k = p ? (unsigned)(l - 1) >> 1 : ((unsigned)l >> 1) - 1u;
            mbar_wait(smem_u32(&bars[p]), k & 1u);
            // re-armed for level l + 2 once this phase is over: the senders of that level's values
            // have all received this block's level-l values, so this phase completed first
            if (tid == 0 && l + 2 <= L) mbar_arm(smem_u32(&bars[p]), N * 4);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) xv[j] = xb[p * N + lane + 32 * j];
        for (int r = warp; r < rows; r += blockDim.x / 32) {
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) acc += w[r * N + lane + 32 * j] * xv[j];
            acc = warp_sum(acc);
            const float y = tanhf(acc);
            if (lane < C) {
                const unsigned q = (unsigned)(p ^ 1);
                const unsigned dst = remote_x + 4u * (q * N + me * rows + r);
                const unsigned bar = remote_bar0 + 8u * q;
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dst),
                             "r"(__float_as_uint(y)), "r"(bar)
                             : "memory");
            }
        }
    }
    if (L > 0) {
        const int p = L & 1;
        const unsigned k = p ? (unsigned)(L - 1) >> 1 : ((unsigned)L >> 1) - 1u;
        mbar_wait(smem_u32(&bars[p]), k & 1u);
    }
    if (me == 0)
        for (int i = tid; i < N; i += blockDim.x) out[i] = xb[(L & 1) * N + i];
    cluster.sync();  // nobody leaves while others may still send into its shared memory
}

// ---- driver ------------------------------------------------------------------------------------------------
struct Bufs {
    float *W, *x0, *out;
    unsigned long long *ll, *counters;
};

static std::vector<float> reference(const std::vector<float>& W, const std::vector<float>& x0, int L) {
    std::vector<float> x = x0, y(N);
    for (int l = 0; l < L; ++l) {
        for (int r = 0; r < N; ++r) {
            double acc = 0;
            for (int k = 0; k < N; ++k) acc += (double)W[r * N + k] * x[k];
            y[r] = (float)std::tanh(acc);
        }
        x = y;
    }
    return x;
}

template <class Launch>
static double time_graph(Launch launch, int iters) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launch(s);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 50; ++i) CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaStreamSynchronize(s));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(s));
    return 1000.0 * ms / iters;
}

static double check(const Bufs& d, const std::vector<float>& W, const std::vector<float>& x0, int L,
                    bool splitk = false) {
    std::vector<float> got(N);
    CHECK(cudaMemcpy(got.data(), d.out, N * 4, cudaMemcpyDeviceToHost));
    auto ref = splitk ? reference_splitk(W, x0, L) : reference(W, x0, L);
    double worst = 0;
    for (int i = 0; i < N; ++i) worst = fmax(worst, fabs(got[i] - ref[i]));
    return worst;
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 2000;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("# %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    std::vector<float> W(N * N), x0(N);
    srand(1);
    for (auto& v : W) v = ((rand() / (float)RAND_MAX) - 0.5f) * 0.2f;
    for (auto& v : x0) v = (rand() / (float)RAND_MAX) - 0.5f;
    Bufs d;
    CHECK(cudaMalloc(&d.W, N * N * 4));
    CHECK(cudaMalloc(&d.x0, N * 4));
    CHECK(cudaMalloc(&d.out, N * 4));
    CHECK(cudaMalloc(&d.ll, MAXL * 16 * N * 8));  // splitk: up to 16 slices of N words a level
    CHECK(cudaMalloc(&d.counters, 256 * 8));
    CHECK(cudaMemcpy(d.W, W.data(), N * N * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d.x0, x0.data(), N * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d.ll, 0, MAXL * 16 * N * 8));
    CHECK(cudaMemset(d.counters, 0, 256 * 8));
    const int Ls[] = {1, 4, 16, 64};
    // epochs restart at 1 for every measurement: flags and launch counters back to 0
    auto reset = [&]() {
        CHECK(cudaMemset(d.out, 0, N * 4));
        CHECK(cudaMemset(d.ll, 0, MAXL * 16 * N * 8));
        CHECK(cudaMemset(d.counters, 0, 256 * 8));
        CHECK(cudaDeviceSynchronize());
    };
    printf("mode            L=1      L=4     L=16     L=64  us/level(4..64)  max|err|\n");
    auto row = [&](const char* name, auto run, bool splitk = false) {
        double t[4];
        double err = 0;
        for (int i = 0; i < 4; ++i) {
            reset();
            t[i] = time_graph([&](cudaStream_t s) { run(s, Ls[i]); }, iters);
            CHECK(cudaDeviceSynchronize());
            err = fmax(err, check(d, W, x0, Ls[i], splitk));
        }
        printf("%-12s %8.2f %8.2f %8.2f %8.2f %12.3f %12.2e\n", name, t[0], t[1], t[2], t[3], (t[3] - t[1]) / 60.0, err);
        fflush(stdout);
    };
    // block mode on G blocks, `extra` phases a level, the level's words in R copies
    auto block_row = [&](const char* name, int G, int extra, int R) {
        const size_t smem = ((N / G) * N + 2 * N) * 4;
        CHECK(cudaFuncSetAttribute(k_block<false, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        row(name, [&](cudaStream_t s, int L) {
            k_block<false, 1><<<G, 256, smem, s>>>(d.W, d.x0, d.out, d.ll, d.counters, L, extra, R);
        });
    };
    char name[64];
    for (int G : {128, 64, 32, 16}) {
        for (int extra : {0, 1, 4}) {
            snprintf(name, sizeof name, "block G%d+%d", G, extra);
            block_row(name, G, extra, 1);
        }
    }
    // the level's words stored in R copies, block b polling copy b % R: R times fewer readers a line
    // (with one copy, all 128 blocks poll the same 16 lines; session 67)
    for (int G : {128, 32}) {
        for (int R : {2, 4, 8, 16}) {
            snprintf(name, sizeof name, "copies G%d R%d", G, R);
            block_row(name, G, 0, R);
        }
    }
    {
        const int G = 128, rows = 2;
        const size_t smem = (rows * N + 2 * N) * 4;
        CHECK(cudaFuncSetAttribute(k_block<true, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CHECK(cudaFuncSetAttribute(k_block<true, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CHECK(cudaFuncSetAttribute(k_block<true, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        reset();
        double t4 = time_graph([&](cudaStream_t s) { k_block<true, 4><<<G, 256, smem, s>>>(d.W, d.x0, d.out, d.ll, d.counters, 4, 0); }, iters);
        reset();
        double t16 = time_graph([&](cudaStream_t s) { k_block<true, 16><<<G, 256, smem, s>>>(d.W, d.x0, d.out, d.ll, d.counters, 16, 0); }, iters);
        reset();
        double t64 = time_graph([&](cudaStream_t s) { k_block<true, 64><<<G, 256, smem, s>>>(d.W, d.x0, d.out, d.ll, d.counters, 64, 0); }, iters);
        CHECK(cudaDeviceSynchronize());
        printf("%-12s %8s %8.2f %8.2f %8.2f %12.3f %12.2e\n", "unrolled G128", "-", t4, t16, t64, (t64 - t4) / 60.0,
               check(d, W, x0, 64));
    }
    row("warp 32x8", [&](cudaStream_t s, int L) { k_warp<<<32, 256, 0, s>>>(d.W, d.x0, d.out, d.ll, d.counters, L); });
    // split products: P blocks, all P x N partial sums staged by every block, 4 loads a thread at a
    // time or all at once
    auto splitk_row = [&](const char* name, void (*fn)(const float*, const float*, float*, unsigned long long*,
                                                       unsigned long long*, int), int P) {
        const size_t smem = (size_t)(N * (N / P) + P * N + N) * 4;
        CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        row(
            name,
            [&](cudaStream_t s, int L) { fn<<<P, 256, smem, s>>>(d.W, d.x0, d.out, d.ll, d.counters, L); },
            true);
    };
    splitk_row("splitk P16 x4", k_splitk<16, 4>, 16);
    splitk_row("splitk P16 wide", k_splitk<16, 16>, 16);
    splitk_row("splitk P8 x4", k_splitk<8, 4>, 8);
    splitk_row("splitk P8 wide", k_splitk<8, 8>, 8);
    splitk_row("splitk P4 wide", k_splitk<4, 4>, 4);
    // one cluster of C blocks a launch (k_cluster's and k_mbar's rows)
    auto cluster_row = [&](const char* name, void (*fn)(const float*, const float*, float*, int), int C, size_t smem) {
        CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        if (C > 8) CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        row(name, [&](cudaStream_t s, int L) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(C);
            cfg.blockDim = dim3(256);
            cfg.dynamicSmemBytes = smem;
            cfg.stream = s;
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = C;
            attr[0].val.clusterDim.y = 1;
            attr[0].val.clusterDim.z = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
            CHECK(cudaLaunchKernelEx(&cfg, fn, (const float*)d.W, (const float*)d.x0, d.out, L));
        });
    };
    for (int C : {8, 16}) {
        for (int tagged = 0; tagged < 2; ++tagged) {
            snprintf(name, sizeof name, "%s C%d", tagged ? "dsmem" : "cluster", C);
            cluster_row(name, tagged ? k_cluster<true> : k_cluster<false>, C, (N / C * N + 4 * N) * 4);
        }
        snprintf(name, sizeof name, "mbar C%d", C);
        cluster_row(name, k_mbar, C, (N / C * N + 2 * N) * 4);
    }
    return 0;
}
