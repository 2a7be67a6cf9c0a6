"""Run a generated step kernel on the CPU: the generated CUDA source itself, compiled with g++
against ``emu.h`` (one std::thread per CUDA thread). A test harness for machines without a GPU:
it checks the schedule, the index arithmetic, the shared-memory layout and the flag protocol of
the real source against the reference interpreter. It says nothing about speed, and it is not
a GPU (see emu.h for what it does not model).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from framefuse.compiler.codegen import KERNEL_NAME, Kernel
from framefuse.compiler.ir import CompileError

EMU_HEADER = Path(__file__).resolve().parent / "emu.h"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def _precompiled_header(cxx: str, flags: list[str]) -> Path | None:
    """A folder holding emu.h and its precompiled header for ``flags``, built once per header,
    compiler and flags under the kernel cache: parsing emu.h's standard headers was about half of
    each emulated kernel's compile. None when it cannot be built (the compile then reads emu.h)."""
    from framefuse.plugins.cuda import cache_dir

    header = EMU_HEADER.read_bytes()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256(b"\0".join([header, version.encode(), *(f.encode() for f in flags)])).hexdigest()[:16]
    folder = cache_dir() / "emu" / key
    if (folder / "emu.h.gch").exists():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(dir=folder.parent, prefix=key + "."))
    except OSError:  # a cache that cannot be written: compile without
        return None
    try:
        (building / "emu.h").write_bytes(header)
        made = subprocess.run(
            [cxx, *flags, "-x", "c++-header", "-o", str(building / "emu.h.gch"), str(building / "emu.h")],
            capture_output=True,
            timeout=600,
        )
        if made.returncode != 0:
            return None
        try:
            os.rename(building, folder)  # whole or not at all; another process's copy may be there first
        except OSError:
            pass
        return folder if (folder / "emu.h.gch").exists() else None
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _launches(kernel: Kernel) -> str:
    """The harness's loop over the steps: a launch per frame (ffk_step)."""
    n_in, n_out, n_state = len(kernel.input_names), len(kernel.output_names), len(kernel.state_names)
    args = [f"ins[{i}] + step * in_sizes[{i}]" for i in range(n_in)]
    if kernel.tagged_outputs:  # each output float a word (epoch << 32) | bits: see _take_words
        args += [f"out_words[{i}].data()" for i in range(n_out)]
    else:
        args += [f"outs[{i}] + step * out_sizes[{i}]" for i in range(n_out)]
    args += [f"state[{i}][step % 2]" for i in range(n_state)]
    args += [f"state[{i}][(step + 1) % 2]" for i in range(n_state)]
    args += ["weights.data()", "ll.data()", "counters.data()", "ranges.data()", "done.data()"]
    call = f"{KERNEL_NAME}({', '.join(args)})"
    words = _take_words(kernel, "(unsigned)(step + 1)") if kernel.tagged_outputs else ""
    return f"""
    std::vector<std::vector<unsigned long long>> out_words;
    for (int i = 0; i < {n_out}; ++i) out_words.emplace_back({"out_sizes[i]" if kernel.tagged_outputs else "0"}, 0ull);
    for (int step = 0; step < steps; ++step) {{
        if (step > 0)  // the next half is poisoned, so an element the kernel forgets to write shows up
            for (int i = 0; i < {n_state}; ++i) std::fill(state[i][(step + 1) % 2], state[i][(step + 1) % 2] + state_data[2 * i].size(), std::nanf(""));
        std::fill(done.begin(), done.end(), 0u);
        for (auto& w : out_words) std::fill(w.begin(), w.end(), 0ull);
        ffk_emu_launch(grid, threads, smem_floats, [&] {{ {call}; }});
        for (int k = 0; k < {kernel.done_words}; ++k)  // every host-facing block raised its word
            if (done[k] != (unsigned)(step + 1)) {{
                std::fprintf(stderr, "launch %d: done word %d holds %u, not the epoch %d\\n", step, k, done[k], step + 1);
                return 5;
            }}
{words}
    }}"""


def _take_words(kernel: Kernel, epoch: str) -> str:
    """The host's side of tagged outputs (codegen.TAGGED_OUTPUTS): wait until each output word of
    the step carries ``epoch`` (a word the kernel never writes holds the host's 0 and the wait
    aborts), then its low half is the output float."""
    n_out = len(kernel.output_names)
    return f"""
        for (int i = 0; i < {n_out}; ++i)
            for (size_t j = 0; j < out_sizes[i]; ++j) {{
                const auto start = std::chrono::steady_clock::now();
                unsigned long long w;
                while ((unsigned)((w = std::atomic_ref<unsigned long long>(out_words[i][j]).load(std::memory_order_acquire)) >> 32) != {epoch}) {{
                    std::this_thread::yield();
                    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {{
                        std::fprintf(stderr, "step %d: output %d word %zu holds epoch %u, not %u\\n", step, i, j, (unsigned)(w >> 32), {epoch});
                        std::abort();
                    }}
                }}
                const unsigned bits = (unsigned)w;
                std::memcpy(outs[i] + step * out_sizes[i] + j, &bits, 4);
            }}"""


def _resident_frames(kernel: Kernel) -> str:
    """The harness for ffk_resident: one launch on the emulated grid while a host thread writes
    each frame into the kernel's one input buffer, rings the bell, waits for the done words,
    takes the outputs, waits for the idle word before poisoning the half the next frame writes,
    and finally rings the stop."""
    n_in, n_out, n_state = len(kernel.input_names), len(kernel.output_names), len(kernel.state_names)
    args = [f"in_buf[{i}].data()" for i in range(n_in)]
    args += [f"{'out_words' if kernel.tagged_outputs else 'out_buf'}[{i}].data()" for i in range(n_out)]
    args += [f"state[{i}][0]" for i in range(n_state)]
    args += [f"state[{i}][1]" for i in range(n_state)]
    args += ["weights.data()", "ll.data()", "counters.data()", "ranges.data()", "done.data()"]
    args += ["&bell", "&idle", "ctl"]
    call = f"{kernel.name}({', '.join(args)})"
    if kernel.tagged_outputs:  # the words carry the frame's epoch: nothing to poison
        take = _take_words(kernel, "(unsigned)(step + 1)")
    else:
        take = (
            f"            for (int i = 0; i < {n_out}; ++i) "
            "std::memcpy(outs[i] + step * out_sizes[i], out_buf[i].data(), 4 * out_sizes[i]);"
        )
    # frame-block replicas (codegen.RESIDENT_FRAMER_REPLICAS): each input [copy 0 | copy 1 | ...] x
    # [even | odd frame], every copy of the frame's half written
    copies = kernel.frame_copies
    words = "in_sizes[i]" if copies == 1 else f"{2 * copies} * in_sizes[i]"
    if kernel.tagged_frames:  # each float a word (epoch << 32) | bits, stored whole, in order
        word = "unsigned long long"
        at = "j" if copies == 1 else "(2 * c + (step & 1)) * in_sizes[i] + j"
        write = (
            f"for (int c = 0; c < {copies}; ++c) "
            "for (size_t j = 0; j < in_sizes[i]; ++j) { unsigned bits; std::memcpy(&bits, ins[i] + step * in_sizes[i] + j, 4); "
            f"std::atomic_ref<unsigned long long>(in_buf[i][{at}]).store(((unsigned long long)(step + 1) << 32) | bits, "
            "std::memory_order_release); }"
        )
    else:
        word = "float"
        write = "std::memcpy(in_buf[i].data(), ins[i] + step * in_sizes[i], 4 * in_sizes[i]);"
    return f"""
    std::vector<std::vector<{word}>> in_buf;
    std::vector<std::vector<float>> out_buf;
    std::vector<std::vector<unsigned long long>> out_words;  // tagged outputs: the kernel's, 0 at the start
    for (int i = 0; i < {n_in}; ++i) in_buf.emplace_back({words}, 0);
    for (int i = 0; i < {n_out}; ++i) out_buf.emplace_back(out_sizes[i], std::nanf(""));
    for (int i = 0; i < {n_out}; ++i) out_words.emplace_back({"out_sizes[i]" if kernel.tagged_outputs else "0"}, 0ull);
    unsigned bell = 0, idle = 0;
    std::vector<unsigned long long> ctl_words(3 + grid + FFK_POLL_BINS, 0ull);  // go, stop, finished, each block's SM, the poll bins
    unsigned long long* ctl = ctl_words.data();
    int failed = 0;
    auto wait_for = [&](unsigned* word, unsigned value, const char* what, int step) {{
        const auto start = std::chrono::steady_clock::now();
        while (std::atomic_ref<unsigned>(*word).load(std::memory_order_acquire) != value) {{
            std::this_thread::yield();
            if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {{
                std::fprintf(stderr, "host: frame %d: %s never became %u\\n", step, what, value);
                std::abort();
            }}
        }}
    }};
    std::thread host([&] {{
        for (int step = 0; step < steps; ++step) {{
            if (step > 0) {{  // every block is through the last frame: the half it read is free
                wait_for(&idle, (unsigned)step, "the idle word", step);
                for (int i = 0; i < {n_state}; ++i) std::fill(state[i][(step + 1) % 2], state[i][(step + 1) % 2] + state_data[2 * i].size(), std::nanf(""));
            }}
            // the outputs poisoned before the frame is published: a frame block starts on its words
            // alone (no bell), so a poison written after them would race with its output stores
            for (int i = 0; i < {n_out}; ++i) std::fill(out_buf[i].begin(), out_buf[i].end(), std::nanf(""));
            for (int i = 0; i < {n_in}; ++i) {write}
            std::atomic_ref<unsigned>(bell).store((unsigned)(step + 1), std::memory_order_release);
            for (int k = 0; k < {kernel.done_words}; ++k) wait_for(&done[k], (unsigned)(step + 1), "a done word", step);
{take}
        }}
        wait_for(&idle, (unsigned)steps, "the idle word", steps);
        std::atomic_ref<unsigned>(bell).store(FFK_BELL_STOP, std::memory_order_release);
    }});
    ffk_emu_launch(grid, threads, smem_floats, [&] {{ {call}; }});
    host.join();
    for (int b = 0; b < grid; ++b)  // the epochs go on from where the frames left them
        if (counters[b] != (unsigned long long)steps) {{
            std::fprintf(stderr, "block %d's counter is %llu after %d frames\\n", b, counters[b], steps);
            return 6;
        }}{_reads_check(kernel)}
    if (failed) return failed;"""


def _reads_check(kernel: Kernel) -> str:
    """RESIDENT_POLL_COUNTS: every frame is counted once by each frame block's thread 0 (the
    histogram's total a positive multiple of the frames)."""
    if not kernel.frame_reads:
        return ""
    return """
    {
        unsigned long long counted = 0;
        for (int k = 0; k < FFK_POLL_BINS; ++k) counted += ctl_words[3 + grid + k];
        if (counted == 0 || counted % (unsigned long long)steps != 0) {
            std::fprintf(stderr, "the frame blocks counted %llu frames of %d\\n", counted, steps);
            return 7;
        }
    }"""


def _harness(kernel: Kernel) -> str:
    n_in, n_out, n_state = len(kernel.input_names), len(kernel.output_names), len(kernel.state_names)
    frames = _resident_frames(kernel) if kernel.resident else _launches(kernel)
    return f"""
#include <cstdio>
#include <cstdlib>
static std::vector<char> slurp(const char* path) {{
    FILE* f = std::fopen(path, "rb");
    if (!f) {{ std::perror(path); std::exit(2); }}
    std::fseek(f, 0, SEEK_END);
    long n = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    std::vector<char> data(n);
    if (n && std::fread(data.data(), 1, n, f) != (size_t)n) std::exit(3);
    std::fclose(f);
    return data;
}}
template <typename T> static std::vector<T> as(const std::vector<char>& raw) {{
    std::vector<T> v(raw.size() / sizeof(T));
    std::memcpy(v.data(), raw.data(), raw.size());
    return v;
}}
int main(int argc, char** argv) {{
    const char* dir = argv[1];
    const int steps = std::atoi(argv[2]), grid = std::atoi(argv[3]), threads = std::atoi(argv[4]);
    const size_t smem_floats = std::strtoull(argv[5], nullptr, 10);
    char path[4096];
    auto file = [&](const char* name) {{ std::snprintf(path, sizeof path, "%s/%s", dir, name); return slurp(path); }};
    std::vector<float> weights = as<float>(file("weights.bin"));
    std::vector<int> ranges = as<int>(file("ranges.bin"));
    std::vector<unsigned long long> ll(std::max<size_t>({max(kernel.layout.ll_words, 1)}, 1), 0ull);
    std::vector<unsigned long long> counters(grid, 0ull);
    std::vector<unsigned> done({max(kernel.done_words, 1)}, 0u);
    std::vector<std::vector<float>> in_data, out_data;
    std::vector<size_t> in_sizes, out_sizes;
    float* ins[{max(n_in, 1)}]; float* outs[{max(n_out, 1)}]; float* state[{max(n_state, 1)}][2];
    std::vector<std::vector<float>> state_data;
    for (int i = 0; i < {n_in}; ++i) {{
        std::snprintf(path, sizeof path, "%s/in%d.bin", dir, i);
        in_data.push_back(as<float>(slurp(path)));
        in_sizes.push_back(in_data.back().size() / steps);
    }}
    const size_t out_size[] = {{{", ".join(str(kernel.schedule.program.outputs[n].size) for n in kernel.output_names) or "0"}}};
    for (int i = 0; i < {n_out}; ++i) {{
        out_data.emplace_back(out_size[i] * steps, std::nanf(""));
        out_sizes.push_back(out_size[i]);
    }}
    for (int i = 0; i < {n_state}; ++i) {{
        std::snprintf(path, sizeof path, "%s/state%d.bin", dir, i);
        std::vector<float> s0 = as<float>(slurp(path));
        state_data.push_back(s0);
        state_data.push_back(std::vector<float>(s0.size(), std::nanf("")));
    }}
    for (int i = 0; i < {n_in}; ++i) ins[i] = in_data[i].data();
    for (int i = 0; i < {n_out}; ++i) outs[i] = out_data[i].data();
    for (int i = 0; i < {n_state}; ++i) {{ state[i][0] = state_data[2 * i].data(); state[i][1] = state_data[2 * i + 1].data(); }}
    ffk_emu_ll_base = ll.data();
{frames}
    for (int i = 0; i < {n_out}; ++i) {{
        std::snprintf(path, sizeof path, "%s/out%d.bin", dir, i);
        FILE* f = std::fopen(path, "wb"); std::fwrite(out_data[i].data(), 4, out_data[i].size(), f); std::fclose(f);
    }}
    for (int i = 0; i < {n_state}; ++i) {{
        std::snprintf(path, sizeof path, "%s/final%d.bin", dir, i);
        FILE* f = std::fopen(path, "wb"); std::fwrite(state[i][steps % 2], 4, state_data[2 * i].size(), f); std::fclose(f);
    }}
    return 0;
}}
"""


def _race_report(stderr: str, source: str) -> str:
    """ThreadSanitizer's first report as the two generated-source lines that conflict."""
    lines = source.splitlines()
    found = []
    for m in re.finditer(
        r"(Read|Write|Previous read|Previous write|Atomic \w+) of size \d+ .*?\n\s+#0 \S+ \S*kernel\.cpp:(\d+)", stderr
    ):
        number = int(m.group(2))
        text = lines[number - 1].strip() if 0 < number <= len(lines) else "?"
        found.append(f"  {m.group(1).lower()} at line {number}: {text}")
        if len(found) == 2:
            break
    if not found:
        return "ThreadSanitizer: " + stderr[-2000:]
    return "a data race in the emulated kernel (ThreadSanitizer):\n" + "\n".join(found)


def emulate(
    kernel: Kernel,
    frames: Mapping[str, np.ndarray],
    state: Mapping[str, np.ndarray],
    *,
    steps: int,
    workdir: str | os.PathLike | None = None,
    timeout: float = 600.0,
    races: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run ``steps`` chained launches. ``frames[name]`` is [steps, *shape] for each graph input;
    ``state`` the initial state by input name. Returns (outputs [steps, *shape] by name, final
    state by name).

    ``races``: build with ThreadSanitizer, which sees the emulator's barriers, warp exchanges and
    flag words as the synchronisation they are, so a shared-memory access that no barrier orders
    after a conflicting one is reported (racecheck's shared-memory hazards, on the CPU): the run
    fails naming both source lines. Slower: 10–25 s for 16 blocks of 128 threads on a 2-core machine."""
    cxx = compiler()
    if cxx is None:
        raise CompileError("no C++ compiler (g++) to run the step kernel's CPU emulation")
    program = kernel.schedule.program
    sched = kernel.schedule
    own = workdir is None
    folder = Path(tempfile.mkdtemp(prefix="framefuse-emu-")) if own else Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        source = '#include "emu.h"\n' + kernel.source + _harness(kernel)
        (folder / "kernel.cpp").write_text(source)
        binary = folder / "kernel"
        flags = ["-std=c++20", "-O1", *(["-g", "-fsanitize=thread"] if races else []), "-pthread", "-w"]
        # emu.h from the precompiled header's folder (the folder of kernel.cpp, searched first, then
        # holds no emu.h), else a copy beside kernel.cpp
        header = _precompiled_header(cxx, flags)
        if header is None:
            shutil.copy(EMU_HEADER, folder / "emu.h")
        elif (folder / "emu.h").exists():
            (folder / "emu.h").unlink()
        result = subprocess.run(
            [cxx, *flags, *(["-I", str(header)] if header else []), "-o", str(binary), str(folder / "kernel.cpp")],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise CompileError(f"g++ could not compile the emulated kernel:\n{result.stderr[-4000:]}")
        kernel.weights().tofile(folder / "weights.bin")
        kernel.ranges().tofile(folder / "ranges.bin")
        for i, name in enumerate(kernel.input_names):
            array = np.ascontiguousarray(frames[name], dtype=np.float32)
            if array.shape != (steps,) + program.inputs[name].shape:
                raise CompileError(f"frames for '{name}' must be [steps, *{list(program.inputs[name].shape)}]")
            array.tofile(folder / f"in{i}.bin")
        for i, name in enumerate(kernel.state_names):
            np.ascontiguousarray(state[name], dtype=np.float32).reshape(program.states[name].shape).tofile(
                folder / f"state{i}.bin"
            )
        run = subprocess.run(
            [str(binary), str(folder), str(steps), str(sched.grid), str(sched.threads), str(kernel.layout.smem_floats)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66 history_size=2"} if races else None,
        )
        if races and "ThreadSanitizer" in run.stderr:
            raise CompileError(_race_report(run.stderr, source))
        if run.returncode != 0:
            raise CompileError(f"the emulated kernel failed (exit {run.returncode}): {run.stderr[-2000:]}")
        outputs = {}
        for i, name in enumerate(kernel.output_names):
            shape = program.outputs[name].shape
            outputs[name] = np.fromfile(folder / f"out{i}.bin", dtype=np.float32).reshape((steps,) + shape)
        final = {}
        for i, name in enumerate(kernel.state_names):
            final[name] = np.fromfile(folder / f"final{i}.bin", dtype=np.float32).reshape(program.states[name].shape)
        return outputs, final
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)


__all__ = ["compiler", "emulate"]
