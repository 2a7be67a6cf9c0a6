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


def test_resident_tags_each_input_float_with_the_frames_epoch_before_the_bell(lib):
    """Tagged frames: every input's floats land in its words as (epoch << 32) | bits, the frame's
    epoch in the high half, whatever the floats are (NaN bits are not checked here: no frame
    pointer), and a second frame re-tags them with its own epoch."""
    frame_call, _ = lib
    fake = Fake(raise_done=False)
    bell = np.zeros(1, dtype=np.uint32)
    s = fake.state
    s.bell, s.running, s.epoch_base = bell.ctypes.data, 1, 6
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
        for x, w in zip(inputs, words):
            assert np.array_equal(w >> np.uint64(32), np.full(x.size, epoch, dtype=np.uint64))
            assert np.array_equal((w & np.uint64(0xFFFFFFFF)).astype(np.uint32), x.view(np.uint32))


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
