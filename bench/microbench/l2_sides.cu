// Whether an L2 hit's latency depends on which SM asks for which line (issue 18: a level's
// transport is ~0.8-1.0 us on the H100, and poll_latency.cu's two-block round trip took ~1,000
// cycles between neighbouring SMs but 1,428 to block 131). The H100's L2 is two partitions; a line
// lives in one of them, and an SM reaching the other partition's lines goes through the crossbar
// between them. If that is what the 428 cycles are, a level's words stored twice (a copy in each
// partition, each reader polling the copy on its own side) would take a far trip off every read.
// This measures whether there are two sides, not that idea. (Session 67, H100: two sides of 66 SMs,
// 274-275 cycles to a line of the own side against 303-306 to the other: ~15 ns a hop at most, not
// worth the copies.)
//
//   For every block (one per SM, thread 0) and every line of a 256 KB buffer: the cycles of one
//   dependent ld.relaxed.gpu (what the step kernel polls with) to that line, the line warmed into
//   L2 first, the mean of REPS loads. Blocks take turns (a grid-wide counter), so no two probe at
//   once; each block asks for over half an SM's shared memory, so each has an SM of its own. Printed: the latency range; the SM x line table's main interaction (its centred form's
//   first singular vector pair, by power iteration) as two classes of SMs and two of lines, with
//   the 2 x 2 table of mean latencies; each line's class for the first 256 lines (the hash's grain);
//   the table itself to argv[1] (float32 [blocks][lines], then the smids as int32).
//
// Build: nvcc -O3 -arch=sm_90 -o l2_sides l2_sides.cu ; run: ./l2_sides [table.bin]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"

constexpr int LINES = 2048;  // 256 KB of 128-byte lines
constexpr int WORDS_A_LINE = 16;
constexpr int REPS = 16;

__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__global__ void probe(const unsigned long long* lines, unsigned* turn, float* table, int* smids) {
    if (threadIdx.x != 0) return;
    const unsigned me = blockIdx.x;
    // the others wait with a long sleep between polls, so the prober's loads meet no traffic
    while (atomicAdd(turn, 0) != me) __nanosleep(2000);
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    smids[me] = (int)id;
    for (int l = 0; l < LINES; ++l) {
        const unsigned long long* p = lines + (size_t)l * WORDS_A_LINE;
        unsigned long long v = load_relaxed(p);  // the line into L2 (every word holds 0)
        const long long start = clock64();
        for (int r = 0; r < REPS; ++r) v = load_relaxed(p + v);  // dependent: the address waits for v
        const long long stop = clock64();
        table[(size_t)me * LINES + l] = (float)(stop - start) / REPS + (float)(v & 1);
    }
    __threadfence();
    atomicAdd(turn, 1);
}

// the first singular vector pair of a centred table, by power iteration
static void leading_pair(const std::vector<double>& c, int rows, int cols, std::vector<double>& u,
                         std::vector<double>& v, double& sigma) {
    u.assign(rows, 1.0);
    v.assign(cols, 0.0);
    for (int r = 0; r < rows; ++r) u[r] = (r % 2) ? 1.0 : -1.0;
    for (int it = 0; it < 200; ++it) {
        for (int j = 0; j < cols; ++j) {
            double s = 0;
            for (int i = 0; i < rows; ++i) s += c[(size_t)i * cols + j] * u[i];
            v[j] = s;
        }
        double n = 0;
        for (double x : v) n += x * x;
        n = std::sqrt(n);
        for (double& x : v) x /= n;
        for (int i = 0; i < rows; ++i) {
            double s = 0;
            for (int j = 0; j < cols; ++j) s += c[(size_t)i * cols + j] * v[j];
            u[i] = s;
        }
        sigma = 0;
        for (double x : u) sigma += x * x;
        sigma = std::sqrt(sigma);
        for (double& x : u) x /= sigma;
    }
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int blocks = prop.multiProcessorCount;
    unsigned long long* lines;
    unsigned* turn;
    float* table;
    int* smids;
    CHECK(cudaMalloc(&lines, sizeof(unsigned long long) * LINES * WORDS_A_LINE));
    CHECK(cudaMemset(lines, 0, sizeof(unsigned long long) * LINES * WORDS_A_LINE));
    CHECK(cudaMalloc(&turn, sizeof(unsigned)));
    CHECK(cudaMemset(turn, 0, sizeof(unsigned)));
    CHECK(cudaMalloc(&table, sizeof(float) * blocks * LINES));
    CHECK(cudaMalloc(&smids, sizeof(int) * blocks));
    // one block an SM: each asks for more than half an SM's shared memory
    const int smem = (int)prop.sharedMemPerMultiprocessor / 2 + 1024;
    CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    probe<<<blocks, 32, smem>>>(lines, turn, table, smids);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> t((size_t)blocks * LINES);
    std::vector<int> sm(blocks);
    CHECK(cudaMemcpy(t.data(), table, sizeof(float) * t.size(), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(sm.data(), smids, sizeof(int) * blocks, cudaMemcpyDeviceToHost));

    std::vector<float> sorted(t);
    std::sort(sorted.begin(), sorted.end());
    auto pct = [&](double q) { return sorted[(size_t)(q * (sorted.size() - 1))]; };
    printf("%s, %d SMs, %d lines: cycles a dependent L2 load, min %.0f p10 %.0f p50 %.0f p90 %.0f max %.0f\n",
           prop.name, blocks, LINES, pct(0), pct(0.1), pct(0.5), pct(0.9), pct(1));

    std::vector<double> rmean(blocks, 0), cmean(LINES, 0), c((size_t)blocks * LINES);
    double all = 0;
    for (int i = 0; i < blocks; ++i)
        for (int j = 0; j < LINES; ++j) {
            const double x = t[(size_t)i * LINES + j];
            rmean[i] += x / LINES;
            cmean[j] += x / blocks;
            all += x / ((double)blocks * LINES);
        }
    double total = 0;
    for (int i = 0; i < blocks; ++i)
        for (int j = 0; j < LINES; ++j) {
            const double x = t[(size_t)i * LINES + j] - rmean[i] - cmean[j] + all;
            c[(size_t)i * LINES + j] = x;
            total += x * x;
        }
    std::vector<double> u, v;
    double sigma = 0;
    leading_pair(c, blocks, LINES, u, v, sigma);
    printf("SM x line interaction: the first pair explains %.1f%% of what the SM and line means do not\n",
           total > 0 ? 100.0 * sigma * sigma / total : 0.0);
    double sum[2][2] = {{0, 0}, {0, 0}};
    long count[2][2] = {{0, 0}, {0, 0}};
    int sms_in[2] = {0, 0}, lines_in[2] = {0, 0};
    for (int i = 0; i < blocks; ++i) sms_in[u[i] > 0]++;
    for (int j = 0; j < LINES; ++j) lines_in[v[j] > 0]++;
    for (int i = 0; i < blocks; ++i)
        for (int j = 0; j < LINES; ++j) {
            sum[u[i] > 0][v[j] > 0] += t[(size_t)i * LINES + j];
            count[u[i] > 0][v[j] > 0]++;
        }
    printf("SM classes %d / %d, line classes %d / %d; mean cycles [SM class][line class]:\n", sms_in[0], sms_in[1],
           lines_in[0], lines_in[1]);
    for (int a = 0; a < 2; ++a)
        printf("  SM class %d: %.0f  %.0f\n", a, count[a][0] ? sum[a][0] / count[a][0] : 0.0,
               count[a][1] ? sum[a][1] / count[a][1] : 0.0);
    printf("SM mean latency: min %.0f max %.0f\n", *std::min_element(rmean.begin(), rmean.end()),
           *std::max_element(rmean.begin(), rmean.end()));
    printf("line classes, lines 0..255: ");
    for (int j = 0; j < 256; ++j) putchar(v[j] > 0 ? '1' : '0');
    printf("\nSM classes by smid: ");
    std::vector<int> by_sm(256, -1);
    for (int i = 0; i < blocks; ++i)
        if (sm[i] >= 0 && sm[i] < 256) by_sm[sm[i]] = u[i] > 0;
    for (int s = 0; s < 256; ++s)
        if (by_sm[s] >= 0) putchar('0' + by_sm[s]);
    printf("\n");
    if (argc > 1) {
        FILE* f = fopen(argv[1], "wb");
        if (!f) {
            fprintf(stderr, "cannot write %s\n", argv[1]);
            return 1;
        }
        fwrite(t.data(), sizeof(float), t.size(), f);
        fwrite(sm.data(), sizeof(int), sm.size(), f);
        fclose(f);
    }
    return 0;
}
