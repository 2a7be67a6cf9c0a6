#!/usr/bin/env python
"""What each piece of Session.step's hot path costs on this host, without a GPU: the clock pair,
the frame copy into a buffer, a ctypes call into hostpath.c (ff_wait with no done word: the call's
entry and exit and two clock reads), an attribute-heavy Python method, and whether the Python
headers a C extension would build against are present. Medians of many calls, ns.

    python bench/microbench/host_calls.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _median_ns(fn, n: int = 200_000) -> float:
    clock = time.perf_counter_ns
    for _ in range(2000):
        fn()
    samples = np.empty(n // 100, dtype=np.int64)
    for k in range(samples.size):
        start = clock()
        for _ in range(100):
            fn()
        samples[k] = clock() - start
    return float(np.median(samples)) / 100


def main() -> int:
    from framefuse.engines import hostpath

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    frame = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    buffer = np.zeros(256, np.float32)
    row: dict = {}
    clock = time.perf_counter_ns
    row["clock_pair"] = _median_ns(lambda: clock() - clock())
    row["setitem_256"] = _median_ns(lambda: buffer.__setitem__(Ellipsis, frame))
    row["copyto_256"] = _median_ns(lambda: np.copyto(buffer, frame))
    lib = hostpath.load()
    row["hostpath"] = hostpath.status()
    if lib is not None:
        _, wait = lib
        state = hostpath.FrameState()
        state.n_done = 0
        ref = ctypes.byref(state)
        row["ctypes_ff_wait"] = _median_ns(lambda: wait(ref))
        pointer = ctypes.pointer(state)
        row["ctypes_ff_wait_pointer"] = _median_ns(lambda: wait(pointer))
        # a frame with nothing to wait on (a resident state with no done word: the bell is a
        # host word): the extension's step against the numpy copy + ctypes call it replaces
        from framefuse.runtime.stats import LatencyStats

        module = hostpath.extension()
        frame_state = hostpath.FrameState()
        bell = np.zeros(1, dtype=np.uint32)
        frame_state.bell, frame_state.running, frame_state.n_done = bell.ctypes.data, 1, 0
        frame_state.frame, frame_state.frame_floats = buffer.ctypes.data, buffer.size
        frame_call = lib[0]
        frame_ref = ctypes.byref(frame_state)
        stats = LatencyStats(capacity=1000)
        row["ctypes_copy_frame_record"] = _median_ns(
            lambda: (buffer.__setitem__(Ellipsis, frame), frame_call(frame_ref), stats.record(clock() - clock()))
        )
        if module is not None:
            context = hostpath.StepContext()
            context.state = ctypes.addressof(frame_state)
            context.ndarray, context.dtype, context.out = np.ndarray, np.dtype(np.float32), buffer
            context.buffer, context.nbytes, context.ndim = buffer.ctypes.data, buffer.nbytes, 1
            context.shape[0] = buffer.size
            context.ring, context.stats = stats.buffers()
            step, address = module.step, ctypes.addressof(context)
            row["extension_step"] = _median_ns(lambda: step(address, frame))
    include = sysconfig.get_paths()["include"]
    row["python_h"] = os.path.exists(os.path.join(include, "Python.h"))
    row["python_include"] = include
    print(json.dumps(row, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
