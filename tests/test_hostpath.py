"""engines/hostpath.c, the step kernel's per-frame host work in one call, without a GPU: a Python
callback stands in for cuGraphLaunch (it is the only thing the C calls), and plain host arrays for
the mapped done words, bell and frame."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from framefuse.engines import hostpath

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the bindings keep the Python path")
    mp = pytest.MonkeyPatch()
    mp.setenv("FRAMEFUSE_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("FRAMEFUSE_HOSTPATH", raising=False)
    hostpath._reset_for_tests()
    loaded = hostpath.load()
    assert loaded is not None, hostpath.status()
    yield loaded
    hostpath._reset_for_tests()
    mp.undo()


class Fake:
    """A frame state over host arrays and a launch that records its arguments and, like the
    kernel, raises the done words (unless told not to)."""

    def __init__(self, n_done=3, n_execs=2, frame=None, raise_done=True, answer=0):
        self.done = np.zeros(n_done, dtype=np.uint32)
        self.calls: list[tuple] = []
        self.raise_done, self.answer = raise_done, answer

        def launch(exec_handle, stream):
            self.calls.append((exec_handle, stream, self.done.copy()))
            if self.raise_done and not self.answer:
                self.done[:] = 7
            return self.answer

        self.launch = LAUNCH(launch)  # kept alive with the fake
        s = self.state = hostpath.FrameState()
        s.launch = ctypes.cast(self.launch, ctypes.c_void_p).value
        s.exec[0], s.exec[1] = 0x1000, 0x2000
        s.stream = 0x3000
        s.done = self.done.ctypes.data
        s.n_done = n_done
        s.n_execs = n_execs
        s.spin_limit = 1000
        if frame is not None:
            self.frame = frame
            s.frame, s.frame_floats = frame.ctypes.data, frame.size


def test_layout_matches_the_c_struct(lib):
    assert hostpath.status().startswith("native")


def test_a_frame_clears_the_done_words_launches_the_parity_and_waits(lib):
    frame_call, _ = lib
    fake = Fake()
    fake.done[:] = 5  # the last frame's words: cleared before the launch
    s = fake.state
    for i in range(4):
        assert frame_call(ctypes.pointer(s)) == hostpath.DONE
        exec_handle, stream, done_at_launch = fake.calls[-1]
        assert exec_handle == (0x1000 if i % 2 == 0 else 0x2000)  # the graphs alternate with the state halves
        assert stream == 0x3000
        assert not done_at_launch.any()
    assert s.launches == 4 and s.parity == 0 and s.unwaited == 0


def test_one_graph_keeps_its_parity(lib):
    frame_call, _ = lib
    fake = Fake(n_execs=1)
    for _ in range(3):
        assert frame_call(ctypes.pointer(fake.state)) == hostpath.DONE
    assert [c[0] for c in fake.calls] == [0x1000] * 3 and fake.state.parity == 0


def test_a_failed_launch_reports_its_error_and_changes_nothing(lib):
    frame_call, _ = lib
    fake = Fake(answer=719)
    s = fake.state
    assert frame_call(ctypes.pointer(s)) == hostpath.LAUNCH_FAILED
    assert s.error == 719 and s.launches == 0 and s.parity == 0 and s.unwaited == 0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_frame_is_refused_before_the_launch(lib, bad):
    frame_call, _ = lib
    frame = np.ones(67, dtype=np.float32)  # odd size: the check walks every element
    frame[66] = bad
    fake = Fake(frame=frame)
    assert frame_call(ctypes.pointer(fake.state)) == hostpath.NONFINITE
    assert fake.calls == [] and fake.state.launches == 0
    frame[66] = np.float32(3.4e38)  # finite, however large
    assert frame_call(ctypes.pointer(fake.state)) == hostpath.DONE and len(fake.calls) == 1


def test_no_frame_pointer_no_check(lib):
    frame_call, _ = lib
    fake = Fake()
    assert fake.state.frame is None
    assert frame_call(ctypes.pointer(fake.state)) == hostpath.DONE


def test_a_silent_kernel_leaves_the_wait_to_python_and_blocks_the_next_launch(lib):
    frame_call, wait = lib
    fake = Fake(raise_done=False)
    s = fake.state
    assert frame_call(ctypes.pointer(s)) == hostpath.SPINNING
    assert s.unwaited == 1 and s.launches == 1
    assert frame_call(ctypes.pointer(s)) == hostpath.UNWAITED  # its words could still land
    assert len(fake.calls) == 1
    fake.done[:2] = 1
    assert wait(ctypes.pointer(s)) == hostpath.SPINNING  # one word still down
    fake.done[2] = 1
    assert wait(ctypes.pointer(s)) == hostpath.DONE and s.unwaited == 0


def test_resident_rings_the_bell_with_the_frame_number_and_waits_for_its_epoch(lib):
    frame_call, wait = lib
    fake = Fake(raise_done=False)
    bell = np.zeros(1, dtype=np.uint32)
    s = fake.state
    s.bell = bell.ctypes.data
    assert frame_call(ctypes.pointer(s)) == hostpath.NOT_RUNNING and bell[0] == 0
    s.running, s.epoch_base = 1, 41
    fake.done[:] = 42  # the epoch of the first frame after 41 launches
    assert frame_call(ctypes.pointer(s)) == hostpath.DONE
    assert bell[0] == 1 and s.expected == 42 and s.frames == 1 and fake.calls == []  # nothing launched
    assert frame_call(ctypes.pointer(s)) == hostpath.SPINNING  # the words still carry 42
    assert bell[0] == 2 and s.expected == 43
    fake.done[:] = 43
    assert wait(ctypes.pointer(s)) == hostpath.DONE


def test_resident_epochs_wrap_as_the_kernels_do(lib):
    frame_call, _ = lib
    fake = Fake()
    bell = np.zeros(1, dtype=np.uint32)
    s = fake.state
    s.bell, s.running = bell.ctypes.data, 1
    s.epoch_base = 0xFFFFFFFF - 1  # the kernel's epoch: count % 0xffffffff + 1, never 0
    for expected in (0xFFFFFFFF, 1, 2):
        fake.done[:] = expected
        assert frame_call(ctypes.pointer(s)) == hostpath.DONE and s.expected == expected


@pytest.mark.parametrize("flush_frame", [0, 1])
def test_resident_tags_each_input_float_with_the_frames_epoch_before_the_bell(lib, flush_frame):
    """Tagged frames: every input's floats land in its words as (epoch << 32) | bits, the frame's
    epoch in the high half, whatever the floats are (NaN bits are not checked here: no frame
    pointer), and a second frame re-tags them with its own epoch. With flush_frame (write-combined
    words and bell, fenced) the same words and bell."""
    frame_call, _ = lib
    fake = Fake(raise_done=False)
    bell = np.zeros(1, dtype=np.uint32)
    s = fake.state
    s.bell, s.running, s.epoch_base, s.flush_frame = bell.ctypes.data, 1, 6, flush_frame
    inputs = [np.array([1.5, -0.0, 3e38], dtype=np.float32), np.arange(5, dtype=np.float32)]
    words = [np.zeros(x.size, dtype=np.uint64) for x in inputs]
    src = (ctypes.c_void_p * 2)(*[x.ctypes.data for x in inputs])
    dst = (ctypes.c_void_p * 2)(*[w.ctypes.data for w in words])
    lengths = (ctypes.c_int64 * 2)(*[x.size for x in inputs])
    s.tag_src, s.tag_dst, s.tag_len, s.tag_inputs = (
        ctypes.addressof(src),
        ctypes.addressof(dst),
        ctypes.addressof(lengths),
        2,
    )
    for epoch in (7, 8):
        fake.done[:] = epoch
        inputs[1] += 1
        assert frame_call(ctypes.pointer(s)) == hostpath.DONE and s.expected == epoch
        assert bell[0] == epoch - 6
        for x, w in zip(inputs, words):
            assert np.array_equal(w >> np.uint64(32), np.full(x.size, epoch, dtype=np.uint64))
            assert np.array_equal((w & np.uint64(0xFFFFFFFF)).astype(np.uint32), x.view(np.uint32))


def test_resident_tag_flip_writes_even_and_odd_frames_to_their_own_halves(lib):
    """Frame-block replicas (codegen.RESIDENT_FRAMER_REPLICAS): with tag_flip each entry's buffer
    holds two frames' words, the kernel's even frames (the host's frames 1, 3, ...) in its first
    tag_len words and the odd ones after them; two entries (two copies of one input) get the same
    words, and a frame leaves the other half as the frame before wrote it."""
    frame_call, _ = lib
    fake = Fake(raise_done=False)
    bell = np.zeros(1, dtype=np.uint32)
    s = fake.state
    s.bell, s.running, s.epoch_base, s.tag_flip = bell.ctypes.data, 1, 0, 1
    x = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    words = np.zeros(4 * x.size, dtype=np.uint64)  # [copy 0 even | copy 0 odd | copy 1 even | copy 1 odd]
    src = (ctypes.c_void_p * 2)(x.ctypes.data, x.ctypes.data)
    dst = (ctypes.c_void_p * 2)(words.ctypes.data, words.ctypes.data + 8 * 2 * x.size)
    lengths = (ctypes.c_int64 * 2)(x.size, x.size)
    s.tag_src, s.tag_dst, s.tag_len, s.tag_inputs = (
        ctypes.addressof(src),
        ctypes.addressof(dst),
        ctypes.addressof(lengths),
        2,
    )
    halves = words.reshape(2, 2, x.size)  # copy, parity
    for epoch in (1, 2, 3):
        fake.done[:] = epoch
        x += 1
        assert frame_call(ctypes.pointer(s)) == hostpath.DONE and s.expected == epoch
        parity = (epoch - 1) % 2
        for copy in range(2):
            written = halves[copy, parity]
            assert np.array_equal(written >> np.uint64(32), np.full(x.size, epoch, dtype=np.uint64))
            assert np.array_equal((written & np.uint64(0xFFFFFFFF)).astype(np.uint32), x.view(np.uint32))
            other = halves[copy, 1 - parity] >> np.uint64(32)
            assert np.array_equal(other, np.full(x.size, epoch - 1, dtype=np.uint64))  # the frame before's (0: none)


def _tagged_outputs(state, sizes):
    """Output words and the float arrays they go to, pointed at by ``state`` (kept alive by the caller)."""
    words = [np.zeros(n, dtype=np.uint64) for n in sizes]
    floats = [np.full(n, np.nan, dtype=np.float32) for n in sizes]
    keep = (
        (ctypes.c_void_p * len(sizes))(*[w.ctypes.data for w in words]),
        (ctypes.c_void_p * len(sizes))(*[f.ctypes.data for f in floats]),
        (ctypes.c_int64 * len(sizes))(*sizes),
    )
    state.out_words, state.out_floats, state.out_len = (ctypes.addressof(a) for a in keep)
    state.out_tensors = len(sizes)
    return words, floats, keep


def _word(epoch, value):
    return np.uint64((epoch << 32) | int(np.float32(value).view(np.uint32)))


def test_launched_tagged_outputs_are_cleared_before_the_launch_and_taken_once_every_word_has_an_epoch(lib):
    """codegen.TAGGED_OUTPUTS, launched: ff_frame clears the output words with the done words before
    the launch, ff_spin waits (after the done words) until every word carries an epoch, and writes
    each word's low half into its float; a word still 0 leaves the wait to Python."""
    frame_call, wait = lib
    fake = Fake(n_done=1)
    s = fake.state
    words, floats, keep = _tagged_outputs(s, [3, 2])
    words[0][:] = _word(9, 1.0)  # the last frame's: cleared before this launch
    seen = []

    def launch(exec_handle, stream):
        seen.append([w.copy() for w in words])
        fake.done[:] = 7
        words[0][:] = [_word(5, v) for v in (1.5, -0.0, 3e38)]
        words[1][0] = _word(5, -2.0)  # words[1][1] not yet
        return 0

    fake.launch = LAUNCH(launch)
    s.launch = ctypes.cast(fake.launch, ctypes.c_void_p).value
    assert frame_call(ctypes.pointer(s)) == hostpath.SPINNING
    assert all(not w.any() for w in seen[0])  # cleared before the launch
    words[1][1] = _word(5, 0.25)
    assert wait(ctypes.pointer(s)) == hostpath.DONE and s.unwaited == 0
    assert np.array_equal(floats[0].view(np.uint32), np.array([1.5, -0.0, 3e38], dtype=np.float32).view(np.uint32))
    assert np.array_equal(floats[1], np.array([-2.0, 0.25], dtype=np.float32))


def test_resident_tagged_outputs_wait_for_the_frames_epoch(lib):
    """Resident: an output word is taken only once it carries this frame's epoch (the last frame's
    words are still there when the bell rings: nothing clears them), NaN bits included."""
    frame_call, wait = lib
    fake = Fake(n_done=1, raise_done=False)
    bell = np.zeros(1, dtype=np.uint32)
    s = fake.state
    s.bell, s.running, s.epoch_base = bell.ctypes.data, 1, 0
    words, floats, keep = _tagged_outputs(s, [2])
    fake.done[:] = 1
    words[0][:] = [_word(1, 3.0), _word(1, np.nan)]
    assert frame_call(ctypes.pointer(s)) == hostpath.DONE and s.expected == 1
    assert floats[0][0] == 3.0 and np.isnan(floats[0][1])
    fake.done[:] = 2  # frame 2's done word is up, its outputs not yet
    assert frame_call(ctypes.pointer(s)) == hostpath.SPINNING and s.expected == 2
    words[0][0] = _word(2, 4.0)
    assert wait(ctypes.pointer(s)) == hostpath.SPINNING  # one word still frame 1's
    words[0][1] = _word(2, -1.0)
    assert wait(ctypes.pointer(s)) == hostpath.DONE
    assert np.array_equal(floats[0], np.array([4.0, -1.0], dtype=np.float32))


def test_the_store_fence_is_loaded_with_the_frame_call(lib):
    fence = hostpath.store_fence()
    assert fence is not None
    fence()  # an sfence (x86) or a full fence: returns


def test_write_combined_words_are_whole_64_bit_words_of_the_epoch_and_the_bits():
    """stepkernel.tag_words, the Python frame path's words for write-combined memory: the epoch in
    the high half, the float's bits (NaN, -0.0, the largest float) in the low, into the given words."""
    from framefuse.engines.stepkernel import tag_words

    floats = np.array([1.5, -0.0, np.nan, 3.4028235e38, -np.inf], dtype=np.float32)
    scratch = np.full(floats.size, 0xDEAD, dtype=np.uint64)
    words = np.zeros(floats.size, dtype=np.uint64)
    for epoch in (1, 0xFFFFFFFF):
        tag_words(floats.view(np.uint32), scratch, words, epoch)
        assert np.array_equal(words >> np.uint64(32), np.full(floats.size, epoch, dtype=np.uint64))
        assert np.array_equal((words & np.uint64(0xFFFFFFFF)).astype(np.uint32), floats.view(np.uint32))


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("FRAMEFUSE_HOSTPATH", "0")
    hostpath._reset_for_tests()
    try:
        assert hostpath.load() is None
        assert hostpath.status() == "python (FRAMEFUSE_HOSTPATH=0)"
    finally:
        hostpath._reset_for_tests()


def test_a_broken_compiler_falls_back_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    monkeypatch.delenv("FRAMEFUSE_HOSTPATH", raising=False)
    hostpath._reset_for_tests()
    try:
        assert hostpath.load() is None
        assert hostpath.status().startswith("python (build failed: false -O2")
        assert hostpath.status().endswith("failed: exit status 1)")
        assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.tmp"))
    finally:
        hostpath._reset_for_tests()


def test_the_frame_times_its_launch_and_its_wait(lib):
    frame_call, _ = lib
    fake = Fake()
    s = fake.state
    assert frame_call(ctypes.pointer(s)) == hostpath.DONE
    assert 0 < s.launch_ns < 10**9 and 0 <= s.wait_ns < 10**9


# -- the extension module's step (Session.step's hot path) ------------------------------------------


@pytest.fixture
def extension(lib):
    module = hostpath.extension()
    if module is None:
        pytest.skip(f"the extension is not built here: {hostpath.status()}")
    return module


class FastStep:
    """hostpath.StepContext over a Fake frame state, a frame buffer, an output object and a
    LatencyStats: what Session gives the extension's step."""

    def __init__(self, shape=(1, 6), budget_ms=None, **fake):
        from framefuse.runtime.stats import LatencyStats

        self.buffer = np.zeros(shape, dtype=np.float32)
        self.fake = Fake(frame=self.buffer.reshape(-1), **fake)
        self.out = np.full(3, 7.0, dtype=np.float32)
        self.stats = LatencyStats(capacity=4, budget_ms=budget_ms)
        c = self.context = hostpath.StepContext()
        c.state = ctypes.addressof(self.fake.state)
        c.ndarray, c.dtype, c.out = np.ndarray, np.dtype(np.float32), self.out
        c.buffer, c.nbytes = self.buffer.ctypes.data, self.buffer.nbytes
        c.shape[: len(shape)] = shape
        c.ndim = len(shape)
        c.ring, c.stats = self.stats.buffers()
        self.address = ctypes.addressof(c)


def test_the_extension_step_copies_the_frame_launches_records_and_returns_the_output(extension):
    fast = FastStep()
    for i in range(6):  # past the ring's capacity of 4
        frame = np.arange(6, dtype=np.float32).reshape(1, 6) + i
        assert extension.step(fast.address, frame) is fast.out
        assert np.array_equal(fast.buffer, frame)
        s = fast.fake.state
        assert fast.stats.window()[-1] == s.launch_ns + s.wait_ns > 0
    assert len(fast.fake.calls) == 6 and fast.fake.state.launches == 6
    assert fast.stats.count == 6 and fast.stats.window().size == 4 and fast.stats.overruns == 0
    assert fast.stats.max_ns == fast.stats.window().max() or fast.stats.max_ns > fast.stats.window().max()


@pytest.mark.parametrize(
    "frame",
    [
        np.zeros((1, 6), dtype=np.float64),  # another dtype: Python converts it (or refuses it)
        np.zeros((6,), dtype=np.float32),  # another shape: Python checks it
        np.zeros((1, 7), dtype=np.float32),
        np.zeros((1, 12), dtype=np.float32)[:, ::2],  # not contiguous
        np.zeros((1, 6), dtype=np.dtype(">f4")),  # float32, but not the native one
        np.zeros((1, 6), dtype=np.float32).view(np.recarray),  # a subclass
        [[0.0] * 6],
        None,
    ],
    ids=["float64", "no-batch", "wider", "strided", "big-endian", "subclass", "list", "none"],
)
def test_the_extension_step_leaves_every_other_frame_to_python(extension, frame):
    fast = FastStep()
    fast.buffer[...] = 5
    assert extension.step(fast.address, frame) is None
    assert fast.fake.calls == [] and fast.stats.count == 0 and (fast.buffer == 5).all()


def test_the_extension_step_answers_the_frame_calls_code(extension):
    fast = FastStep(raise_done=False)
    bad = np.ones((1, 6), dtype=np.float32)
    bad[0, 3] = np.inf
    assert extension.step(fast.address, bad) == hostpath.NONFINITE
    assert fast.fake.calls == [] and np.array_equal(fast.buffer, bad)  # copied in, not launched
    good = np.ones((1, 6), dtype=np.float32)
    assert extension.step(fast.address, good) == hostpath.SPINNING  # launched, the words not up
    assert extension.step(fast.address, good) == hostpath.UNWAITED
    assert fast.stats.count == 0  # Python records the frames it finishes


def test_the_extension_step_counts_budget_overruns(extension):
    fast = FastStep(budget_ms=1e-6)  # 1 ns: every frame overruns it
    frame = np.ones((1, 6), dtype=np.float32)
    for _ in range(3):
        assert extension.step(fast.address, frame) is fast.out
    assert fast.stats.overruns == 3


def test_the_extension_step_allocates_nothing_and_keeps_the_outputs_count(extension):
    import sys
    import tracemalloc

    fast = FastStep()
    bell = np.zeros(1, dtype=np.uint32)
    s = fast.fake.state  # a resident frame with no done word: no Python launch callback to allocate
    s.bell, s.running, s.n_done = bell.ctypes.data, 1, 0
    frame = np.ones((1, 6), dtype=np.float32)
    step, address = extension.step, fast.address
    assert step(address, frame) is fast.out
    refs = sys.getrefcount(fast.out)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(200):
            step(address, frame)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    refs_after = sys.getrefcount(fast.out)  # (outside the assert: pytest's rewrite holds what it shows)
    grown = [d for d in after.compare_to(before, "lineno") if d.size_diff > 0 and "test_hostpath" in str(d)]
    assert grown == [] and refs_after == refs and bell[0] == 201 and fast.stats.count == 201


def test_the_extension_step_refuses_bad_arguments(extension):
    with pytest.raises(TypeError, match="takes 2 arguments"):
        extension.step(1)
    with pytest.raises(ValueError, match="null context"):
        extension.step(0, np.zeros(1, dtype=np.float32))


def test_the_extensions_view_of_numpy_arrays_is_numpys(extension):
    assert hostpath._module_mismatch(extension) == ""


# A C driver of hostpath.c's CPU worker under ThreadSanitizer: the frame state's bell path (ff_frame)
# rings a worker whose step doubles the frame into the output and adds it to a state half of its
# parity, as the CPU step's function reads and writes its buffers; every frame's answer checked,
# the worker stopped and started again between frames.
_WORKER_DRIVER = r"""
#include <stdio.h>
#include <string.h>
typedef struct { float* frame; float* out; float* state_in; float* state_out; } io_t;
enum { N = 64 };
static float frame[N], out[N], halves[2][N];
static io_t io[2] = {{frame, out, halves[0], halves[1]}, {frame, out, halves[1], halves[0]}};
static int step(void* exec, void* stream) {
    (void)stream;
    io_t* b = (io_t*)exec;
    for (int i = 0; i < N; ++i) { b->out[i] = 2.0f * b->frame[i]; b->state_out[i] = b->state_in[i] + b->frame[i]; }
    return 0;
}
int main(void) {
    static uint32_t bell, done;
    ff_frame_state s;
    memset(&s, 0, sizeof s);
    s.launch = step; s.exec[0] = &io[0]; s.exec[1] = &io[1]; s.n_execs = 2;
    s.bell = &bell; s.done = &done; s.n_done = 1; s.spin_limit = 1LL << 40; s.running = 1;
    ff_cpu_worker w;
    memset(&w, 0, sizeof w);
    w.frame = &s; w.yield_polls = 64;
    float expect = 0.0f;
    for (int f = 0; f < 400; ++f) {
        if (f % 100 == 0) {
            if (f) ff_worker_stop(&w);
            w.parity = s.parity;
            if (ff_worker_start(&w)) { fprintf(stderr, "start failed\n"); return 2; }
        }
        for (int i = 0; i < N; ++i) frame[i] = (float)(f + i);
        const int code = ff_frame(&s);
        if (code != FF_DONE) { fprintf(stderr, "frame %d: code %d\n", f, code); return 3; }
        expect += (float)f;
        for (int i = 0; i < N; ++i) {
            if (out[i] != 2.0f * (float)(f + i)) { fprintf(stderr, "frame %d out[%d] %g\n", f, i, out[i]); return 4; }
        }
        if (halves[s.parity][0] != expect) { fprintf(stderr, "frame %d state %g != %g\n", f, halves[s.parity][0], expect); return 5; }
    }
    ff_worker_stop(&w);
    if (w.answered != 100 || w.parity != s.parity) { fprintf(stderr, "answered %lld parity %d/%d\n", (long long)w.answered, w.parity, s.parity); return 6; }
    printf("ok\n");
    return 0;
}
"""


def test_the_cpu_worker_answers_every_frame_without_a_race_under_thread_sanitizer(tmp_path):
    """hostpath.c's ff_cpu_worker (engines/cpustep.CpuResidentBinding's thread) driven by ff_frame's
    bell path from C, built with -fsanitize=thread: 400 frames, the worker stopped and started every
    100, each answer and state half checked; ThreadSanitizer reports no race (a report fails the
    run: halt_on_error)."""
    import subprocess

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    source = tmp_path / "driver.c"
    source.write_text('#include "' + str(hostpath.SOURCE) + '"\n' + _WORKER_DRIVER)
    binary = tmp_path / "driver"
    build = subprocess.run(
        [cc, "-O1", "-g", "-fsanitize=thread", "-pthread", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0 and "tsan" in (build.stderr or "").lower():
        pytest.skip(f"no ThreadSanitizer runtime: {build.stderr.strip().splitlines()[-1]}")
    assert build.returncode == 0, build.stderr
    env = {"TSAN_OPTIONS": "halt_on_error=1 exitcode=66", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_the_python_path_takes_tagged_outputs_as_hostpath_does():
    """StepBinding's Python frame path (no GPU needed for this part): _take_outputs waits until every
    word of each output carries an epoch (launched) or the frame's epoch (resident), then copies the
    low halves into host_out; without spinning a missing word is a False, not a wait. The resident
    wait spins through _OutputTags, one word per output whose value is the epoch all its words share."""
    from framefuse.engines.stepkernel import StepBinding, _OutputTags, spin_until_answered

    words = np.zeros(3, dtype=np.uint64)
    out = np.full(3, np.nan, dtype=np.float32)
    binding = StepBinding.__new__(StepBinding)  # only the tagged-output views are used
    binding._out_takes = [(words, words.view(np.uint32)[1::2], words.view(np.float32)[0::2], out)]
    assert not binding._take_outputs(None, spin=False) and np.isnan(out).all()
    words[:] = [_word(4, 1.0), _word(4, 2.0), _word(3, 3.0)]
    assert binding._take_outputs(None, spin=False)  # launched: any epoch (the words were cleared)
    assert np.array_equal(out, [1.0, 2.0, 3.0])
    assert not binding._take_outputs(4, spin=False)  # resident: one word is another frame's
    tags = _OutputTags(binding._out_takes)
    assert [w.value for w in tags] == [0]
    assert not spin_until_answered(tags, 4, polls=10, timeout_s=0.0)
    words[2] = _word(4, -3.0)
    assert [w.value for w in tags] == [4] and spin_until_answered(tags, 4, polls=10, timeout_s=0.0)
    assert binding._take_outputs(4, spin=False) and np.array_equal(out, [1.0, 2.0, -3.0])
