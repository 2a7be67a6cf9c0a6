// What one position of a one-block recurrence costs, by part (issue 17: nn.LSTM hidden 64, T = 256,
// one direction, where the step kernel ties cuDNN at ~0.52 us a position on the H100).
//
// The loop is the step compiler's one-block LSTM loop (codegen.Generator._recur, "alone"): R's 256
// gate rows in registers (a thread a row, 64 weights), h in shared memory (two buffers), the
// position's input words (flag-tagged, in global memory) loaded a position ahead, then
//   products: 16 float4 reads of h, 64 multiply-adds on 4 accumulators, the sum into rP
//   barrier
//   cells: 64 threads take their 4 input words, read 4 parts of rP, apply the cell (precise tanhf),
//          store h and c as flag-tagged words (global), write h into the other buffer
//   barrier
// Variants take parts out (to see what each costs) or change the layout:
//   full         the loop as generated
//   no-stores    without the flag-tagged stores of h and c
//   fast-tanh    tanh as 1 - 2 / (1 + e^2x) with __expf / __fdividef
//   linear-cell  the cell replaced by h = sum of the gates (no transcendental)
//   no-products  the products replaced by one read of h
//   barriers     only the two barriers and the h buffer swap
//   warp-cell    one barrier a position: a warp holds 8 units' 4 gate rows (lane = gate * 8 + unit),
//                each thread its row's whole product plus its own input word, the 4 gates met by
//                shuffles, the cell in the gate-0 lanes, h published, one barrier
//   warp-cell-all the same, every lane applying the cell (the lanes tactic's choice)
//   warp-cell-fast warp-cell with the fast tanh
//   full+pollers the full loop with 131 other blocks polling its h words as a consumer task does
//   +no-inputs   no input words at all (the gates' inputs zero): what their loads cost
//   +staged      the input words of 16 positions loaded by the whole block at once (a word a thread
//                a position, all in flight together), taken into shared memory behind one barrier,
//                instead of each position's words a position ahead by the cell threads
// Each variant: one block of 256 threads (plus the pollers), T = 256; cycles a position from
// thread 0's clock64 around the loop, and the launch's device time (events), best of 7 launches.
//
// Build: nvcc -O3 -arch=sm_90 -ftz=true -prec-div=false -prec-sqrt=false -o recur_position recur_position.cu
// Run:   ./recur_position
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.cuh"

constexpr int H = 64, G = 4, T = 256, NT = 256, ROWS = G * H;

enum Part : unsigned {
    STORES = 1u,
    FAST_TANH = 2u,
    CELL = 4u,
    PRODUCTS = 8u,
    WARP_CELL = 16u,
    ALL_LANES = 32u,
    POLLERS = 64u,
    NO_INPUTS = 128u,
    STAGED = 256u,
};

__device__ __forceinline__ void ll_store(unsigned long long* p, float v, unsigned epoch) {
    const unsigned long long word = ((unsigned long long)epoch << 32) | (unsigned long long)__float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(word) : "memory");
}
__device__ __forceinline__ unsigned long long ll_peek(const unsigned long long* p) {
    unsigned long long word;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(word) : "l"(p) : "memory");
    return word;
}
__device__ __noinline__ float ll_wait(const unsigned long long* p, unsigned epoch) {
    unsigned long long word = ll_peek(p);
    while ((unsigned)(word >> 32) != epoch) word = ll_peek(p);
    return __uint_as_float((unsigned)word);
}
__device__ __forceinline__ float ll_take(unsigned long long word, const unsigned long long* p, unsigned epoch) {
    return (unsigned)(word >> 32) == epoch ? __uint_as_float((unsigned)word) : ll_wait(p, epoch);
}
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + __expf(-x)); }
template <unsigned V>
__device__ __forceinline__ float tanh_(float x) {
    if (V & FAST_TANH) return 1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * x));
    return tanhf(x);
}
template <unsigned V>
__device__ __forceinline__ void cell(float i, float f, float g, float o, float& c, float& h) {
    if (V & CELL) {
        c = sigm(f) * c + sigm(i) * tanh_<V>(g);
        h = sigm(o) * tanh_<V>(c);
    } else {
        c = 0.5f * c + 0.125f * (i + f + g);
        h = 0.25f * o + c;
    }
}

// A unit's c and h of position t: stored as flag-tagged words (or kept in a register, so the
// compiler keeps the cell), and h into the other buffer for the next position's products.
template <unsigned V>
__device__ __forceinline__ void publish(unsigned long long* out, float* rH, int t, int unit, float c, float h,
                                        unsigned epoch, float& keep) {
    if (V & STORES) {
        ll_store(out + (size_t)t * 2 * H + H + unit, c, epoch);
        ll_store(out + (size_t)t * 2 * H + unit, h, epoch);
    } else {
        keep += h;
    }
    rH[((t + 1) & 1) * H + unit] = h;
}

template <unsigned V>
__global__ void __launch_bounds__(NT) recur(const float* __restrict__ R, const unsigned long long* __restrict__ xw,
                                            unsigned long long* out, long long* cycles, unsigned epoch) {
    __shared__ __align__(16) float rH[2 * H];
    __shared__ float rP[ROWS];
    __shared__ float rC[H];
    constexpr int CHUNK = 16;  // STAGED: positions a stage
    __shared__ float rX[(V & STAGED) ? CHUNK * ROWS : 1];
    const int tid = threadIdx.x;
    if (blockIdx.x > 0) {  // a consumer task's blocks: poll the h words in order, as the Transpose after the loop
        if (!(V & POLLERS)) return;
        float sum = 0.0f;
        for (int t = 0; t < T; ++t)
            if (tid < H) sum += ll_wait(out + (size_t)t * 2 * H + tid, epoch);
        if (sum == 12345.0f) cycles[1] = 1;
        return;
    }
    if (tid < H) rH[tid] = 0.0f, rC[tid] = 0.0f;
    float rw[H];
    const bool warp_cell = V & WARP_CELL;
    const int lane = tid & 31, warp = tid >> 5;
    // warp-cell: lane = gate * 8 + unit of the warp's 8; otherwise a thread per row, gate-major
    const int unit = warp_cell ? warp * 8 + (lane & 7) : tid % H;
    const int gate = warp_cell ? lane >> 3 : tid / H;
    const int row = gate * H + unit;
#pragma unroll
    for (int k = 0; k < H; ++k) rw[k] = R[row * H + k];
    unsigned long long rxw[G];
    if (warp_cell) {
        rxw[0] = ll_peek(xw + gate * H + unit);
    } else if (tid < H) {
#pragma unroll
        for (int g = 0; g < G; ++g) rxw[g] = ll_peek(xw + g * H + tid);
    }
    float rc = 0.0f, keep = 0.0f;
    __syncthreads();
    const long long start = clock64();
#pragma unroll 1
    for (int t = 0; t < T; ++t) {
        if ((V & STAGED) && t % CHUNK == 0) {  // the next CHUNK positions' input words, every load in flight
            unsigned long long w[CHUNK];
#pragma unroll
            for (int s = 0; s < CHUNK; ++s) w[s] = ll_peek(xw + (size_t)(t + s) * ROWS + tid);
#pragma unroll
            for (int s = 0; s < CHUNK; ++s) rX[s * ROWS + tid] = ll_take(w[s], xw + (size_t)(t + s) * ROWS + tid, epoch);
            __syncthreads();
        }
        const float* hv = rH + (t & 1) * H;
        float acc;
        if (V & PRODUCTS) {
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
            for (int k = 0; k < H; k += 4) {
                const float4 v = *reinterpret_cast<const float4*>(hv + k);
                a0 += rw[k] * v.x;
                a1 += rw[k + 1] * v.y;
                a2 += rw[k + 2] * v.z;
                a3 += rw[k + 3] * v.w;
            }
            acc = (a0 + a1) + (a2 + a3);
        } else {
            acc = hv[unit] * rw[0];
        }
        if (warp_cell) {
            if (V & STAGED) {
                acc += rX[(t % CHUNK) * ROWS + row];
            } else if (!(V & NO_INPUTS)) {
                acc += ll_take(rxw[0], xw + (size_t)t * ROWS + row, epoch);
                if (t + 1 < T) rxw[0] = ll_peek(xw + (size_t)(t + 1) * ROWS + row);
            }
            const int u = lane & 7;
            const float gi = __shfl_sync(0xffffffffu, acc, u), gf = __shfl_sync(0xffffffffu, acc, u + 8);
            const float gg = __shfl_sync(0xffffffffu, acc, u + 16), go = __shfl_sync(0xffffffffu, acc, u + 24);
            if ((V & ALL_LANES) || gate == 0) {
                float h;
                cell<V>(gi, gf, gg, go, rc, h);
                if (gate == 0) publish<V>(out, rH, t, unit, rc, h, epoch, keep);
            }
            __syncthreads();
        } else {
            rP[tid] = acc;
            __syncthreads();
            if (tid < H) {
                float x[G];
                if (V & STAGED) {
#pragma unroll
                    for (int g = 0; g < G; ++g) x[g] = rX[(t % CHUNK) * ROWS + g * H + tid];
                } else if (V & NO_INPUTS) {
#pragma unroll
                    for (int g = 0; g < G; ++g) x[g] = 0.0f;
                } else {
#pragma unroll
                    for (int g = 0; g < G; ++g) x[g] = ll_take(rxw[g], xw + (size_t)t * ROWS + g * H + tid, epoch);
                    if (t + 1 < T) {
#pragma unroll
                        for (int g = 0; g < G; ++g) rxw[g] = ll_peek(xw + (size_t)(t + 1) * ROWS + g * H + tid);
                    }
                }
                float c = rC[tid], h;
                cell<V>(x[0] + rP[tid], x[1] + rP[H + tid], x[2] + rP[2 * H + tid], x[3] + rP[3 * H + tid], c, h);
                rC[tid] = c;
                publish<V>(out, rH, t, tid, c, h, epoch, keep);
            }
            __syncthreads();
        }
    }
    const long long stop = clock64();
    if (tid == 0) cycles[0] = stop - start;
    if (keep == 12345.0f) cycles[1] = 2;
}

// The input words tagged with a launch's epoch before it (each launch has its own, so the outputs'
// words of the launch before are never current), as the input projection's task would tag them.
__global__ void tag(unsigned long long* xw, int n, unsigned epoch) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        xw[i] = ((unsigned long long)epoch << 32) | (xw[i] & 0xffffffffull);
}

static std::vector<float> reference_h;  // the full loop's h over the window, what the other layouts must give

template <unsigned V>
void run_tagged(const char* name, const float* R, unsigned long long* xw, unsigned long long* out, long long* cycles,
                int grid) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float best_ms = 1e30f;
    long long best_cycles = 1LL << 62;
    for (int rep = 0; rep < 7; ++rep) {
        const unsigned epoch = 2 + rep;
        tag<<<64, 256>>>(xw, T * ROWS, epoch);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaEventRecord(a));
        recur<V><<<grid, NT>>>(R, xw, out, cycles, epoch);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaGetLastError());
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        long long c;
        CHECK(cudaMemcpy(&c, cycles, sizeof c, cudaMemcpyDeviceToHost));
        if (rep > 0 && ms < best_ms) best_ms = ms;
        if (rep > 0 && c < best_cycles) best_cycles = c;
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    printf("%-18s grid %3d: %7.1f cycles a position, launch %7.2f us (%.3f us a position)", name, grid,
           (double)best_cycles / T, best_ms * 1e3, best_ms * 1e3 / T);
    if ((V & (STORES | CELL | PRODUCTS)) == (STORES | CELL | PRODUCTS) && !(V & NO_INPUTS)) {
        std::vector<unsigned long long> words((size_t)T * 2 * H);
        CHECK(cudaMemcpy(words.data(), out, words.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<float> h((size_t)T * H);
        for (int t = 0; t < T; ++t)
            for (int u = 0; u < H; ++u) {
                const unsigned bits = (unsigned)words[(size_t)t * 2 * H + u];
                memcpy(&h[(size_t)t * H + u], &bits, 4);
            }
        if (reference_h.empty()) reference_h = h;
        double worst = 0.0;
        for (size_t i = 0; i < h.size(); ++i) worst = fmax(worst, fabs((double)h[i] - reference_h[i]));
        printf("  h vs full: max |diff| %.2e", worst);
    }
    printf("\n");
}

void go(const float* R, unsigned long long* xw, unsigned long long* out, long long* cycles, int sms) {
    constexpr unsigned FULL = STORES | CELL | PRODUCTS;
    run_tagged<FULL>("full", R, xw, out, cycles, 1);
    run_tagged<CELL | PRODUCTS>("no-stores", R, xw, out, cycles, 1);
    run_tagged<FULL | FAST_TANH>("fast-tanh", R, xw, out, cycles, 1);
    run_tagged<STORES | PRODUCTS>("linear-cell", R, xw, out, cycles, 1);
    run_tagged<STORES | CELL>("no-products", R, xw, out, cycles, 1);
    run_tagged<0u>("barriers", R, xw, out, cycles, 1);
    run_tagged<FULL | WARP_CELL>("warp-cell", R, xw, out, cycles, 1);
    run_tagged<FULL | WARP_CELL | ALL_LANES>("warp-cell-all", R, xw, out, cycles, 1);
    run_tagged<FULL | WARP_CELL | FAST_TANH>("warp-cell-fast", R, xw, out, cycles, 1);
    run_tagged<FULL | POLLERS>("full+pollers", R, xw, out, cycles, sms - 1);
    run_tagged<FULL | WARP_CELL | POLLERS>("warp-cell+pollers", R, xw, out, cycles, sms - 1);
    run_tagged<FULL>("full", R, xw, out, cycles, 1);
    run_tagged<FULL | NO_INPUTS>("full+no-inputs", R, xw, out, cycles, 1);
    run_tagged<NO_INPUTS>("barriers+no-inputs", R, xw, out, cycles, 1);
    run_tagged<FULL | STAGED>("full+staged", R, xw, out, cycles, 1);
    run_tagged<FULL | FAST_TANH | STAGED>("fast-tanh+staged", R, xw, out, cycles, 1);
    run_tagged<FULL | WARP_CELL | STAGED>("warp-cell+staged", R, xw, out, cycles, 1);
    run_tagged<FULL | WARP_CELL | ALL_LANES | STAGED>("warp-cell-all+staged", R, xw, out, cycles, 1);
    run_tagged<FULL | WARP_CELL | NO_INPUTS>("warp-cell+no-inputs", R, xw, out, cycles, 1);
    run_tagged<FULL | STAGED | POLLERS>("full+staged+pollers", R, xw, out, cycles, sms - 1);
}

int main() {
    std::vector<float> R(ROWS * H);
    std::vector<unsigned long long> xw((size_t)T * ROWS);
    srand(1);
    for (auto& v : R) v = (rand() / (float)RAND_MAX - 0.5f) * 0.25f;
    for (auto& w : xw) {
        const float v = (rand() / (float)RAND_MAX - 0.5f);
        unsigned bits;
        memcpy(&bits, &v, 4);
        w = bits;
    }
    float* dR;
    unsigned long long *dx, *dout;
    long long* dc;
    CHECK(cudaMalloc(&dR, R.size() * 4));
    CHECK(cudaMalloc(&dx, xw.size() * 8));
    CHECK(cudaMalloc(&dout, (size_t)T * 2 * H * 8));
    CHECK(cudaMalloc(&dc, 16));
    CHECK(cudaMemcpy(dR, R.data(), R.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dx, xw.data(), xw.size() * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0, (size_t)T * 2 * H * 8));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs; one block of %d threads, LSTM hidden %d, T = %d\n", prop.name, prop.multiProcessorCount, NT, H,
           T);
    go(dR, dx, dout, dc, prop.multiProcessorCount);
    return 0;
}

