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
// Built with the Python headers (FF_PYTHON, where they are installed), the same library is also
// the extension module framefuse_hostpath, whose step(context, frame) is Session.step's whole hot
// path: the frame's type, dtype and shape looked at, the frame copied into the mapped input,
// ff_frame, the latency recorded, the session's output returned. Through ctypes, the call alone,
// numpy's copy of the frame and a clock pair cost 1.1 us on the H200's host
// (bench/microbench/host_calls.py, 2026-12-04), before the Python latency record.
//
// Every field is read and written by Python too (ctypes.Structure in hostpath.py, same order and
// types): this file owns nothing.
#ifdef FF_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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
    int64_t launch_ns;          // the last frame: its check, the done words' clearing, the launch (or bell) call
    int64_t wait_ns;            // the last frame: the spin on its done words (the GPU's time, not host work)
    int64_t start_ns;           // the last frame: CLOCK_MONOTONIC (Python's perf_counter_ns) at ff_frame's entry
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
    // resident mode, the frame's words and the bell in write-combined memory (engines/stepkernel.py's
    // RESIDENT_WRITE_COMBINED_FRAMES): a store fence after the words and after the bell, which
    // sends them out of the CPU's write-combining buffers now (and the words before the bell)
    int32_t flush_frame;
    // the kernel's outputs as words (epoch << 32) | float bits (codegen.TAGGED_OUTPUTS): after the
    // done words, output k's words (out_words[k], out_len[k] of them) until each carries the
    // frame's epoch (resident) or any epoch (launched: the words were cleared before the launch),
    // each word's float into out_floats[k] as it is taken
    volatile uint64_t* const* out_words;
    float* const* out_floats;
    const int64_t* out_len;
    int32_t out_tensors;
    // resident mode with frame-block replicas (codegen.RESIDENT_FRAMER_REPLICAS): 1 when each of
    // tag_dst[k]'s buffers holds two frames' words, the even frames' then the odd frames' (tag_len[k]
    // words on), so the next frame never overwrites words a replica has yet to read
    int32_t tag_flip;
} ff_frame_state;

enum {
    FF_DONE = 0,        // launched (or rung) and every done word is up
    FF_NONFINITE = 1,   // the frame holds NaN or Inf: nothing launched
    FF_LAUNCH_FAILED = 2,
    FF_SPINNING = 3,    // launched, the done words not up after spin_limit polls: wait in Python
    FF_UNWAITED = 4,    // an earlier launch was never waited on: nothing launched
    FF_NOT_RUNNING = 5  // resident kernel not running: nothing rung
};

// The store fence write-combined memory needs: x86's sfence drains the write-combining buffers and
// orders the stores before it ahead of those after it (write-combined stores are weakly ordered).
void ff_store_fence(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_sfence();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static int64_t ff_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// Poll until every done word is up: non-zero (launched: the words were cleared before the launch)
// or equal to `expected` (resident: the words carry each frame's epoch). The loads acquire: what
// the word's writer wrote before it (the outputs) is read after it (a plain load on x86).
static int ff_spin(ff_frame_state* s) {
    const uint32_t expected = s->expected;
    for (int32_t i = 0; i < s->n_done; ++i) {
        int64_t spins = 0;
        if (s->bell) {
            while (__atomic_load_n(&s->done[i], __ATOMIC_ACQUIRE) != expected)
                if (++spins > s->spin_limit) return FF_SPINNING;
        } else {
            while (!__atomic_load_n(&s->done[i], __ATOMIC_ACQUIRE))
                if (++spins > s->spin_limit) return FF_SPINNING;
        }
    }
    // tagged outputs: every word once it carries the frame's epoch; a word taken twice (after
    // FF_SPINNING, a call again) is taken the same
    for (int32_t k = 0; k < s->out_tensors; ++k) {
        volatile uint64_t* words = s->out_words[k];
        uint32_t* floats = (uint32_t*)s->out_floats[k];
        for (int64_t i = 0; i < s->out_len[k]; ++i) {
            int64_t spins = 0;
            uint64_t w;
            if (s->bell) {
                while ((uint32_t)((w = __atomic_load_n(&words[i], __ATOMIC_ACQUIRE)) >> 32) != expected)
                    if (++spins > s->spin_limit) return FF_SPINNING;
            } else {
                while (!((w = __atomic_load_n(&words[i], __ATOMIC_ACQUIRE)) >> 32))
                    if (++spins > s->spin_limit) return FF_SPINNING;
            }
            floats[i] = (uint32_t)w;
        }
    }
    s->unwaited = 0;
    return FF_DONE;
}

// ff_spin, timed: wait_ns.
int ff_wait(ff_frame_state* s) {
    const int64_t start = ff_now_ns();
    const int answer = ff_spin(s);
    s->wait_ns = ff_now_ns() - start;
    return answer;
}

// 1 when some float of `v` is NaN or +-Inf (every exponent bit set). An integer OR over the words
// vectorises; a float sum of v[i] * 0 (the same test) is a chain the compiler may not reorder.
static int ff_nonfinite(const float* v, int64_t n) {
    const uint32_t* w = (const uint32_t*)v;
    uint32_t any = 0;
    for (int64_t i = 0; i < n; ++i) any |= (uint32_t)((w[i] & 0x7f800000u) == 0x7f800000u);
    return any != 0;
}

int ff_frame(ff_frame_state* s) {
    const int64_t start = ff_now_ns();
    s->start_ns = start;
    if (s->unwaited) return FF_UNWAITED;
    if (s->frame && ff_nonfinite(s->frame, s->frame_floats)) return FF_NONFINITE;
    if (s->bell) {
        if (!s->running) return FF_NOT_RUNNING;
        s->frames += 1;
        const uint64_t count = (uint64_t)(s->epoch_base + s->frames - 1);
        s->expected = (uint32_t)(count % 0xffffffffull) + 1u;
        const uint64_t tag = (uint64_t)s->expected << 32;
        // (frames counts from 1 and the kernel's frames from 0: frame 2 is the kernel's odd frame 1)
        const int64_t odd = s->tag_flip && !(s->frames & 1);
        for (int32_t k = 0; k < s->tag_inputs; ++k) {
            const uint32_t* src = s->tag_src[k];
            volatile uint64_t* dst = s->tag_dst[k] + odd * s->tag_len[k];
            for (int64_t i = 0; i < s->tag_len[k]; ++i) dst[i] = tag | src[i];
        }
        // the bell after the frame (its floats written before this call, its words above): x86
        // stores to write-back memory are seen in order; the release keeps the compiler (and a
        // weaker host) from moving it. Write-combined words and bell: fenced (ff_store_fence).
        if (s->flush_frame) ff_store_fence();
        __atomic_store_n(s->bell, (uint32_t)s->frames, __ATOMIC_RELEASE);
        if (s->flush_frame) ff_store_fence();
    } else {
        memset((void*)s->done, 0, 4u * (uint32_t)s->n_done);
        for (int32_t k = 0; k < s->out_tensors; ++k) memset((void*)s->out_words[k], 0, 8u * (uint64_t)s->out_len[k]);
        const int err = s->launch(s->exec[s->parity], s->stream);
        if (err) {
            s->error = err;
            return FF_LAUNCH_FAILED;
        }
    }
    const int64_t launched = ff_now_ns();
    s->launch_ns = launched - start;
    s->launches += 1;
    s->unwaited = 1;
    if (s->n_execs == 2) s->parity ^= 1;
    const int answer = ff_spin(s);
    s->wait_ns = ff_now_ns() - launched;
    return answer;
}

// -- the CPU step on a core of its own (engines/cpustep.py: CpuResidentBinding) -------------------
//
// Why: a game's own work between two frames evicts the CPU step's weights and code from the
// caller's caches (engines/framegap.py: the GPT-2 test model's step 19.5 us back to back, 40.0
// after 4 MiB written on the CI machine, 25.4 on this worker). A worker thread that does nothing else keeps them in its
// core's L1/L2 from one frame to the next; a frame is then ff_frame's bell path, the same protocol
// as the resident GPU kernel: the frame written, its epoch in `expected`, the bell rung; the
// worker runs the step (`launch` with the io block of its state parity) and raises the done word
// to the epoch. The worker spins on the bell while it waits (a core held, as the resident kernel
// holds its SMs), with sched_yield() every `yield_polls` polls so that threads pinned to the same
// core still run.
typedef struct {
    ff_frame_state* frame;  // the binding's frame state: its bell, expected, launch, exec, done[0]
    int64_t answered;       // frames answered since the start
    int64_t yield_polls;    // polls of an unrung bell between two sched_yield()s (0: never)
    int32_t stop;           // ff_worker_stop sets it; the worker exits at its next poll
    int32_t parity;         // the io block (state half) the next frame runs with
    int32_t started;        // 1 between ff_worker_start and ff_worker_stop
    int32_t error;          // pthread_create's error, when it failed
    uint32_t seen;          // the bell's value when the worker was started: not a ring
    int32_t tid;            // the worker's thread id (/proc/self/task/<tid>), set by the worker
    uint64_t thread;        // its pthread_t
} ff_cpu_worker;

static void* ff_worker_main(void* arg) {
    ff_cpu_worker* w = (ff_cpu_worker*)arg;
    ff_frame_state* s = w->frame;
    uint32_t seen = w->seen;  // read before the thread began: a ring right after the start is seen
    int64_t idle = 0;
    __atomic_store_n(&w->tid, (int32_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    for (;;) {
        const uint32_t rung = __atomic_load_n(s->bell, __ATOMIC_ACQUIRE);
        if (rung == seen) {
            if (__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) break;
            if (w->yield_polls > 0 && ++idle >= w->yield_polls) {
                idle = 0;
                sched_yield();
            } else {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
            continue;
        }
        seen = rung;
        idle = 0;
        const uint32_t expected = __atomic_load_n(&s->expected, __ATOMIC_RELAXED);  // written before the bell
        s->launch(s->exec[w->parity], NULL);
        if (s->n_execs == 2) w->parity ^= 1;
        w->answered += 1;
        __atomic_store_n(&s->done[0], expected, __ATOMIC_RELEASE);
    }
    return NULL;
}

// Start the worker (the bell as it is now is "not rung"); 0, or pthread_create's error.
int ff_worker_start(ff_cpu_worker* w) {
    if (w->started) return 0;
    w->stop = 0;
    w->answered = 0;
    w->seen = __atomic_load_n(w->frame->bell, __ATOMIC_ACQUIRE);
    w->tid = 0;
    pthread_t thread;
    const int err = pthread_create(&thread, NULL, ff_worker_main, w);
    if (err) {
        w->error = err;
        return err;
    }
    w->thread = (uint64_t)thread;
    w->started = 1;
    return 0;
}

// Stop the worker and join it (it answers no frame after this returns); 0, or pthread_join's error.
int ff_worker_stop(ff_cpu_worker* w) {
    if (!w->started) return 0;
    __atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
    const int err = pthread_join((pthread_t)w->thread, NULL);
    w->started = 0;
    return err;
}

int ff_worker_layout(int64_t* out, int n) {
    const int64_t values[] = {
        (int64_t)sizeof(ff_cpu_worker),     offsetof(ff_cpu_worker, frame),   offsetof(ff_cpu_worker, answered),
        offsetof(ff_cpu_worker, yield_polls), offsetof(ff_cpu_worker, stop),
        offsetof(ff_cpu_worker, parity),    offsetof(ff_cpu_worker, started),
        offsetof(ff_cpu_worker, error),     offsetof(ff_cpu_worker, seen),    offsetof(ff_cpu_worker, tid),
        offsetof(ff_cpu_worker, thread),
    };
    const int count = (int)(sizeof(values) / sizeof(values[0]));
    for (int i = 0; i < n && i < count; ++i) out[i] = values[i];
    return count;
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
        offsetof(ff_frame_state, launch_ns), offsetof(ff_frame_state, wait_ns), offsetof(ff_frame_state, start_ns),
        offsetof(ff_frame_state, expected), offsetof(ff_frame_state, n_done), offsetof(ff_frame_state, n_execs),
        offsetof(ff_frame_state, parity), offsetof(ff_frame_state, unwaited), offsetof(ff_frame_state, running),
        offsetof(ff_frame_state, error), offsetof(ff_frame_state, pad),
        offsetof(ff_frame_state, tag_src), offsetof(ff_frame_state, tag_dst), offsetof(ff_frame_state, tag_len),
        offsetof(ff_frame_state, tag_inputs), offsetof(ff_frame_state, flush_frame),
        offsetof(ff_frame_state, out_words), offsetof(ff_frame_state, out_floats), offsetof(ff_frame_state, out_len),
        offsetof(ff_frame_state, out_tensors), offsetof(ff_frame_state, tag_flip),
    };
    const int count = (int)(sizeof(values) / sizeof(values[0]));
    for (int i = 0; i < n && i < count; ++i) out[i] = values[i];
    return count;
}

#ifdef FF_PYTHON
// -- the extension module: Session.step's hot path --------------------------------------------------

// numpy's PyArrayObject_fields up to its flags: public, and the same from numpy 1.7 through 2.x.
// hostpath.py checks what ff_probe reads here against numpy's own answers before using it.
typedef struct {
    PyObject_HEAD char* data;
    int nd;
    Py_ssize_t* dimensions;
    Py_ssize_t* strides;
    PyObject* base;
    PyObject* descr;
    int flags;
} ff_ndarray;
#define FF_NPY_C_CONTIGUOUS 0x0001

#define FF_MAX_DIMS 8
// LatencyStats' counters (runtime/stats.py, an array of int64 shared with Python)
enum { FF_STAT_NEXT, FF_STAT_COUNT, FF_STAT_OVERRUNS, FF_STAT_MAX, FF_STAT_BUDGET, FF_STAT_CAPACITY };

typedef struct {
    ff_frame_state* state;
    PyObject* ndarray;  // numpy.ndarray: a frame of exactly this type, ...
    PyObject* dtype;    // ... of exactly this dtype (numpy's float32 singleton), ...
    PyObject* out;      // the session's output: returned as it is after every frame
    char* buffer;       // the mapped frame input the frame is copied into
    int64_t nbytes;
    int64_t shape[FF_MAX_DIMS];  // ... of this shape and C-contiguous: anything else is Python's
    int32_t ndim;
    int32_t pad;
    int64_t* ring;   // LatencyStats' ring of durations (ns)
    int64_t* stats;  // its counters (FF_STAT_*)
} ff_step_context;

static void ff_record(int64_t* ring, int64_t* stats, int64_t ns) {
    int64_t i = stats[FF_STAT_NEXT];
    ring[i] = ns;
    stats[FF_STAT_NEXT] = i + 1 < stats[FF_STAT_CAPACITY] ? i + 1 : 0;
    stats[FF_STAT_COUNT] += 1;
    if (ns > stats[FF_STAT_MAX]) stats[FF_STAT_MAX] = ns;
    if (stats[FF_STAT_BUDGET] >= 0 && ns > stats[FF_STAT_BUDGET]) stats[FF_STAT_OVERRUNS] += 1;
}

// step(context, frame): the session's output once the frame is done; None when the frame is not
// a C-contiguous float32 numpy array of the input's shape (nothing was done: Python's path takes
// it); else the ff_frame code (an int) of a frame that was copied in and ran into that code.
// The GIL is held throughout: the spin is bounded by spin_limit, and giving the GIL up would let
// another thread keep this one from its answer.
static PyObject* ff_py_step(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "step(context, frame) takes 2 arguments");
        return NULL;
    }
    ff_step_context* c = (ff_step_context*)PyLong_AsVoidPtr(args[0]);
    if (c == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "step: a null context");
        return NULL;
    }
    PyObject* frame = args[1];
    if ((PyObject*)Py_TYPE(frame) != c->ndarray) Py_RETURN_NONE;
    const ff_ndarray* a = (const ff_ndarray*)frame;
    if (a->descr != c->dtype || a->nd != c->ndim || !(a->flags & FF_NPY_C_CONTIGUOUS)) Py_RETURN_NONE;
    for (int32_t i = 0; i < c->ndim; ++i)
        if (a->dimensions[i] != c->shape[i]) Py_RETURN_NONE;
    memcpy(c->buffer, a->data, (size_t)c->nbytes);
    const int code = ff_frame(c->state);
    if (code != FF_DONE) return PyLong_FromLong(code);
    const ff_frame_state* s = c->state;
    ff_record(c->ring, c->stats, s->launch_ns + s->wait_ns);  // from ff_frame's entry to the answer
    Py_INCREF(c->out);
    return c->out;
}

// probe(array) -> (data, nd, dimensions, flags, descr id): what step reads of a numpy array (the
// caller passes an ndarray: hostpath.py, on arrays it made, to check the layout above).
static PyObject* ff_py_probe(PyObject* module, PyObject* array) {
    (void)module;
    const ff_ndarray* a = (const ff_ndarray*)array;
    PyObject* dims = PyTuple_New(a->nd);
    if (dims == NULL) return NULL;
    for (int i = 0; i < a->nd; ++i) PyTuple_SET_ITEM(dims, i, PyLong_FromSsize_t(a->dimensions[i]));
    return Py_BuildValue("(KiNiK)", (unsigned long long)(uintptr_t)a->data, a->nd, dims, a->flags,
                         (unsigned long long)(uintptr_t)a->descr);
}

static PyObject* ff_py_layout(PyObject* module, PyObject* unused) {
    (void)module;
    (void)unused;
    return Py_BuildValue(
        "(nnnnnnnnnnnn)", (Py_ssize_t)sizeof(ff_step_context), (Py_ssize_t)offsetof(ff_step_context, state),
        (Py_ssize_t)offsetof(ff_step_context, ndarray), (Py_ssize_t)offsetof(ff_step_context, dtype),
        (Py_ssize_t)offsetof(ff_step_context, out), (Py_ssize_t)offsetof(ff_step_context, buffer),
        (Py_ssize_t)offsetof(ff_step_context, nbytes), (Py_ssize_t)offsetof(ff_step_context, shape),
        (Py_ssize_t)offsetof(ff_step_context, ndim), (Py_ssize_t)offsetof(ff_step_context, pad),
        (Py_ssize_t)offsetof(ff_step_context, ring), (Py_ssize_t)offsetof(ff_step_context, stats));
}

static PyMethodDef ff_methods[] = {
    {"step", (PyCFunction)(void (*)(void))ff_py_step, METH_FASTCALL, "Session.step's hot path (hostpath.py)"},
    {"probe", ff_py_probe, METH_O, "what step reads of a numpy array"},
    {"layout", ff_py_layout, METH_NOARGS, "ff_step_context's size and offsets"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ff_module = {PyModuleDef_HEAD_INIT, "framefuse_hostpath", NULL, -1, ff_methods};

PyMODINIT_FUNC PyInit_framefuse_hostpath(void) { return PyModule_Create(&ff_module); }
#endif
