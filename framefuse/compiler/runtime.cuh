// The step compiler's device runtime: what every generated step kernel uses.
//
// Flag-tagged values ("LL", as NCCL's low-latency protocol): a value that crosses thread blocks is
// stored as one 64-bit word, the float's bits in the low half and the launch's epoch in the high
// half. A reader spins until the high half is the current epoch, so it waits for exactly the
// element it reads, and one 8-byte store is the whole handshake (single-copy atomic: the reader
// never sees a new flag with an old value). Relaxed, GPU-scope accesses: they bypass the
// non-coherent L1 and need no fence, since the flag and the value travel together.
//
// FFK_EMULATE builds the same source for the CPU (compiler/emulate.py), with these primitives
// defined by the emulator.
#pragma once

#ifndef FFK_EMULATE
#define FFK_DEVICE __device__ __forceinline__
#else
#define FFK_DEVICE inline
#endif

FFK_DEVICE float ffk_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
FFK_DEVICE float ffk_relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }
FFK_DEVICE float ffk_max(float a, float b) { return (a != a || a > b) ? a : b; }  // NaN-propagating
FFK_DEVICE float ffk_min(float a, float b) { return (a != a || a < b) ? a : b; }
FFK_DEVICE float ffk_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
FFK_DEVICE float ffk_softsign(float x) { return x / (1.0f + fabsf(x)); }
FFK_DEVICE float ffk_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
FFK_DEVICE float ffk_leaky_relu(float x, float alpha) { return x >= 0.0f ? x : alpha * x; }
FFK_DEVICE float ffk_elu(float x, float alpha) { return x > 0.0f ? x : alpha * (expf(x) - 1.0f); }
FFK_DEVICE float ffk_hard_sigmoid(float x, float alpha, float beta) {
    return fminf(fmaxf(alpha * x + beta, 0.0f), 1.0f);
}
FFK_DEVICE float ffk_clip(float x, float lo, float hi) { return x != x ? x : fminf(fmaxf(x, lo), hi); }
FFK_DEVICE float ffk_gelu(float x, float tanh_form) {
    if (tanh_form != 0.0f) return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}
FFK_DEVICE float ffk_pow(float x, float y) { return powf(x, y); }
// -- end of the elementwise math: compiler/cstep.py's CPU step takes this file up to here

#ifndef FFK_EMULATE
// the shared memory of a block: the dynamic arena and the launch's epoch
#define FFK_SHARED_DECL                             \
    extern __shared__ __align__(16) float ffk_smem[]; \
    __shared__ unsigned ffk_epoch_s;
// the resident kernel with tagged frames: a frame block's poll saw the stop
#define FFK_RESIDENT_SHARED_DECL __shared__ unsigned ffk_stop_s;

// -- flag-tagged values ------------------------------------------------------------------------------
FFK_DEVICE void ffk_ll_store(unsigned long long* p, float v, unsigned epoch) {
    const unsigned long long word = ((unsigned long long)epoch << 32) | (unsigned long long)__float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(word) : "memory");
}
// A value that never arrives is a compiler bug: after FFK_POLL_LIMIT polls the kernel traps, so the
// launch fails with an error instead of hanging the GPU. The limit counts polls, not time: a poll is
// at least one L2 round trip (~0.15 us on an H100, so >= 2.5 s of polling), and a block whose context
// is switched out does not poll, so a GPU time-sliced with other processes (the sanitizers' 28
// processes did it with the former 2^31-cycle clock64 limit: clock64 counts while switched out) does
// not fire it while the producer of the value is merely waiting for its turn.
#ifndef FFK_POLL_LIMIT
#define FFK_POLL_LIMIT (1u << 24)
#endif
FFK_DEVICE float ffk_ll_wait(const unsigned long long* p, unsigned epoch) {
    unsigned long long word;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(word) : "l"(p) : "memory");
    if ((unsigned)(word >> 32) != epoch) {
        unsigned polls = 0;
        do {
            asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(word) : "l"(p) : "memory");
            if (++polls > FFK_POLL_LIMIT) __trap();
        } while ((unsigned)(word >> 32) != epoch);
    }
    return __uint_as_float((unsigned)word);
}
// A flag-tagged word loaded ahead of its use (a recurrence's next input, issued before the current
// position's products, so the load's latency hides behind them); ffk_ll_take waits only when the
// word was not current yet when it was loaded.
FFK_DEVICE unsigned long long ffk_ll_peek(const unsigned long long* p) {
    unsigned long long word;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(word) : "l"(p) : "memory");
    return word;
}
FFK_DEVICE float ffk_ll_take(unsigned long long word, const unsigned long long* p, unsigned epoch) {
    return (unsigned)(word >> 32) == epoch ? __uint_as_float((unsigned)word) : ffk_ll_wait(p, epoch);
}
// A word loaded ahead: whether it was current when loaded, and its value. A recurrence checks all of
// a position's words with one branch (codegen.RECUR_TAKE_TOGETHER) instead of ffk_ll_take's branch
// and reconvergence for each word, which its cell threads run on every position's critical path.
FFK_DEVICE bool ffk_ll_current(unsigned long long word, unsigned epoch) { return (unsigned)(word >> 32) == epoch; }
FFK_DEVICE float ffk_ll_value(unsigned long long word) { return __uint_as_float((unsigned)word); }
// Copy K ranges of flag-tagged words into shared memory as floats, waiting for each: the ranges
// are one index space, every thread issues UNROLL loads before it checks any, and re-polls all of
// its words that are not current yet together, so a block pays about one round trip per UNROLL *
// NT words (waiting on one word at a time costs a round trip for each word that was late).
template <int NT, int K>
FFK_DEVICE void ffk_ll_stage_n(float* const (&dst)[K], const unsigned long long* const (&src)[K], const int (&n)[K],
                               unsigned epoch) {
    constexpr int UNROLL = 4;
    int total = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) total += n[k];
    for (int base = 0; base < total; base += NT * UNROLL) {
        unsigned long long w[UNROLL];
        const unsigned long long* p[UNROLL];
        float* d[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            int j = base + u * NT + (int)threadIdx.x;
            p[u] = nullptr;
            d[u] = nullptr;
            if (j < total) {
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    if (p[u] == nullptr && j < n[k]) {
                        p[u] = src[k] + j;
                        d[u] = dst[k] + j;
                    }
                    j -= n[k];
                }
                asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w[u]) : "l"(p[u]) : "memory");
            }
        }
        bool late = false;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) late |= p[u] != nullptr && (unsigned)(w[u] >> 32) != epoch;
        if (late) {
            unsigned polls = 0;
            do {
                late = false;
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) {
                    if (p[u] != nullptr && (unsigned)(w[u] >> 32) != epoch) {
                        asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w[u]) : "l"(p[u]) : "memory");
                        late = true;
                    }
                }
                if (++polls > FFK_POLL_LIMIT) __trap();
            } while (late);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (p[u] != nullptr) *d[u] = __uint_as_float((unsigned)w[u]);
    }
}
// The same with UNROLL words a thread in flight, for a block that stages many (a split product's
// partial sums: 16 x 256 words, codegen.stage_unroll), range by range. Small on purpose: a step
// runs this code once, so each of its instructions is fetched cold. The form that found each
// word's range by a chain of selects, its loads and re-polls unrolled 16 times (2,200
// instructions in min_gru's head), spent its time on instruction fetch and address arithmetic,
// not on L2: Nsight Compute's samples there were mostly no_inst, none long_sb (session 63).
template <int NT, int K, int UNROLL>
FFK_DEVICE void ffk_ll_stage_wide(float* const (&dst)[K], const unsigned long long* const (&src)[K], const int (&n)[K],
                                  unsigned epoch) {
#pragma unroll 1
    for (int k = 0; k < K; ++k) {
        const unsigned long long* s = src[0];
        float* d = dst[0];
        int m = n[0];
#pragma unroll
        for (int q = 1; q < K; ++q) {  // range k by selects: no array indexed at run time
            if (k == q) {
                s = src[q];
                d = dst[q];
                m = n[q];
            }
        }
#pragma unroll 1
        for (int j = (int)threadIdx.x; j < m; j += NT * UNROLL) {
            unsigned long long w[UNROLL];
            unsigned polls = 0;
            bool late;
            do {  // a batch late in part is loaded again whole: one copy of the loads in the code
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) {
                    w[u] = (unsigned long long)epoch << 32;  // past the end: current, never stored
                    if (j + u * NT < m)
                        asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w[u]) : "l"(s + j + u * NT) : "memory");
                }
                late = false;
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) late |= (unsigned)(w[u] >> 32) != epoch;
                if (late && ++polls > FFK_POLL_LIMIT) __trap();
            } while (late);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (j + u * NT < m) d[j + u * NT] = __uint_as_float((unsigned)w[u]);
        }
    }
}
FFK_DEVICE unsigned long long ffk_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// a graph input in pinned, mapped host memory: read once per launch, never from a cache
FFK_DEVICE float ffk_load_host(const float* p) {
    float v;
    asm volatile("ld.volatile.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}

// a block's done word in mapped host memory (the host waits on it instead of the stream)
FFK_DEVICE void ffk_store_done(unsigned* p, unsigned epoch) {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(epoch) : "memory");
}

// -- the resident kernel's frame protocol (codegen.Generator._resident_loop) ----------------------------
// ffk_ctl (device memory, zeroed before the launch): the current frame's epoch, the stop word, and
// the count of blocks through a frame. The host rings frame k (1, 2, ...) by writing k into the bell
// (mapped host memory) after the frame itself; it stops the kernel with FFK_BELL_STOP.
#define FFK_CTL_GO 0
#define FFK_CTL_STOP 1
#define FFK_CTL_FINISHED 2
// from this word on, one a block: the SM the block runs on (%smid), written at launch (diagnostics:
// the same kernel's p50 differs by ~1 us between launches, session 70)
#define FFK_CTL_SMS 3
// after the grid's SM words, FFK_POLL_BINS words (codegen.RESIDENT_POLL_COUNTS, diagnostics): how
// many frames a frame block's thread 0 saw its word in 1, 2, ... reads of host memory (the last
// bin: that many or more)
#define FFK_POLL_BINS 8
#define FFK_BELL_STOP 0xffffffffu
FFK_DEVICE unsigned ffk_smid() {
    unsigned r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}

FFK_DEVICE unsigned long long ffk_ld_acquire_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
FFK_DEVICE void ffk_st_release_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// The leader's thread 0 before frame `frame` (block 0, or codegen.RESIDENT_LEADER_LAST's): every
// block through the previous one (its state stores visible), the host told so, then the host's
// bell, then the go (or the stop) for every block; returns `epoch`, or 0 for the stop. With TAKE_GO
// a frame block publishes the go itself once its words are in (codegen.RESIDENT_FRAMER_GO) and the
// leader also takes that go, so a bell seen late keeps no block waiting; both publish the same
// epoch for a frame. The waits are unbounded: a resident kernel idles here between frames; the
// host's watchdog and stop word end it.
template <bool TAKE_GO>
FFK_DEVICE unsigned ffk_lead_frame(unsigned long long* ctl, const unsigned* bell, unsigned* idle,
                                   unsigned long long finished, unsigned frame, unsigned epoch) {
    while (ffk_ld_acquire_u64(ctl + FFK_CTL_FINISHED) < finished) {
    }
    __threadfence_system();
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(idle), "r"(frame - 1) : "memory");
    for (;;) {
        unsigned v;
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(bell) : "memory");
        if (v == FFK_BELL_STOP) {
            ffk_st_release_u64(ctl + FFK_CTL_STOP, 1ull);
            return 0u;
        }
        if (v == frame) break;
        if (TAKE_GO && ffk_ld_acquire_u64(ctl + FFK_CTL_GO) == epoch) return epoch;
    }
    ffk_st_release_u64(ctl + FFK_CTL_GO, epoch);
    return epoch;
}
// codegen.RESIDENT_POLL_COUNTS: one frame that took `reads` reads of host memory, into its bin
FFK_DEVICE void ffk_count_reads(unsigned long long* bins, unsigned reads) {
    atomicAdd(bins + (reads < FFK_POLL_BINS ? reads : FFK_POLL_BINS) - 1, 1ull);
}
// A frame block's go: its words carry this frame's epoch, so the frame has begun
FFK_DEVICE void ffk_go(unsigned long long* ctl, unsigned epoch) { ffk_st_release_u64(ctl + FFK_CTL_GO, epoch); }
// Tagged frames (codegen.RESIDENT_TAGGED_FRAMES): the host writes each frame float as one 64-bit
// word, (epoch << 32) | its bits, before the bell. A frame block polls its own words instead of
// waiting for the go: returns the value once the word carries `epoch`, or 0 with *stop set once
// the leader has published the stop (the host rings the stop only between frames, so a frame that
// has begun arriving always arrives whole). Unbounded, like the leader's poll of the bell.
FFK_DEVICE float ffk_poll_frame(const unsigned long long* p, unsigned epoch, unsigned long long* ctl,
                                unsigned* stop, unsigned* reads = nullptr) {
#ifdef FFK_POLL_AHEAD
    // (codegen.RESIDENT_POLL_AHEAD) the next read of the word is issued beside the stop word's,
    // before either is looked at: the word is sampled every host round trip, not every host round
    // trip plus an L2 one. A stop seen leaves one read in flight; nothing waits for it.
    unsigned long long w;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    for (;;) {
        if (reads != nullptr) ++*reads;
        if ((unsigned)(w >> 32) == epoch) return __uint_as_float((unsigned)w);
        unsigned long long s;
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(s) : "l"(ctl + FFK_CTL_STOP) : "memory");
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
        if (s) {
            atomicOr(stop, 1u);  // (every polling thread of the block may write it)
            return 0.0f;
        }
    }
#endif
    for (;;) {
        unsigned long long w;
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
        if (reads != nullptr) ++*reads;
        if ((unsigned)(w >> 32) == epoch) return __uint_as_float((unsigned)w);
        if (ffk_ld_acquire_u64(ctl + FFK_CTL_STOP)) {
            atomicOr(stop, 1u);  // (every polling thread of the block may write it)
            return 0.0f;
        }
    }
}
// A frame block's replica (codegen.RESIDENT_FRAMER_REPLICAS) before its first poll of a frame: its
// polls then sample the host's words between its frame block's (clock64 counts this SM's cycles)
FFK_DEVICE void ffk_spin_cycles(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
// A tagged frame element read where it is used, by a block that has the go or its own frame
// words: the host writes the frame's words in order, not atomically as a whole, so this word may
// still be on its way. Bounded (FFK_POLL_LIMIT) like a flagged word's wait.
FFK_DEVICE float ffk_load_host_tagged(const unsigned long long* p, unsigned epoch) {
    for (unsigned polls = 0;; ++polls) {
        unsigned long long w;
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
        if ((unsigned)(w >> 32) == epoch) return __uint_as_float((unsigned)w);
        if (polls > FFK_POLL_LIMIT) __trap();
    }
}
// A block's thread 0 before it prefetches a frame's state: every block through the last frame.
FFK_DEVICE void ffk_wait_finished(unsigned long long* ctl, unsigned long long finished) {
    while (ffk_ld_acquire_u64(ctl + FFK_CTL_FINISHED) < finished) {
    }
}
// A state value read where it is used in the resident kernel: through L2 (the state changes under
// a resident kernel, so not through the read-only cache __ldg uses).
FFK_DEVICE float ffk_ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
// Every block's thread 0: the go for `epoch` (returned), or 0 for the stop.
FFK_DEVICE unsigned ffk_wait_go(unsigned long long* ctl, unsigned epoch) {
#ifdef FFK_POLL_AHEAD
    // (codegen.RESIDENT_POLL_AHEAD) the stop word read relaxed before the go's acquire, both in
    // flight at once: one L2 round trip a poll, not two. The go is looked at first, as below.
    for (;;) {
        unsigned long long s;
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(s) : "l"(ctl + FFK_CTL_STOP) : "memory");
        if (ffk_ld_acquire_u64(ctl + FFK_CTL_GO) == epoch) return epoch;
        if (s) return 0u;
    }
#endif
    for (;;) {
        if (ffk_ld_acquire_u64(ctl + FFK_CTL_GO) == epoch) return epoch;
        if (ffk_ld_acquire_u64(ctl + FFK_CTL_STOP)) return 0u;
    }
}
// A block's thread 0 after the block's barrier at the end of a frame: its stores (state included)
// before the count (the fence is cumulative over what the barrier ordered before it).
FFK_DEVICE void ffk_block_finished(unsigned long long* ctl) {
    __threadfence();
    atomicAdd(ctl + FFK_CTL_FINISHED, 1ull);
}
#endif  // !FFK_EMULATE

#ifndef FFK_EMULATE
// -- weight prefetch into shared memory (cp.async, sm_80+) ----------------------------------------------
// Copies `n` floats from global `src` to shared `dst`, spread over the block's threads; 16-byte
// copies when both addresses and `n` allow it.
FFK_DEVICE void ffk_prefetch(float* dst, const float* src, int n) {
    const unsigned base = (unsigned)__cvta_generic_to_shared(dst);
    if ((((unsigned long long)src | (unsigned long long)base) & 15) == 0 && (n & 3) == 0) {
        for (int i = threadIdx.x; i < (n >> 2); i += blockDim.x)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + 16u * i), "l"(src + 4 * i) : "memory");
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(base + 4u * i), "l"(src + i) : "memory");
    }
}
// The same over one warp's lanes (the prologue gives each warp its own copies).
FFK_DEVICE void ffk_prefetch_lanes(float* dst, const float* src, int n, int lane) {
    const unsigned base = (unsigned)__cvta_generic_to_shared(dst);
    if ((((unsigned long long)src | (unsigned long long)base) & 15) == 0 && (n & 3) == 0) {
        for (int i = lane; i < (n >> 2); i += 32)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + 16u * i), "l"(src + 4 * i) : "memory");
    } else {
        for (int i = lane; i < n; i += 32)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(base + 4u * i), "l"(src + i) : "memory");
    }
}
FFK_DEVICE void ffk_prefetch_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Four floats of shared memory at a 16-byte aligned address (the generator proves the alignment)
FFK_DEVICE float4 ffk_ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <int N>
FFK_DEVICE void ffk_prefetch_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// The same for a count known at run time (it differs between a task's blocks): a count above 7
// waits for 7, which is more than asked (every group but the 7 latest), never less.
FFK_DEVICE void ffk_prefetch_wait_n(int n) {
    switch (n) {
        case 0: ffk_prefetch_wait<0>(); break;
        case 1: ffk_prefetch_wait<1>(); break;
        case 2: ffk_prefetch_wait<2>(); break;
        case 3: ffk_prefetch_wait<3>(); break;
        case 4: ffk_prefetch_wait<4>(); break;
        case 5: ffk_prefetch_wait<5>(); break;
        case 6: ffk_prefetch_wait<6>(); break;
        default: ffk_prefetch_wait<7>(); break;
    }
}
#endif


// -- warp reductions (every lane gets the result) -------------------------------------------------------
FFK_DEVICE float ffk_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
FFK_DEVICE float ffk_warp_prod(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v *= __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
FFK_DEVICE float ffk_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = ffk_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
FFK_DEVICE float ffk_warp_min(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = ffk_min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The same over segments of L lanes (L a power of two ≤ 32): every lane of the warp calls it.
template <int L>
FFK_DEVICE float ffk_seg_sum(float v) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <int L>
FFK_DEVICE float ffk_seg_prod(float v) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) v *= __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <int L>
FFK_DEVICE float ffk_seg_max(float v) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) v = ffk_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <int L>
FFK_DEVICE float ffk_seg_min(float v) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) v = ffk_min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Σ_k x[k]·w[k] over segments of L lanes (L a power of two ≤ 32, `sub` the lane's index in its
// segment; K floats, float4 loads when ALIGNED4: both 16-byte aligned, K % 4 == 0). A row of K
// floats is K/4 float4 loads, so a warp-wide dot of a short row (K = 32: 8 loads) leaves most lanes
// idle and pays five shuffles; 32 / L rows a warp share the lanes out instead.
// Trip counts are compile-time constants: a loop from `lane` would make the compiler emit
// remainder code for any lane count (measured: a 2-dot phase took ~740 cycles).
template <int K, int L, bool ALIGNED4>
FFK_DEVICE float ffk_seg_dot(const float* x, const float* w, int sub) {
    float acc = 0.0f;
    if (ALIGNED4) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        constexpr int N4 = K / 4, J = (N4 + L - 1) / L;
#pragma unroll 8
        for (int j = 0; j < J; ++j) {
            const int k = sub + L * j;
            if (N4 % L == 0 || k < N4) {
                const float4 a = x4[k];
                const float4 b = w4[k];
                acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        }
    } else {
        constexpr int J = (K + L - 1) / L;
#pragma unroll 8
        for (int j = 0; j < J; ++j) {
            const int k = sub + L * j;
            if (K % L == 0 || k < K) acc += x[k] * w[k];
        }
    }
    return ffk_seg_sum<L>(acc);
}
// The same over a whole warp.
template <int K, bool ALIGNED4>
FFK_DEVICE float ffk_warp_dot(const float* x, const float* w, int lane) {
    return ffk_seg_dot<K, 32, ALIGNED4>(x, w, lane);
}

// A warp's products of several rows with one x (codegen.DOT_X_IN_REGISTERS, off: measured slower):
// the float4s of x that lane `lane` reads in ffk_warp_dot (aligned, K floats), loaded once into
// registers, then each row's product reads only its weights (K % 4 == 0, x and the rows 16-byte
// aligned). The sums are ffk_warp_dot's, term for term and in the same order.
template <int K>
struct ffk_xregs {
    static constexpr int J = (K / 4 + 31) / 32;
    float4 v[J];
};
template <int K>
FFK_DEVICE void ffk_load_x(ffk_xregs<K>& xr, const float* x, int lane) {
    constexpr int N4 = K / 4;
#pragma unroll
    for (int j = 0; j < ffk_xregs<K>::J; ++j) {
        const int k = lane + 32 * j;
        if (N4 % 32 == 0 || k < N4) xr.v[j] = ffk_ld4(x + 4 * k);
    }
}
template <int K>
FFK_DEVICE float ffk_warp_dot_x(const ffk_xregs<K>& xr, const float* w, int lane) {
    constexpr int N4 = K / 4;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < ffk_xregs<K>::J; ++j) {
        const int k = lane + 32 * j;
        if (N4 % 32 == 0 || k < N4) {
            const float4 a = xr.v[j];
            const float4 b = ffk_ld4(w + 4 * k);
            acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
    }
    return ffk_seg_sum<32>(acc);
}

// -- narrow weight rows (codegen.WEIGHT_FORMATS: FMT 1 fp16, 2 bf16), widened to float as they are
// read: the products accumulate in float32. A bf16 weight is the high half of a float32.
template <int FMT>
FFK_DEVICE float ffk_wf(unsigned short b) {
    if (FMT == 2) return __uint_as_float((unsigned)b << 16);
#ifndef FFK_EMULATE
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return f;
#else
    return ffk_emu_half_to_float(b);
#endif
}
// Four weights at an 8-byte aligned address (a row starts 16-byte aligned, codegen.NARROW_ROW_ALIGN)
template <int FMT>
FFK_DEVICE void ffk_ld_w4(const unsigned short* p, float& b0, float& b1, float& b2, float& b3) {
#ifndef FFK_EMULATE
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    const unsigned lo = v.x, hi = v.y;
#else
    unsigned lo, hi;
    ffk_emu_ld8(p, lo, hi);
#endif
    if (FMT == 2) {
        b0 = __uint_as_float(lo << 16), b1 = __uint_as_float(lo & 0xffff0000u);
        b2 = __uint_as_float(hi << 16), b3 = __uint_as_float(hi & 0xffff0000u);
    } else {
        b0 = ffk_wf<FMT>((unsigned short)lo), b1 = ffk_wf<FMT>((unsigned short)(lo >> 16));
        b2 = ffk_wf<FMT>((unsigned short)hi), b3 = ffk_wf<FMT>((unsigned short)(hi >> 16));
    }
}
// ffk_seg_dot with a narrow weight row (K elements; ALIGNED4: x 16-byte aligned and K % 4 == 0).
template <int K, int L, bool ALIGNED4, int FMT>
FFK_DEVICE float ffk_seg_dot_n(const float* x, const unsigned short* w, int sub) {
    float acc = 0.0f;
    if (ALIGNED4) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        constexpr int N4 = K / 4, J = (N4 + L - 1) / L;
#pragma unroll 8
        for (int j = 0; j < J; ++j) {
            const int k = sub + L * j;
            if (N4 % L == 0 || k < N4) {
                const float4 a = x4[k];
                float b0, b1, b2, b3;
                ffk_ld_w4<FMT>(w + 4 * k, b0, b1, b2, b3);
                acc += a.x * b0 + a.y * b1 + a.z * b2 + a.w * b3;
            }
        }
    } else {
        constexpr int J = (K + L - 1) / L;
#pragma unroll 8
        for (int j = 0; j < J; ++j) {
            const int k = sub + L * j;
            if (K % L == 0 || k < K) acc += x[k] * ffk_wf<FMT>(w[k]);
        }
    }
    return ffk_seg_sum<L>(acc);
}
// ffk_seg_dot with an int8 row (codegen.WEIGHT_FORMATS "int8"): the row's float scale in its first
// 4 bytes, its K values from byte 16; the segment's sum scaled once. ALIGNED4: x 16-byte aligned
// and K % 4 == 0, four values read as one 4-byte word.
FFK_DEVICE float ffk_i8(unsigned v, int byte) { return (float)(signed char)(unsigned char)(v >> (8 * byte)); }
template <int K, int L, bool ALIGNED4>
FFK_DEVICE float ffk_seg_dot_q(const float* x, const unsigned char* row, int sub) {
    const float scale = *reinterpret_cast<const float*>(row);
    const unsigned char* q = row + 16;
    float acc = 0.0f;
    if (ALIGNED4) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const unsigned* q4 = reinterpret_cast<const unsigned*>(q);
        constexpr int N4 = K / 4, J = (N4 + L - 1) / L;
#pragma unroll 8
        for (int j = 0; j < J; ++j) {
            const int k = sub + L * j;
            if (N4 % L == 0 || k < N4) {
                const float4 a = x4[k];
#ifndef FFK_EMULATE
                const unsigned v = q4[k];
#else
                const unsigned v = ffk_emu_ld4u(q4 + k);
#endif
                acc += a.x * ffk_i8(v, 0) + a.y * ffk_i8(v, 1) + a.z * ffk_i8(v, 2) + a.w * ffk_i8(v, 3);
            }
        }
    } else {
        constexpr int J = (K + L - 1) / L;
#pragma unroll 8
        for (int j = 0; j < J; ++j) {
            const int k = sub + L * j;
            if (K % L == 0 || k < K) acc += x[k] * (float)(signed char)q[k];
        }
    }
    return scale * ffk_seg_sum<L>(acc);
}
