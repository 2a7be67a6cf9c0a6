// The host <-> resident-kernel round trip over pinned, mapped host memory, by the kind of memory
// the GPU polls (issue 18: a resident step's floor is ~5.5 us p50 on the H100, the round trip with
// nothing computed; the step compiler's levels are what is left of the 10 us target).
//
// Session.step(resident=True) writes the frame as flag-tagged words (epoch << 32 | the float's
// bits) into memory from cuMemHostAlloc(DEVICEMAP | PORTABLE): write-back memory, so the host's
// stores sit in its own caches and every read the GPU makes over PCIe is snooped there. Memory
// allocated write-combined (CU_MEMHOSTALLOC_WRITECOMBINED) is not cached by the CPU: its stores
// leave through the write-combining buffers (an sfence sends them), and the GPU's reads of it need
// no snoop. NVIDIA's guide quotes such memory as faster to read across PCIe; what it does to the
// latency of one poll is what this measures. The host must never read such memory (uncached
// reads): the frame words and the bell are the host's to write and the GPU's to read, so they
// could be; the done words the host spins on stay write-back.
//
//   word   the host stores i into one word; one GPU thread polls it (ld.volatile, as the resident
//          kernel's ffk_poll_frame) and stores i into the reply word (write-back memory, as the
//          done words); the host spins on the reply. Host clock (CLOCK_MONOTONIC) around the trip.
//   frame  as word, but the host stores F tagged words (a frame of F floats: 256 at embed 256),
//          a block of F threads polls one word each until it carries the epoch, __syncthreads,
//          thread 0 replies.
//   frame+out  as frame, and each thread writes one float of output into mapped (write-back)
//          memory before the barrier; the reply after __threadfence_system (a step's outputs).
//   fan    N blocks (1, 8, 32, 132) that each need the whole frame, and the last of them to finish
//          replies (a device counter, as a level's last block): "direct", every block polls the
//          host's words itself; "relay", block 0 polls them and stores each word, as it comes,
//          into device memory (L2), which the other blocks poll. Relay is what a resident step
//          kernel does today (the frame's task publishes the frame, a level later the others read
//          it); direct is the level it would save, if N blocks polling host memory at once do
//          not wait on one another across PCIe. Write-back memory, the host stores plain; and
//          (session 61) write-combined memory, an sfence after the stores: session 61's run on
//          write-back memory had direct polling from 8 blocks at 18 us a trip, 132 blocks at
//          579 us; if that is the host's stores waiting on lines the GPU's reads keep snooping,
//          write-combined memory (not cached by the CPU, no snoop) would not queue.
//   out fenced N / out tagged N  a zoo model's frame (64 words) in, N outputs back (32: the zoo's
//          out_features; 256). Fenced, as the step kernel answers today: N floats into mapped
//          memory, a barrier, thread 0's __threadfence_system, the reply word (codegen._done).
//          Tagged: N words (i << 32) | the float's bits, as the frames come in, no fence and no
//          reply: the host spins until every output word carries the trip. frame+out's 1.3 us over
//          frame (session 61) is the fence's or the outputs'; if the fence's, tagged outputs take
//          it off every step (issue 18). Session 61.
//   spread K  a zoo model's frame (64 words: in_features 64) polled by a block of 256 threads,
//          K warps a word (K = 1, 2, 4), warp j's first poll ~RTT * j / K after the others' (a
//          poll's read across PCIe is a round trip of its own, ~1.25 us: `read` below, so one
//          poller a word sees it up to a round trip after it landed, ~0.6 us on average; K
//          staggered pollers within ~RTT / K, if the reads of one line do not queue behind one
//          another, which the fan rows' direct polling says they can). The first poller to see a
//          word counts it in shared memory; thread 0 replies once every word is counted, without
//          waiting for the other pollers' reads in flight (a resident kernel's frame block could
//          leave those warps behind the same way). Session 61 (issue 18).
//   read   one GPU thread, 256 dependent loads (ld.volatile) through a pointer chain in the memory:
//          cycles a load (clock64), write-back / write-combined mapped memory and device memory.
//
// Variants of the polled memory, in interleaved rounds in one process: wb (write-back, the host
// stores plain, as hostpath.c does), wb+sfence (the same, an sfence after the stores), wc
// (write-combined, an sfence after the stores).
//
// Build: nvcc -O3 -arch=sm_90 -o host_roundtrip host_roundtrip.cu ; run: ./host_roundtrip [trips]
#include <cuda_runtime.h>
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.cuh"
#include "tagged_words.cuh"

// word and frame: `trips` trips; trip i's words carry i in their high half; *failed set on a lost word.
// out (frame+out): each polling thread also writes a float of output into mapped memory, and the
// reply follows a system-scope fence, as a step kernel's outputs and done word
__global__ void k_echo(const unsigned long long* in, unsigned long long* reply, float* out, int words, int trips,
                       int* failed) {
    __shared__ int lost;
    if (threadIdx.x == 0) lost = 0;
    __syncthreads();
    for (int i = 1; i <= trips; ++i) {
        unsigned long long w;
        if ((int)threadIdx.x < words && !poll_word(in + threadIdx.x, (unsigned)i, &w)) lost = 1;
        if (out != nullptr && (int)threadIdx.x < words) out[threadIdx.x] = (float)i;
        __syncthreads();
        if (lost) break;
        if (threadIdx.x == 0) {
            if (out != nullptr) __threadfence_system();
            st_volatile(reply, (unsigned long long)i);
        }
    }
    if (threadIdx.x == 0 && lost) *failed = 1;
}

// out fenced / tagged: `words` frame words polled by as many threads, `outs` outputs written by
// threads < outs, fenced (floats, barrier, system fence, reply) or tagged (64-bit words, nothing else)
__global__ void k_echo_out(const unsigned long long* in, unsigned long long* reply, float* out,
                           unsigned long long* tagged_out, int words, int outs, int trips, int* failed) {
    __shared__ int lost;
    if (threadIdx.x == 0) lost = 0;
    __syncthreads();
    for (int i = 1; i <= trips; ++i) {
        unsigned long long w;
        if ((int)threadIdx.x < words && !poll_word(in + threadIdx.x, (unsigned)i, &w)) lost = 1;
        __syncthreads();  // the frame is in: every output depends on all of it
        if (lost) break;
        const float value = (float)i + 0.5f * (float)threadIdx.x;
        if (tagged_out != nullptr) {
            if ((int)threadIdx.x < outs)
                st_volatile(tagged_out + threadIdx.x, ((unsigned long long)i << 32) | __float_as_uint(value));
        } else {
            if ((int)threadIdx.x < outs) out[threadIdx.x] = value;
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence_system();
                st_volatile(reply, (unsigned long long)i);
            }
        }
    }
    if (threadIdx.x == 0 && lost) *failed = 1;
}

// spread K: `words` words, `per_word` warps a word (blockDim.x >= words * per_word); a poller
// leaves its loop when its word is counted (by it or another), thread 0 replies when all are
__global__ void k_echo_spread(const unsigned long long* in, unsigned long long* reply, int words, int per_word,
                              int trips, unsigned gap_ns, int* failed) {
    __shared__ unsigned seen[1024];  // per word: the last trip it was counted in
    __shared__ unsigned counted;     // words counted over every trip so far
    __shared__ int lost;
    for (int w = threadIdx.x; w < words; w += blockDim.x) seen[w] = 0;
    if (threadIdx.x == 0) counted = 0, lost = 0;
    __syncthreads();
    const int w = threadIdx.x % words, j = threadIdx.x / words;
    const bool poller = j < per_word;
    volatile unsigned* seen_v = seen;
    for (int i = 1; i <= trips; ++i) {
        if (poller) {
            if (j > 0) __nanosleep(gap_ns * j);
            unsigned long long polls = 0;
            while (seen_v[w] < (unsigned)i) {
                const unsigned long long v = ld_volatile(in + w);
                if ((unsigned)(v >> 32) == (unsigned)i) {
                    if (atomicMax(&seen[w], (unsigned)i) < (unsigned)i) atomicAdd(&counted, 1u);
                    break;
                }
                if (++polls > POLL_LIMIT) {
                    lost = 1;
                    break;
                }
            }
        }
        if (threadIdx.x == 0) {
            while (*(volatile unsigned*)&counted < (unsigned)(i * words) && !*(volatile int*)&lost) {
            }
            if (lost) break;
            st_volatile(reply, (unsigned long long)i);
        }
        if (*(volatile int*)&lost) break;
    }
    if (threadIdx.x == 0 && lost) *failed = 1;
}

// fan: every block needs the frame (see the header); `arrived` counts the blocks through each trip
// (trip i is done at i * gridDim.x), the block that completes it replies
__global__ void k_fan(const unsigned long long* in, unsigned long long* relay, unsigned int* arrived,
                      unsigned long long* reply, int words, int trips, int direct, int* failed) {
    __shared__ int lost;
    if (threadIdx.x == 0) lost = 0;
    __syncthreads();
    const bool from_host = direct || blockIdx.x == 0;
    for (int i = 1; i <= trips; ++i) {
        if ((int)threadIdx.x < words) {
            unsigned long long w;
            if (!poll_word((from_host ? in : relay) + threadIdx.x, (unsigned)i, &w)) lost = 1;
            // one 64-bit word holds the tag and the value: relayed as it came, no fence between
            if (!direct && blockIdx.x == 0) st_volatile(relay + threadIdx.x, w);
        }
        __syncthreads();
        if (lost) break;
        if (threadIdx.x == 0) {
            __threadfence();
            const unsigned int before = atomicAdd(arrived, 1u);
            if (before + 1 == (unsigned)i * gridDim.x) st_volatile(reply, (unsigned long long)i);
        }
    }
    if (threadIdx.x == 0 && lost) *failed = 1;
}

// read: cycles a dependent load through next[] (a cycle over `n` words, word = index of the next)
__global__ void k_chase(const unsigned long long* next, int n, int loads, unsigned long long* cycles) {
    unsigned long long p = 0;
    for (int i = 0; i < n; ++i) p = ld_volatile(next + p);  // once round: a warm TLB
    const long long start = clock64();
    for (int i = 0; i < loads; ++i) p = ld_volatile(next + p);
    const long long end = clock64();
    cycles[0] = (unsigned long long)(end - start);
    cycles[1] = p;  // keeps the chain
}

static inline int64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

enum Kind { WB, WB_SFENCE, WC, KINDS };
static const char* kind_names[KINDS] = {"wb", "wb+sfence", "wc"};

struct Buffers {
    unsigned long long* in[KINDS];  // host pointers; WB and WB_SFENCE share one allocation
    unsigned long long* in_dev[KINDS];
    unsigned long long* reply;
    unsigned long long* reply_dev;
    float* out_dev;  // frame+out: the outputs, write-back mapped memory
};

// the host's side of a round, the kernel launched: trip i stores the words tagged i (an sfence
// after them where `fence`), spins on the reply, or with `tagged` on each of its `outs` words until
// it carries trip i (and checks its value, k_echo_out's); the trips' times appended to `out` (ns),
// the first tenth left out (they warm up)
static bool host_trips(volatile unsigned long long* in, volatile unsigned long long* reply, int words, bool fence,
                       int trips, const char* what, cudaStream_t stream, std::vector<double>& out,
                       volatile unsigned long long* tagged = nullptr, int outs = 0) {
    for (int i = 1; i <= trips; ++i) {
        const unsigned long long tag = (unsigned long long)i << 32;
        const int64_t start = now_ns();
        for (int w = 0; w < words; ++w) in[w] = tag | (unsigned)w;
        if (fence) _mm_sfence();
        unsigned long long spins = 0;
        for (int w = 0; w < (tagged ? outs : 1); ++w) {
            unsigned long long v;
            while (tagged ? ((v = tagged[w]) >> 32) != (unsigned long long)i : *reply != (unsigned long long)i) {
                if (++spins > (1ull << 32)) {
                    fprintf(stderr, "%s: trip %d lost\n", what, i);
                    return false;
                }
            }
            if (tagged) {
                float f;
                const unsigned bits = (unsigned)v;
                memcpy(&f, &bits, 4);
                if (f != (float)i + 0.5f * (float)w) {
                    fprintf(stderr, "%s: trip %d word %d holds %g\n", what, i, w, f);
                    return false;
                }
            }
        }
        const int64_t end = now_ns();
        if (i > trips / 10) out.push_back((double)(end - start));
    }
    CHECK(cudaStreamSynchronize(stream));
    return true;
}

// one round of `trips` trips of `words` words; the host's round-trip times appended to `out` (ns)
static bool round_trip(Buffers& b, Kind kind, int words, bool outputs, int trips, int* failed_dev,
                       cudaStream_t stream, std::vector<double>& out) {
    volatile unsigned long long* in = b.in[kind];
    for (int w = 0; w < words; ++w) in[w] = 0;
    *b.reply = 0;
    _mm_sfence();
    k_echo<<<1, std::max(words, 32), 0, stream>>>(b.in_dev[kind], b.reply_dev, outputs ? b.out_dev : nullptr,
                                                   words, trips, failed_dev);
    CHECK(cudaGetLastError());
    return host_trips(in, b.reply, words, kind != WB, trips, kind_names[kind], stream, out);
}

// one round of the fan mode: `blocks` blocks, direct or relayed; times appended to `out` (ns)
static bool fan_trip(Buffers& b, Kind kind, int blocks, bool direct, int words, int trips,
                     unsigned long long* relay_dev, unsigned int* arrived_dev, int* failed_dev, cudaStream_t stream,
                     std::vector<double>& out) {
    volatile unsigned long long* in = b.in[kind];
    for (int w = 0; w < words; ++w) in[w] = 0;
    *b.reply = 0;
    _mm_sfence();
    CHECK(cudaMemsetAsync(relay_dev, 0, words * 8, stream));
    CHECK(cudaMemsetAsync(arrived_dev, 0, 4, stream));
    k_fan<<<blocks, std::max(words, 32), 0, stream>>>(b.in_dev[kind], relay_dev, arrived_dev, b.reply_dev, words,
                                                      trips, direct ? 1 : 0, failed_dev);
    CHECK(cudaGetLastError());
    return host_trips(in, b.reply, words, kind != WB, trips, direct ? "fan direct" : "fan relay", stream, out);
}

// one round of the out mode: `outs` outputs, fenced or tagged; times appended to `out` (ns)
static bool out_trip(Buffers& b, bool tagged, int outs, int trips, unsigned long long* tagged_host,
                     unsigned long long* tagged_dev, int* failed_dev, cudaStream_t stream, std::vector<double>& out) {
    const int words = 64;
    volatile unsigned long long* in = b.in[WB];
    volatile unsigned long long* tout = tagged_host;
    for (int w = 0; w < words; ++w) in[w] = 0;
    for (int w = 0; w < outs; ++w) tout[w] = 0;
    *b.reply = 0;
    _mm_sfence();
    k_echo_out<<<1, 256, 0, stream>>>(b.in_dev[WB], b.reply_dev, b.out_dev, tagged ? tagged_dev : nullptr, words,
                                      outs, trips, failed_dev);
    CHECK(cudaGetLastError());
    return host_trips(in, b.reply, words, false, trips, tagged ? "out tagged" : "out fenced", stream, out,
                      tagged ? tout : nullptr, outs);
}

// one round of the spread-K mode; times appended to `out` (ns)
static bool spread_trip(Buffers& b, Kind kind, int per_word, int words, int trips, int* failed_dev,
                        cudaStream_t stream, std::vector<double>& out) {
    volatile unsigned long long* in = b.in[kind];
    for (int w = 0; w < words; ++w) in[w] = 0;
    *b.reply = 0;
    _mm_sfence();
    const unsigned gap = 1250u / (unsigned)per_word;  // a read of host memory: ~2,465 cycles at ~1.98 GHz
    k_echo_spread<<<1, 256, 0, stream>>>(b.in_dev[kind], b.reply_dev, words, per_word, trips, gap, failed_dev);
    CHECK(cudaGetLastError());
    return host_trips(in, b.reply, words, kind != WB, trips, "spread", stream, out);
}

static void report(const char* mode, const char* name, std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    printf("%-9s %-10s trips %7zu  p50 %7.0f ns  p90 %7.0f  p99 %7.0f  min %6.0f\n", mode, name, n, v[n / 2],
           v[n * 9 / 10], v[n * 99 / 100], v[0]);
}

int main(int argc, char** argv) {
    const int trips = argc > 1 ? atoi(argv[1]) : 20000;
    const int rounds = 5;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d trips a round, %d rounds, variants interleaved\n", prop.name, trips, rounds);
    // (no cudaSetDeviceFlags(cudaDeviceMapHost): with unified addressing every pinned allocation
    // is mapped, and setting flags on an active context fails)

    const int F = 256;
    Buffers b{};
    void* p = nullptr;
    CHECK(cudaHostAlloc(&p, F * 8, cudaHostAllocMapped | cudaHostAllocPortable));
    b.in[WB] = b.in[WB_SFENCE] = (unsigned long long*)p;
    CHECK(cudaHostAlloc(&p, F * 8, cudaHostAllocMapped | cudaHostAllocPortable | cudaHostAllocWriteCombined));
    b.in[WC] = (unsigned long long*)p;
    CHECK(cudaHostAlloc(&p, 64, cudaHostAllocMapped | cudaHostAllocPortable));
    b.reply = (unsigned long long*)p;
    for (int k = 0; k < KINDS; ++k) CHECK(cudaHostGetDevicePointer((void**)&b.in_dev[k], b.in[k], 0));
    CHECK(cudaHostGetDevicePointer((void**)&b.reply_dev, b.reply, 0));
    CHECK(cudaHostAlloc(&p, F * 4, cudaHostAllocMapped | cudaHostAllocPortable));
    CHECK(cudaHostGetDevicePointer((void**)&b.out_dev, p, 0));
    int* failed_dev = nullptr;
    CHECK(cudaMalloc(&failed_dev, 4));
    CHECK(cudaMemset(failed_dev, 0, 4));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    struct Mode {
        const char* name;
        int words;
        bool outputs;
    } modes[] = {{"word", 1, false}, {"frame", F, false}, {"frame+out", F, true}};
    for (const Mode& m : modes) {
        std::vector<double> times[KINDS];
        for (int r = 0; r < rounds; ++r)
            for (int j = 0; j < KINDS; ++j) {
                const Kind k = (Kind)((j + r) % KINDS);  // the order rotated each round
                if (!round_trip(b, k, m.words, m.outputs, trips, failed_dev, stream, times[k])) return 2;
            }
        int failed = 0;
        CHECK(cudaMemcpy(&failed, failed_dev, 4, cudaMemcpyDeviceToHost));
        if (failed) {
            fprintf(stderr, "%s: the kernel lost a word\n", m.name);
            return 2;
        }
        for (int k = 0; k < KINDS; ++k) report(m.name, kind_names[k], times[k]);
    }

    // out: a 64-word frame in, 32 or 256 outputs back, fenced or tagged
    {
        unsigned long long *tagged_host = nullptr, *tagged_dev = nullptr;
        CHECK(cudaHostAlloc((void**)&tagged_host, F * 8, cudaHostAllocMapped | cudaHostAllocPortable));
        CHECK(cudaHostGetDevicePointer((void**)&tagged_dev, tagged_host, 0));
        const int counts[] = {32, F};
        for (int outs : counts) {
            std::vector<double> times[2];  // fenced, tagged
            for (int r = 0; r < rounds; ++r)
                for (int j = 0; j < 2; ++j) {
                    const int v = (j + r) % 2;
                    if (!out_trip(b, v == 1, outs, trips, tagged_host, tagged_dev, failed_dev, stream, times[v]))
                        return 2;
                }
            int failed = 0;
            CHECK(cudaMemcpy(&failed, failed_dev, 4, cudaMemcpyDeviceToHost));
            if (failed) {
                fprintf(stderr, "out %d: the kernel lost a word\n", outs);
                return 2;
            }
            char mode[32];
            snprintf(mode, sizeof mode, "out %d", outs);
            report(mode, "fenced", times[0]);
            report(mode, "tagged", times[1]);
        }
    }

    // spread K: a 64-word frame, K warps a word (write-back and write-combined memory)
    {
        const int ks[] = {1, 2, 4};
        const Kind kinds[] = {WB, WC};
        for (int k : ks) {
            std::vector<double> times[2];
            for (int r = 0; r < rounds; ++r)
                for (int j = 0; j < 2; ++j) {
                    const int v = (j + r) % 2;
                    if (!spread_trip(b, kinds[v], k, 64, trips, failed_dev, stream, times[v])) return 2;
                }
            int failed = 0;
            CHECK(cudaMemcpy(&failed, failed_dev, 4, cudaMemcpyDeviceToHost));
            if (failed) {
                fprintf(stderr, "spread %d: the kernel lost a word\n", k);
                return 2;
            }
            char mode[32];
            snprintf(mode, sizeof mode, "spread %d", k);
            report(mode, "wb", times[0]);
            report(mode, "wc", times[1]);
        }
    }

    // fan: N blocks that each need the frame, direct or relayed (one block a SM: N <= the SMs), over
    // write-back and write-combined memory. Direct polling on write-back memory took up to 579 us a
    // trip (session 61): those rounds get a tenth of the trips.
    {
        unsigned long long* relay_dev = nullptr;
        unsigned int* arrived_dev = nullptr;
        CHECK(cudaMalloc(&relay_dev, F * 8));
        CHECK(cudaMalloc(&arrived_dev, 4));
        const int counts[] = {1, 8, 32, prop.multiProcessorCount};
        const char* names[4] = {"direct wb", "relay wb", "direct wc", "relay wc"};
        for (int blocks : counts) {
            std::vector<double> times[4];
            for (int r = 0; r < rounds; ++r)
                for (int j = 0; j < 4; ++j) {
                    const int v = (j + r) % 4;
                    const bool direct = v % 2 == 0;
                    const Kind kind = v < 2 ? WB : WC;
                    const int n = direct && blocks > 1 ? std::max(trips / 10, 100) : trips;
                    if (!fan_trip(b, kind, blocks, direct, F, n, relay_dev, arrived_dev, failed_dev, stream, times[v]))
                        return 2;
                }
            int failed = 0;
            CHECK(cudaMemcpy(&failed, failed_dev, 4, cudaMemcpyDeviceToHost));
            if (failed) {
                fprintf(stderr, "fan %d: a block lost a word\n", blocks);
                return 2;
            }
            char mode[32];
            snprintf(mode, sizeof mode, "fan %d", blocks);
            for (int v = 0; v < 4; ++v) report(mode, names[v], times[v]);
        }
    }

    // read: cycles a dependent load (the chain's words written by the host before the launch)
    const int n = 512, loads = 256;
    std::vector<unsigned long long> chain(n);
    for (int i = 0; i < n; ++i) chain[i] = (unsigned long long)((i * 97 + 1) % n);  // 97 coprime with 512
    unsigned long long *wb_chain, *wc_chain, *dev_chain, *wb_dev, *wc_dev, *cycles;
    CHECK(cudaHostAlloc((void**)&wb_chain, n * 8, cudaHostAllocMapped | cudaHostAllocPortable));
    CHECK(cudaHostAlloc((void**)&wc_chain, n * 8,
                        cudaHostAllocMapped | cudaHostAllocPortable | cudaHostAllocWriteCombined));
    for (int i = 0; i < n; ++i) {
        wb_chain[i] = chain[i];
        wc_chain[i] = chain[i];
    }
    _mm_sfence();
    CHECK(cudaHostGetDevicePointer((void**)&wb_dev, wb_chain, 0));
    CHECK(cudaHostGetDevicePointer((void**)&wc_dev, wc_chain, 0));
    CHECK(cudaMalloc(&dev_chain, n * 8));
    CHECK(cudaMemcpy(dev_chain, chain.data(), n * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&cycles, 16));
    const unsigned long long* where[3] = {wb_dev, wc_dev, dev_chain};
    const char* where_names[3] = {"wb", "wc", "device"};
    std::vector<double> per_load[3];
    for (int r = 0; r < rounds; ++r)
        for (int j = 0; j < 3; ++j) {
            k_chase<<<1, 1, 0, stream>>>(where[j], n, loads, cycles);
            CHECK(cudaGetLastError());
            unsigned long long c[2];
            CHECK(cudaMemcpyAsync(c, cycles, 16, cudaMemcpyDeviceToHost, stream));
            CHECK(cudaStreamSynchronize(stream));
            per_load[j].push_back((double)c[0] / loads);
        }
    for (int j = 0; j < 3; ++j) {
        std::sort(per_load[j].begin(), per_load[j].end());
        printf("read      %-10s cycles a dependent load: median %.0f, min %.0f, max %.0f (%d rounds)\n", where_names[j],
               per_load[j][rounds / 2], per_load[j][0], per_load[j][rounds - 1], rounds);
    }
    return 0;
}
