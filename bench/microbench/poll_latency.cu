// What a flag-tagged word's trip between two blocks costs, by load and store kind (issues 17 and
// 18: the step kernel's per-level transport is 0.8-1.0 us on the H100 where an L2 hit is quoted at
// ~260 cycles, and one LSTM position with its products and cell stripped, bench/microbench/
// recur_position.cu, still took ~644 cycles for one ld.relaxed.gpu issued a position ahead).
//
//   chase   one thread, N dependent loads over a 4 MB random cycle (L2-resident after the first
//           pass, past L1): cycles a load, by kind
//   pingpong  two blocks of one thread on different SMs: block 0 stores word A (epoch i), block 1
//           polls A until it holds i, stores word B (i), block 0 polls B; cycles a round trip (two
//           one-way trips, each a store's travel and a poll that sees it), by load and store kind
//
// Load kinds: ld.relaxed.gpu (what runtime.cuh's ffk_ll_wait / ffk_ll_peek use), ld.volatile,
// ld.acquire.gpu, ld.global.cg (weak, cached at L2 only; ptxas 13 for sm_90 emits the same
// LDG.E.STRONG.GPU as relaxed.gpu for it), and for the chase only ld.global (weak, L1) and
// ld.global.nc (the read-only path): a poll through L1 may never see another SM's store, but a
// word loaded ahead and checked by its tag (a stale one has an old epoch) could come that way.
// Store kinds: st.relaxed.gpu (ffk_ll_store), st.volatile, st.global.cg. Weak accesses carry no
// ordering or single-copy-atomicity promise in the PTX memory model: this measures what they
// would save. (Session 57, H100: the pingpong rows polling with ld.global.cg read 46 cycles a round
// trip. They are not one: ptxas 13 drops a spin on a weak load, the PTX's loop having no load left
// in the SASS, so those blocks never wait. A weak load cannot poll; its chase rows stand.)
//
// Build: nvcc -O3 -arch=sm_90 -o poll_latency poll_latency.cu ; run: ./poll_latency
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "check.cuh"

enum Load { RELAXED_GPU, VOLATILE, ACQUIRE_GPU, CG, WEAK, NC, LOADS };
enum Store { ST_RELAXED_GPU, ST_VOLATILE, ST_CG, STORES };
static const char* load_names[LOADS] = {"ld.relaxed.gpu", "ld.volatile", "ld.acquire.gpu",
                                        "ld.global.cg",   "ld.global",   "ld.global.nc"};
static const char* store_names[STORES] = {"st.relaxed.gpu", "st.volatile", "st.global.cg"};

template <int L>
__device__ __forceinline__ unsigned long long load(const unsigned long long* p) {
    unsigned long long v;
    if (L == RELAXED_GPU) asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    if (L == VOLATILE) asm volatile("ld.volatile.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    if (L == ACQUIRE_GPU) asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    if (L == CG) asm volatile("ld.global.cg.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    if (L == WEAK) asm volatile("ld.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    if (L == NC) asm volatile("ld.global.nc.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
template <int S>
__device__ __forceinline__ void store(unsigned long long* p, unsigned long long v) {
    if (S == ST_RELAXED_GPU) asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    if (S == ST_VOLATILE) asm volatile("st.volatile.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    if (S == ST_CG) asm volatile("st.global.cg.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

template <int L>
__global__ void chase(const unsigned long long* next, int steps, long long* out) {
    unsigned long long i = 0;
    for (int s = 0; s < 1024; ++s) i = load<L>(next + i);  // warm: the cycle's start into L2
    const long long start = clock64();
    for (int s = 0; s < steps; ++s) i = load<L>(next + i);
    const long long stop = clock64();
    out[0] = stop - start;
    out[1] = (long long)i;
}

__device__ __forceinline__ unsigned smid() {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}

template <int L, int S>
__global__ void pingpong(unsigned long long* a, unsigned long long* b, int rounds, unsigned base, long long* out,
                         int partner) {
    if (threadIdx.x != 0 || (blockIdx.x != 0 && blockIdx.x != (unsigned)partner)) return;
    if (blockIdx.x == 0) {
        long long start = 0;
        for (int r = 0; r < rounds; ++r) {
            if (r == 16) start = clock64();  // 16 rounds to warm the lines
            const unsigned long long tag = (unsigned long long)(base + r) << 32;
            store<S>(a, tag | r);
            while ((load<L>(b) >> 32) != base + r) {
            }
        }
        out[0] = clock64() - start;
        out[2] = smid();
    } else {
        for (int r = 0; r < rounds; ++r) {
            while ((load<L>(a) >> 32) != base + r) {
            }
            store<S>(b, ((unsigned long long)(base + r) << 32) | r);
        }
        out[3] = smid();
    }
}

template <int L>
void run_chase(const unsigned long long* next, long long* out, int steps) {
    long long best = 1LL << 62;
    for (int rep = 0; rep < 3; ++rep) {
        chase<L><<<1, 1>>>(next, steps, out);
        CHECK(cudaDeviceSynchronize());
        long long c[2];
        CHECK(cudaMemcpy(c, out, sizeof c, cudaMemcpyDeviceToHost));
        if (c[0] < best) best = c[0];
    }
    printf("chase     %-16s %7.1f cycles a load\n", load_names[L], (double)best / steps);
}

static unsigned epoch_base = 1;

template <int L, int S>
void run_pingpong(unsigned long long* a, unsigned long long* b, long long* out, int partner, int sms) {
    const int rounds = 4096;
    long long best = 1LL << 62, where[4] = {0, 0, 0, 0};
    for (int rep = 0; rep < 3; ++rep) {
        pingpong<L, S><<<sms, 32>>>(a, b, rounds, epoch_base, out, partner);
        epoch_base += rounds;
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(where, out, sizeof where, cudaMemcpyDeviceToHost));
        if (where[0] < best) best = where[0];
    }
    printf("pingpong  %-16s %-16s block %3d (SM %3lld <-> SM %3lld): %7.1f cycles a round trip\n", load_names[L],
           store_names[S], partner, where[2], where[3], (double)best / (rounds - 16));
}

template <int L>
void pingpong_stores(unsigned long long* a, unsigned long long* b, long long* out, int partner, int sms) {
    run_pingpong<L, ST_RELAXED_GPU>(a, b, out, partner, sms);
    run_pingpong<L, ST_VOLATILE>(a, b, out, partner, sms);
    run_pingpong<L, ST_CG>(a, b, out, partner, sms);
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    printf("%s, %d SMs, clock %d kHz\n", prop.name, prop.multiProcessorCount, clock_khz);
    const int n = 1 << 19;  // 4 MB of 8-byte words: past L1 (256 KB), within L2
    std::vector<unsigned long long> next(n);
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    srand(7);
    for (int i = n - 1; i > 0; --i) std::swap(order[i], order[rand() % (i + 1)]);
    for (int i = 0; i < n; ++i) next[order[i]] = order[(i + 1) % n];
    unsigned long long *dnext, *words;
    long long* out;
    CHECK(cudaMalloc(&dnext, n * 8));
    CHECK(cudaMemcpy(dnext, next.data(), n * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&words, 4096));
    CHECK(cudaMemset(words, 0, 4096));
    CHECK(cudaMalloc(&out, 64));
    const int steps = 20000;
    run_chase<RELAXED_GPU>(dnext, out, steps);
    run_chase<VOLATILE>(dnext, out, steps);
    run_chase<ACQUIRE_GPU>(dnext, out, steps);
    run_chase<CG>(dnext, out, steps);
    run_chase<WEAK>(dnext, out, steps);
    run_chase<NC>(dnext, out, steps);
    unsigned long long *a = words, *b = words + 256;  // different 2 KB halves: different lines
    const int sms = prop.multiProcessorCount;
    for (int partner : {1, sms / 2, sms - 1}) {
        pingpong_stores<RELAXED_GPU>(a, b, out, partner, sms);
        pingpong_stores<VOLATILE>(a, b, out, partner, sms);
        pingpong_stores<ACQUIRE_GPU>(a, b, out, partner, sms);
        pingpong_stores<CG>(a, b, out, partner, sms);
    }
    run_chase<RELAXED_GPU>(dnext, out, steps);
    return 0;
}
