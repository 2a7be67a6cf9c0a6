// The step kernel's per-frame host work in one foreign call (engines/hostpath.py builds and loads
// this file; engines/stepkernel.py's bindings fill the struct).
//
// Why C: at batch 1 the host's own work is a quarter of a step (H200: 5.3-5.5 of 16.6-20.7 us).
// Through ctypes every foreign call costs 0.6-1.1 us on the 2-core CI machine before it does
// anything (the done words' memset, cuGraphLaunch), and the spin on the done words and the
// frame's NaN probe are Python loops and numpy calls. Here a frame is one call: check the frame,
// clear the done words, launch (or tag the frame and ring the resident kernel's bell), spin on
// the done words.
//
// Every field is read and written by Python too (ctypes.Structure in hostpath.py, same order and
// types): this file owns nothing.
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int (*ff_graph_launch_fn)(void* exec, void* stream);  // cuGraphLaunch

typedef struct {
    ff_graph_launch_fn launch;  // cuGraphLaunch (launched mode)
    void* exec[2];              // the captured graphs, one per state parity
    void* stream;
    volatile uint32_t* done;    // the host-facing blocks' done words, mapped host memory
    volatile uint32_t* bell;    // resident mode: the bell word (NULL: launched mode)
    const float* frame;         // the mapped frame input the NaN/Inf check reads (NULL: no check)
    int64_t frame_floats;
    int64_t spin_limit;         // polls of one done word before returning FF_SPINNING
    int64_t launches;           // frames launched or rung through here
    int64_t epoch_base;         // resident: the blocks' launch count when the kernel started
    int64_t frames;             // resident: frames rung since it started
    int64_t launch_ns;          // the last frame: its launch (or bell) call, the done words' clearing included
    int64_t wait_ns;            // the last frame: the spin on its done words (the GPU's time, not host work)
    uint32_t expected;          // resident: the epoch this frame's done words carry
    int32_t n_done;
    int32_t n_execs;            // 1 or 2 (two: the parity flips every launch)
    int32_t parity;             // the graph the next launch replays
    int32_t unwaited;           // a launch (or bell) whose done words nobody has seen yet
    int32_t running;            // resident: the kernel is on the GPU
    int32_t error;              // the CUresult of the last failed launch
    int32_t pad;
    // resident mode with tagged frames (codegen.RESIDENT_TAGGED_FRAMES): before the bell, each
    // input's floats (tag_src[k], tag_len[k] of them) into its words (tag_dst[k], mapped host
    // memory) as (expected << 32) | bits, one 64-bit store a word
    const uint32_t* const* tag_src;
    volatile uint64_t* const* tag_dst;
    const int64_t* tag_len;
    int32_t tag_inputs;
    int32_t pad2;
} ff_frame_state;

enum {
    FF_DONE = 0,        // launched (or rung) and every done word is up
    FF_NONFINITE = 1,   // the frame holds NaN or Inf: nothing launched
    FF_LAUNCH_FAILED = 2,
    FF_SPINNING = 3,    // launched, the done words not up after spin_limit polls: wait in Python
    FF_UNWAITED = 4,    // an earlier launch was never waited on: nothing launched
    FF_NOT_RUNNING = 5  // resident kernel not running: nothing rung
};

static int64_t ff_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int ff_spin(ff_frame_state* s);

// Spin until every done word is up: non-zero (launched: the words were cleared before the launch)
// or equal to `expected` (resident: the words carry each frame's epoch). wait_ns: how long.
int ff_wait(ff_frame_state* s) {
    const int64_t start = ff_now_ns();
    const int answer = ff_spin(s);
    s->wait_ns = ff_now_ns() - start;
    return answer;
}

static int ff_spin(ff_frame_state* s) {
    const uint32_t expected = s->expected;
    for (int32_t i = 0; i < s->n_done; ++i) {
        int64_t spins = 0;
        if (s->bell) {
            while (s->done[i] != expected)
                if (++spins > s->spin_limit) return FF_SPINNING;
        } else {
            while (!s->done[i])
                if (++spins > s->spin_limit) return FF_SPINNING;
        }
    }
    s->unwaited = 0;
    return FF_DONE;
}

int ff_frame(ff_frame_state* s) {
    if (s->unwaited) return FF_UNWAITED;
    if (s->frame) {
        // NaN * 0 and Inf * 0 are NaN, finite * 0 is 0: one pass, one branch at the end
        float probe = 0.0f;
        for (int64_t i = 0; i < s->frame_floats; ++i) probe += s->frame[i] * 0.0f;
        if (probe != probe) return FF_NONFINITE;
    }
    const int64_t start = ff_now_ns();
    if (s->bell) {
        if (!s->running) return FF_NOT_RUNNING;
        s->frames += 1;
        const uint64_t count = (uint64_t)(s->epoch_base + s->frames - 1);
        s->expected = (uint32_t)(count % 0xffffffffull) + 1u;
        const uint64_t tag = (uint64_t)s->expected << 32;
        for (int32_t k = 0; k < s->tag_inputs; ++k) {
            const uint32_t* src = s->tag_src[k];
            volatile uint64_t* dst = s->tag_dst[k];
            for (int64_t i = 0; i < s->tag_len[k]; ++i) dst[i] = tag | src[i];
        }
        // the bell after the frame (its floats written before this call, its words above): x86
        // stores are seen in order; the fence keeps the compiler (and a weaker host) from moving it
        __atomic_thread_fence(__ATOMIC_RELEASE);
        *s->bell = (uint32_t)s->frames;
    } else {
        memset((void*)s->done, 0, 4u * (uint32_t)s->n_done);
        const int err = s->launch(s->exec[s->parity], s->stream);
        if (err) {
            s->error = err;
            return FF_LAUNCH_FAILED;
        }
    }
    s->launch_ns = ff_now_ns() - start;
    s->launches += 1;
    s->unwaited = 1;
    if (s->n_execs == 2) s->parity ^= 1;
    return ff_wait(s);
}

// The struct's size and each field's offset, in declaration order: hostpath.py checks its
// ctypes mirror against them before the first frame.
int ff_layout(int64_t* out, int n) {
    const int64_t values[] = {
        (int64_t)sizeof(ff_frame_state),
        offsetof(ff_frame_state, launch), offsetof(ff_frame_state, exec), offsetof(ff_frame_state, stream),
        offsetof(ff_frame_state, done), offsetof(ff_frame_state, bell), offsetof(ff_frame_state, frame),
        offsetof(ff_frame_state, frame_floats), offsetof(ff_frame_state, spin_limit),
        offsetof(ff_frame_state, launches), offsetof(ff_frame_state, epoch_base), offsetof(ff_frame_state, frames),
        offsetof(ff_frame_state, launch_ns), offsetof(ff_frame_state, wait_ns), offsetof(ff_frame_state, expected),
        offsetof(ff_frame_state, n_done), offsetof(ff_frame_state, n_execs),
        offsetof(ff_frame_state, parity), offsetof(ff_frame_state, unwaited), offsetof(ff_frame_state, running),
        offsetof(ff_frame_state, error), offsetof(ff_frame_state, pad),
        offsetof(ff_frame_state, tag_src), offsetof(ff_frame_state, tag_dst), offsetof(ff_frame_state, tag_len),
        offsetof(ff_frame_state, tag_inputs), offsetof(ff_frame_state, pad2),
    };
    const int count = (int)(sizeof(values) / sizeof(values[0]));
    for (int i = 0; i < n && i < count; ++i) out[i] = values[i];
    return count;
}
