// CPU emulation of the CUDA features a generated step kernel uses (compiler/emulate.py).
//
// Not a GPU: a test harness. Every CUDA thread of the launch is a std::thread; __syncthreads is a
// block barrier, __shfl_xor_sync an exchange through a per-warp array between two warp barriers,
// flag-tagged loads and stores are relaxed std::atomic_ref accesses (a waiting thread yields),
// cp.async copies land when their thread waits for their commit group (the latest they may). It
// runs the generated source itself, so the scheduling, index arithmetic, shared-memory layout, the
// copies' waits and the flag protocol are exercised without a GPU; timing, the memory model of
// real hardware and the compiler's code generation for sm_XY are not.
#pragma once
#define FFK_EMULATE 1

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <barrier>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

using std::isinf;
using std::isnan;
using std::max;
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n)

struct dim3 {
    unsigned x = 0, y = 0, z = 0;
};
struct float4 {
    float x, y, z, w;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

// A block's (or a warp's) barrier. Under ThreadSanitizer a mutex and a condition variable (each
// thread takes the lock twice and sleeps between): std::barrier's waiters spin on acquire loads,
// and there an acquire walks a clock as long as the launch has threads (2,048 in the larger
// tests), which was half of a sanitised run. Without it std::barrier, twice as fast as the lock.
class FfkEmuLockBarrier {
public:
    explicit FfkEmuLockBarrier(int count) : count_(count) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(mutex_);
        const unsigned long long phase = phase_;
        if (++arrived_ == count_) {
            arrived_ = 0;
            ++phase_;
            woken_.notify_all();
            return;
        }
        woken_.wait(lock, [&] { return phase_ != phase; });
    }

private:
    std::mutex mutex_;
    std::condition_variable woken_;
    const int count_;
    int arrived_ = 0;
    unsigned long long phase_ = 0;
};
#if defined(__SANITIZE_THREAD__)
using FfkEmuBarrier = FfkEmuLockBarrier;
#else
using FfkEmuBarrier = std::barrier<>;
#endif

struct FfkEmuBlock {
    std::vector<float> smem;
    unsigned epoch = 0;
    unsigned stop = 0;
    std::unique_ptr<FfkEmuBarrier> bar;
    std::vector<std::unique_ptr<FfkEmuBarrier>> warp_bars;
    std::vector<float> shuffle;  // one slot per thread
};
inline std::vector<FfkEmuBlock>* ffk_emu_blocks = nullptr;
inline FfkEmuBlock& ffk_emu_block() { return (*ffk_emu_blocks)[blockIdx.x]; }

#define FFK_SHARED_DECL                             \
    float* ffk_smem = ffk_emu_block().smem.data(); \
    unsigned& ffk_epoch_s = ffk_emu_block().epoch;
#define FFK_RESIDENT_SHARED_DECL unsigned& ffk_stop_s = ffk_emu_block().stop;

inline void __syncthreads() { ffk_emu_block().bar->arrive_and_wait(); }
inline void __nanosleep(unsigned) { std::this_thread::yield(); }

// the warp's lanes meet; their shared-memory writes before it are seen after it
inline void __syncwarp() { ffk_emu_block().warp_bars[threadIdx.x / 32]->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int offset) {
    FfkEmuBlock& blk = ffk_emu_block();
    const unsigned t = threadIdx.x, warp = t / 32, lane = t % 32;
    auto& bar = *blk.warp_bars[warp];
    blk.shuffle[t] = v;
    bar.arrive_and_wait();
    const float r = blk.shuffle[warp * 32 + (lane ^ (unsigned)offset)];
    bar.arrive_and_wait();
    return r;
}

inline unsigned __float_as_uint(float v) {
    unsigned u;
    std::memcpy(&u, &v, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}
inline float __int_as_float(int i) {
    float v;
    std::memcpy(&v, &i, 4);
    return v;
}
inline float __expf(float x) { return std::exp(x); }  // the step kernel's exp (see codegen EXP_INTRINSIC)
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}

// Flagged stores over the whole grid: a wait is a deadlock when no block stored anything for 120 s
// (a long chain of dependent waits, a recurrence's positions one after another, on thousands of
// emulated threads, can keep one waiting longer than that while the others make progress; under
// ThreadSanitizer on a loaded 2-core machine a phase without stores took more than 30 s: an LSTM
// window's 24 blocks, reported as a deadlock in CI, passing alone in 23 s).
inline std::atomic<unsigned long long> ffk_emu_stores{0};
inline void ffk_ll_store(unsigned long long* p, float v, unsigned epoch) {
    const unsigned long long word = ((unsigned long long)epoch << 32) | (unsigned long long)__float_as_uint(v);
    std::atomic_ref<unsigned long long>(*p).store(word, std::memory_order_relaxed);
    ffk_emu_stores.fetch_add(1, std::memory_order_relaxed);
}
inline const unsigned long long* ffk_emu_ll_base = nullptr;
inline float ffk_ll_wait(const unsigned long long* p, unsigned epoch) {
    auto& word_ref = *const_cast<unsigned long long*>(p);
    auto start = std::chrono::steady_clock::now();
    unsigned long long stores = ffk_emu_stores.load(std::memory_order_relaxed);
    for (;;) {
        const unsigned long long word = std::atomic_ref<unsigned long long>(word_ref).load(std::memory_order_relaxed);
        if ((unsigned)(word >> 32) == epoch) return __uint_as_float((unsigned)word);
        std::this_thread::yield();
        const unsigned long long now_stores = ffk_emu_stores.load(std::memory_order_relaxed);
        if (now_stores != stores) {
            stores = now_stores;
            start = std::chrono::steady_clock::now();
        } else if (std::chrono::steady_clock::now() - start > std::chrono::seconds(120)) {
            std::fprintf(stderr, "deadlock: block %u thread %u waits for flagged word %lld (epoch %u, holds %u)\n",
                         blockIdx.x, threadIdx.x, (long long)(p - ffk_emu_ll_base), epoch, (unsigned)(word >> 32));
            std::abort();
        }
    }
}
inline unsigned long long ffk_ll_peek(const unsigned long long* p) {
    return std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_relaxed);
}
inline float ffk_ll_take(unsigned long long word, const unsigned long long* p, unsigned epoch) {
    return (unsigned)(word >> 32) == epoch ? __uint_as_float((unsigned)word) : ffk_ll_wait(p, epoch);
}
inline bool ffk_ll_current(unsigned long long word, unsigned epoch) { return (unsigned)(word >> 32) == epoch; }
inline float ffk_ll_value(unsigned long long word) { return __uint_as_float((unsigned)word); }
inline float ffk_load_host(const float* p) { return *(const volatile float*)p; }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void ffk_store_host_word(unsigned long long* p, float v, unsigned epoch) {
    std::atomic_ref<unsigned long long>(*p).store(((unsigned long long)epoch << 32) | __float_as_uint(v),
                                                  std::memory_order_release);
}
inline void ffk_store_done(unsigned* p, unsigned epoch) {
    std::atomic_ref<unsigned>(*p).store(epoch, std::memory_order_release);
}
// the resident kernel's frame protocol (runtime.cuh): the host side is the harness's host thread
#define FFK_CTL_GO 0
#define FFK_CTL_STOP 1
#define FFK_CTL_FINISHED 2
#define FFK_CTL_SMS 3
#define FFK_POLL_BINS 8
inline unsigned ffk_smid() { return blockIdx.x; }  // an emulated block is its own "SM"
#define FFK_BELL_STOP 0xffffffffu
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <bool TAKE_GO>
inline unsigned ffk_lead_frame(unsigned long long* ctl, const unsigned* bell, unsigned* idle,
                               unsigned long long finished, unsigned frame, unsigned epoch) {
    while (std::atomic_ref<unsigned long long>(ctl[FFK_CTL_FINISHED]).load(std::memory_order_acquire) < finished)
        std::this_thread::yield();
    std::atomic_ref<unsigned>(*idle).store(frame - 1, std::memory_order_release);
    for (;;) {
        const unsigned v = std::atomic_ref<unsigned>(*const_cast<unsigned*>(bell)).load(std::memory_order_acquire);
        if (v == FFK_BELL_STOP) {
            std::atomic_ref<unsigned long long>(ctl[FFK_CTL_STOP]).store(1ull, std::memory_order_release);
            return 0u;
        }
        if (v == frame) break;
        if (TAKE_GO && std::atomic_ref<unsigned long long>(ctl[FFK_CTL_GO]).load(std::memory_order_acquire) == epoch)
            return epoch;
        std::this_thread::yield();
    }
    std::atomic_ref<unsigned long long>(ctl[FFK_CTL_GO]).store(epoch, std::memory_order_release);
    return epoch;
}
inline void ffk_go(unsigned long long* ctl, unsigned epoch) {
    std::atomic_ref<unsigned long long>(ctl[FFK_CTL_GO]).store(epoch, std::memory_order_release);
}
inline void ffk_wait_finished(unsigned long long* ctl, unsigned long long finished) {
    while (std::atomic_ref<unsigned long long>(ctl[FFK_CTL_FINISHED]).load(std::memory_order_acquire) < finished)
        std::this_thread::yield();
}
inline void ffk_count_reads(unsigned long long* bins, unsigned reads) {
    std::atomic_ref<unsigned long long>(bins[(reads < FFK_POLL_BINS ? reads : FFK_POLL_BINS) - 1]).fetch_add(1ull, std::memory_order_relaxed);
}
inline float ffk_poll_frame(const unsigned long long* p, unsigned epoch, unsigned long long* ctl, unsigned* stop,
                            unsigned* reads = nullptr) {
    for (;;) {
        const unsigned long long w = std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_acquire);
        if (reads != nullptr) ++*reads;
        if ((unsigned)(w >> 32) == epoch) return __uint_as_float((unsigned)w);
        if (std::atomic_ref<unsigned long long>(ctl[FFK_CTL_STOP]).load(std::memory_order_acquire)) {
            std::atomic_ref<unsigned>(*stop).fetch_or(1u, std::memory_order_relaxed);
            return 0.0f;
        }
        std::this_thread::yield();
    }
}
// a replica's stagger (codegen.RESIDENT_FRAMER_REPLICAS): no clock here, a few turns given away
inline void ffk_spin_cycles(long long cycles) {
    for (long long i = 0; i < cycles; i += 256) std::this_thread::yield();
}
inline float ffk_load_host_tagged(const unsigned long long* p, unsigned epoch) {
    for (;;) {
        const unsigned long long w = std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_acquire);
        if ((unsigned)(w >> 32) == epoch) return __uint_as_float((unsigned)w);
        std::this_thread::yield();
    }
}
inline float ffk_ld_cg(const float* p) { return *p; }
inline unsigned ffk_wait_go(unsigned long long* ctl, unsigned epoch) {
    for (;;) {
        if (std::atomic_ref<unsigned long long>(ctl[FFK_CTL_GO]).load(std::memory_order_acquire) == epoch) return epoch;
        if (std::atomic_ref<unsigned long long>(ctl[FFK_CTL_STOP]).load(std::memory_order_acquire)) return 0u;
        std::this_thread::yield();
    }
}
inline void ffk_block_finished(unsigned long long* ctl) {
    std::atomic_ref<unsigned long long>(ctl[FFK_CTL_FINISHED]).fetch_add(1ull, std::memory_order_acq_rel);
}
inline unsigned long long ffk_globaltimer() {
    return (unsigned long long)std::chrono::steady_clock::now().time_since_epoch().count();
}
template <int NT, int K>
inline void ffk_ll_stage_n(float* const (&dst)[K], const unsigned long long* const (&src)[K], const int (&n)[K],
                           unsigned epoch) {
    for (int k = 0; k < K; ++k)
        for (int i = threadIdx.x; i < n[k]; i += NT) dst[k][i] = ffk_ll_wait(src[k] + i, epoch);
}
// (the GPU's version issues UNROLL loads a thread before it waits; here each word is waited for in
// turn, as ffk_ll_stage_n does: the same values, the GPU's load order is not emulated)
template <int NT, int K, int UNROLL>
inline void ffk_ll_stage_wide(float* const (&dst)[K], const unsigned long long* const (&src)[K], const int (&n)[K],
                              unsigned epoch) {
    ffk_ll_stage_n<NT, K>(dst, src, n, epoch);
}
// cp.async as the worst case the hardware allows: a thread's copies land only when it waits for
// their commit group (cp.async.wait_group N completes all but the N most recent groups), so a
// read of shared memory before the wait that covers it sees the NaN the arena starts with.
struct FfkEmuCopy {
    float* dst;
    const float* src;
    int n, start, stride;
};
inline thread_local std::vector<std::vector<FfkEmuCopy>> ffk_emu_groups;  // committed, oldest first
inline thread_local std::vector<FfkEmuCopy> ffk_emu_open;                 // not committed yet
inline void ffk_prefetch(float* dst, const float* src, int n) {
    ffk_emu_open.push_back({dst, src, n, (int)threadIdx.x, (int)blockDim.x});
}
inline void ffk_prefetch_lanes(float* dst, const float* src, int n, int lane) {
    ffk_emu_open.push_back({dst, src, n, lane, 32});
}
// fp16 bits to float (the GPU's cvt.f32.f16: exact, subnormals, infinities and NaNs kept)
inline float ffk_emu_half_to_float(unsigned short h) {
    const unsigned sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        const float f = (float)mantissa * 5.9604644775390625e-08f;  // mantissa * 2^-24
        return sign ? -f : f;
    }
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
// An 8-byte load (two 32-bit words) of narrow weights; misaligned faults on the GPU: refused here too
inline void ffk_emu_ld8(const void* p, unsigned& lo, unsigned& hi) {
    if (reinterpret_cast<std::uintptr_t>(p) & 7) {
        std::fprintf(stderr, "ffk_ld_w4: misaligned address %p (block %u thread %u)\n", p, blockIdx.x, threadIdx.x);
        std::abort();
    }
    unsigned words[2];
    std::memcpy(words, p, sizeof words);
    lo = words[0], hi = words[1];
}
// A 4-byte load of int8 weights; misaligned faults on the GPU: refused here too
inline unsigned ffk_emu_ld4u(const unsigned* p) {
    if (reinterpret_cast<std::uintptr_t>(p) & 3) {
        std::fprintf(stderr, "ffk_seg_dot_q: misaligned address %p (block %u thread %u)\n", (const void*)p, blockIdx.x, threadIdx.x);
        std::abort();
    }
    unsigned v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
// A misaligned float4 load faults on the GPU: the emulator refuses one too
inline float4 ffk_ld4(const float* p) {
    if (reinterpret_cast<std::uintptr_t>(p) & 15) {
        std::fprintf(stderr, "ffk_ld4: misaligned address %p (block %u thread %u)\n", (const void*)p, blockIdx.x, threadIdx.x);
        std::abort();
    }
    float4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline void ffk_prefetch_commit() {
    ffk_emu_groups.push_back(std::move(ffk_emu_open));
    ffk_emu_open.clear();
}
inline void ffk_emu_prefetch_wait(int n) {
    while ((int)ffk_emu_groups.size() > n) {
        for (const FfkEmuCopy& c : ffk_emu_groups.front())
            for (int i = c.start; i < c.n; i += c.stride) std::memcpy(c.dst + i, c.src + i, 4);  // bits, not values
        ffk_emu_groups.erase(ffk_emu_groups.begin());
    }
}
template <int N>
inline void ffk_prefetch_wait() {
    ffk_emu_prefetch_wait(N);
}
inline void ffk_prefetch_wait_n(int n) { ffk_emu_prefetch_wait(n < 7 ? n : 7); }

// one launch of `kernel` over grid x threads std::threads
template <typename F>
void ffk_emu_launch(int grid, int threads, size_t smem_floats, F kernel) {
    std::vector<FfkEmuBlock> blocks(grid);
    for (auto& blk : blocks) {
        // uninitialised shared memory reads as NaN, as a float and as either 16-bit half (narrow weights)
        blk.smem.assign(smem_floats + 4, __uint_as_float(0x7fc07fc0u));
        blk.bar = std::make_unique<FfkEmuBarrier>(threads);
        for (int w = 0; w < threads / 32; ++w) blk.warp_bars.push_back(std::make_unique<FfkEmuBarrier>(32));
        blk.shuffle.assign(threads, 0.0f);
    }
    ffk_emu_blocks = &blocks;
    blockDim.x = threads;
    gridDim.x = grid;
    std::vector<std::thread> pool;
    pool.reserve((size_t)grid * threads);
    for (int b = 0; b < grid; ++b)
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([=] {
                blockIdx.x = b;
                threadIdx.x = t;
                ffk_emu_groups.clear();
                ffk_emu_open.clear();
                kernel();
            });
    for (auto& th : pool) th.join();
    ffk_emu_blocks = nullptr;
}
