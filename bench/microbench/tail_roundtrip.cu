// Where should a resident step's last level run (issue 18)? A step kernel's head today is a level
// of its own: the 128 blocks of the last layer publish the residual stream y (256 floats, 2 a
// block) as flag-tagged words in L2; 4 head blocks stage all of y, compute LayerNorm + 32
// products and write 32 outputs to mapped host memory. The alternative measured here: those
// blocks write y itself to mapped host memory as tagged words (epoch << 32 | bits, no fence, as
// codegen.TAGGED_OUTPUTS does) and the host, which spins on the answer anyway, computes the head
// (LayerNorm of 256 + 32 x 256 products, plain C++): a level fewer on the GPU, 256 words over
// PCIe instead of 32 and ~8K multiply-adds on the CPU.
//
// Kept as the record of a measured, removed design. H100, session 65
// (bench/h100/2026-12-06-s65/g19/tail_roundtrip.log): p50 3.42 us a trip with the head as a GPU
// level (4 head blocks; 3.45 with 1) against 4.58 with the host computing it (the head alone 0.88
// us on that host). The whole design (the kernel cut before its last level, the head run by
// hostpath.c once a frame was answered) was also timed end to end there, resident p50 0.2-1.2 us
// slower on min_gru, gru, gated_ssm and mamba, and removed from the compiler and the host path.
//
// Every mode: the host stores a 64-word frame (tagged words, write-back mapped memory), block 0
// polls it and relays each word into device memory as it comes (the frame's task), 124 worker
// blocks (248 elements of y) poll the relayed words (a level's staging), then
//   level H   the workers store y into device memory as tagged words; H head blocks (1 or 4) each
//             poll all of y's words, then write 32 / H tagged output words to host memory; the host
//             spins on the 32 words
//   host      the workers write y to host memory as tagged words; the host spins on y's words,
//             then computes LayerNorm + 32 x 256 products (its time is inside the trip and also
//             reported alone)
// The host checks every word it takes (its trip and its value). Host clock (CLOCK_MONOTONIC)
// around the trip, p50 / p90 / p99 over trips, the variants in interleaved rounds.
//
// Build: nvcc -O3 -arch=sm_90 -Xcompiler -march=native -o tail_roundtrip tail_roundtrip.cu ; run: ./tail_roundtrip [trips]
#include <cuda_runtime.h>
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.cuh"
#include "tagged_words.cuh"

// 124 workers (248 elements of y, whole vectors of 8 for the host head): with the frame block and
// 4 head blocks, one block an SM on a 132-SM H100
static const int FRAME = 64, WORKERS = 124, Y = 2 * WORKERS, OUTS = 32;

__host__ __device__ inline float y_value(unsigned i, int e) { return (float)(i % 1024) + 0.5f * (float)e; }

// heads == 0: the host mode (the workers write y to host memory); else `heads` head blocks
__global__ void k_tail(const unsigned long long* frame, unsigned long long* relay, unsigned long long* y_dev,
                       unsigned long long* out_host, int heads, int trips, int* failed) {
    __shared__ int lost;
    __shared__ float staged[Y];
    if (threadIdx.x == 0) lost = 0;
    __syncthreads();
    const int b = blockIdx.x;
    for (int i = 1; i <= trips; ++i) {
        unsigned long long w;
        if (b == 0) {  // the frame's task: poll the host's words, relay each as it comes
            if (threadIdx.x < FRAME) {
                if (!poll_word(frame + threadIdx.x, (unsigned)i, &w)) lost = 1;
                st_volatile(relay + threadIdx.x, w);
            }
        } else if (b <= WORKERS) {  // the last layer: stage the frame, publish 2 elements of y
            if (threadIdx.x < FRAME && !poll_word(relay + threadIdx.x, (unsigned)i, &w)) lost = 1;
            __syncthreads();
            if (threadIdx.x < 2) {
                const int e = 2 * (b - 1) + threadIdx.x;
                const unsigned long long word = ((unsigned long long)i << 32) | __float_as_uint(y_value(i, e));
                st_volatile((heads == 0 ? out_host : y_dev) + e, word);
            }
        } else {  // a head block: stage all of y, write its share of the outputs
            if (threadIdx.x < Y) {
                if (!poll_word(y_dev + threadIdx.x, (unsigned)i, &w)) lost = 1;
                staged[threadIdx.x] = __uint_as_float((unsigned)w);
            }
            __syncthreads();
            const int share = OUTS / heads, h = b - 1 - WORKERS;
            if ((int)threadIdx.x < share) {
                const int o = h * share + threadIdx.x;
                const float v = staged[o];  // y_value(i, o): the host checks it
                st_volatile(out_host + o, ((unsigned long long)i << 32) | __float_as_uint(v));
            }
        }
        __syncthreads();
        if (lost) break;
    }
    if (threadIdx.x == 0 && lost) *failed = 1;
}

static inline int64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// the head on the host: LayerNorm of y, then 32 products of y's length, taken along the outputs
// (W stored [element][output]) in GCC vectors of 8, the LayerNorm's sums in 8 lanes (as
// compiler/cstep.py's step functions are written: no reassociation asked of the compiler)
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));  // a load from any float
static float host_head(const float* y, const float* gamma, const float* beta, const float* Wt, float* out) {
    static_assert(Y % 8 == 0 && OUTS % 8 == 0, "whole vectors");
    v8 lanes = {};
    for (int e = 0; e < Y; e += 8) lanes += *(const v8*)(y + e);
    float mean = 0.f;
    for (int k = 0; k < 8; ++k) mean += lanes[k];
    mean /= Y;
    v8 sq = {};
    for (int e = 0; e < Y; e += 8) {
        const v8 d = *(const v8*)(y + e) - mean;
        sq += d * d;
    }
    float var = 0.f;
    for (int k = 0; k < 8; ++k) var += sq[k];
    const float r = 1.f / std::sqrt(var / Y + 1e-5f);
    v8 acc[OUTS / 8] = {};
    for (int e = 0; e < Y; ++e) {
        const float n = (y[e] - mean) * r * gamma[e] + beta[e];
        for (int o = 0; o < OUTS / 8; ++o) acc[o] += *(const v8u*)(Wt + e * OUTS + 8 * o) * n;
    }
    float check = 0.f;
    for (int o = 0; o < OUTS / 8; ++o)
        for (int k = 0; k < 8; ++k) out[8 * o + k] = acc[o][k], check += acc[o][k];
    return check;
}

struct Host {
    volatile unsigned long long* frame;
    volatile unsigned long long* out;
    std::vector<float> gamma, beta, W;  // W: [element][output]
    float sink = 0.f;
};

// one round of `trips` trips (heads == 0: the host mode); times appended to `times` (ns), the
// host's head alone to `head_times`; the first tenth left out (warm-up)
static bool round_trips(Host& h, const unsigned long long* frame_dev, unsigned long long* relay_dev,
                        unsigned long long* y_dev, unsigned long long* out_dev, int heads, int trips, int* failed_dev,
                        cudaStream_t stream, std::vector<double>& times, std::vector<double>& head_times) {
    for (int w = 0; w < FRAME; ++w) h.frame[w] = 0;
    for (int w = 0; w < Y; ++w) h.out[w] = 0;
    _mm_sfence();
    CHECK(cudaMemsetAsync(relay_dev, 0, FRAME * 8, stream));
    CHECK(cudaMemsetAsync(y_dev, 0, Y * 8, stream));
    CHECK(cudaStreamSynchronize(stream));
    const int blocks = 1 + WORKERS + heads;
    k_tail<<<blocks, 256, 0, stream>>>(frame_dev, relay_dev, y_dev, out_dev, heads, trips, failed_dev);
    CHECK(cudaGetLastError());
    const int words = heads == 0 ? Y : OUTS;
    alignas(64) float y[Y];
    alignas(64) float out[OUTS];
    for (int i = 1; i <= trips; ++i) {
        const unsigned long long tag = (unsigned long long)i << 32;
        const int64_t start = now_ns();
        for (int w = 0; w < FRAME; ++w) h.frame[w] = tag | (unsigned)w;
        unsigned long long spins = 0;
        for (int w = 0; w < words; ++w) {
            unsigned long long v;
            while (((v = h.out[w]) >> 32) != (unsigned long long)i) {
                if (++spins > (1ull << 32)) {
                    fprintf(stderr, "heads %d: trip %d word %d lost\n", heads, i, w);
                    return false;
                }
            }
            const unsigned bits = (unsigned)v;
            memcpy(&y[w], &bits, 4);
            if (y[w] != y_value((unsigned)i, w)) {
                fprintf(stderr, "heads %d: trip %d word %d holds %g\n", heads, i, w, y[w]);
                return false;
            }
        }
        int64_t head_ns = 0;
        if (heads == 0) {
            const int64_t t = now_ns();
            h.sink += host_head(y, h.gamma.data(), h.beta.data(), h.W.data(), out);
            head_ns = now_ns() - t;
        }
        const int64_t end = now_ns();
        if (i > trips / 10) {
            times.push_back((double)(end - start));
            if (heads == 0) head_times.push_back((double)head_ns);
        }
    }
    CHECK(cudaStreamSynchronize(stream));
    return true;
}

static void report(const char* name, std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    printf("%-22s trips %7zu  p50 %7.0f ns  p90 %7.0f  p99 %7.0f  min %6.0f\n", name, n, v[n / 2], v[n * 9 / 10],
           v[n * 99 / 100], v[0]);
}

int main(int argc, char** argv) {
    const int trips = argc > 1 ? atoi(argv[1]) : 20000;
    const int rounds = 5;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.multiProcessorCount < 1 + WORKERS + 4) {
        fprintf(stderr, "%s has %d SMs: the modes need %d blocks resident at once\n", prop.name,
                prop.multiProcessorCount, 1 + WORKERS + 4);
        return 2;
    }
    printf("%s, %d trips a round, %d rounds, variants interleaved\n", prop.name, trips, rounds);
    Host h;
    unsigned long long *frame_dev, *out_dev, *relay_dev, *y_dev;
    void* p = nullptr;
    CHECK(cudaHostAlloc(&p, FRAME * 8, cudaHostAllocMapped | cudaHostAllocPortable));
    h.frame = (volatile unsigned long long*)p;
    CHECK(cudaHostGetDevicePointer((void**)&frame_dev, p, 0));
    CHECK(cudaHostAlloc(&p, Y * 8, cudaHostAllocMapped | cudaHostAllocPortable));
    h.out = (volatile unsigned long long*)p;
    CHECK(cudaHostGetDevicePointer((void**)&out_dev, p, 0));
    CHECK(cudaMalloc(&relay_dev, FRAME * 8));
    CHECK(cudaMalloc(&y_dev, Y * 8));
    int* failed_dev = nullptr;
    CHECK(cudaMalloc(&failed_dev, 4));
    CHECK(cudaMemset(failed_dev, 0, 4));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    srand(1);
    for (int e = 0; e < Y; ++e) {
        h.gamma.push_back(1.f + 0.01f * (float)(rand() % 100));
        h.beta.push_back(0.01f * (float)(rand() % 100));
    }
    for (int k = 0; k < OUTS * Y; ++k) h.W.push_back(((float)(rand() % 2001) - 1000.f) * 1e-4f);

    const int variants[] = {4, 1, 0};  // heads; 0: the host computes the head
    const char* names[] = {"level, 4 head blocks", "level, 1 head block", "host head"};
    std::vector<double> times[3], head_times[3];
    for (int r = 0; r < rounds; ++r)
        for (int j = 0; j < 3; ++j) {
            const int v = (j + r) % 3;
            if (!round_trips(h, frame_dev, relay_dev, y_dev, out_dev, variants[v], trips, failed_dev, stream, times[v],
                             head_times[v]))
                return 2;
        }
    int failed = 0;
    CHECK(cudaMemcpy(&failed, failed_dev, 4, cudaMemcpyDeviceToHost));
    if (failed) {
        fprintf(stderr, "a block lost a word\n");
        return 2;
    }
    for (int v = 0; v < 3; ++v) report(names[v], times[v]);
    report("host head alone", head_times[2]);
    printf("(checksum %g)\n", (double)h.sink);
    return 0;
}
