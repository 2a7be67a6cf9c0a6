"""The step IR as one C++ function for the host CPU: a step with no GPU in it.

At batch 1 a small model's step is a few thousand multiply-adds: a hidden-64 nn.RNNCell loop is
2 products of 64 x 128, a microsecond of one CPU core, while any GPU step pays a launch, a PCIe
round trip and a wait (the one-kernel mapped-memory graph alone is 8-13 us on the H200's host).
ONNX Runtime on the CPU answers such models in 16-25 us, most of it its own per-run work. This
backend generates, from the same lowered program the GPU kernel is scheduled from, one function
that evaluates the program in topological order (:mod:`naive`'s meaning, in float32): index maps
and single-reader elementwise ops folded into their readers' loops, products, reductions and
shared values computed into a scratch buffer. It is compiled by the system C++ compiler for the
machine it runs on.

The generated function follows hostpath.c's launch signature (``int ffc_step(void* io, void*)``):
a FrameState can "launch" it in place of cuGraphLaunch, so Session.step's native hot path runs it
unchanged (engines/cpustep.py). ``io`` points at an :class:`IO` (the inputs, outputs, state halves,
weights, scratch, done word); the function returns 0 after raising the done word.

What it runs: the node kinds a step form lowers to (Leaf, Map, Concat, Ew, Reduce, Dot) — every zoo
architecture's step form and the real models' length-1 windows. Scan, Recur, DeltaScan and BodyLoop
(the sequence form's recurrences) are declined, naming the node.

Products read their weight rows transposed ([K, N]) and keep a block of outputs in vector
registers over the k loop: each output its own chain of multiply-adds in k order, vectorised across
outputs without reassociating a sum (no -ffast-math: NaN and Inf propagate as the reference's).
The measured choices are in this folder's README ("The CPU step").
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from framefuse.compiler import iexpr as ix
from framefuse.compiler.ir import CompileError, Concat, Dot, Ew, Leaf, Map, Node, Program, Reduce
from framefuse.compiler.ops import EW, _f

COMPILER_DIR = Path(__file__).resolve().parent
RUNTIME = COMPILER_DIR / "runtime.cuh"
RUNTIME_MATH_END = "// -- end of the elementwise math"  # runtime.cuh's ffk_* math ends at this line
# CUDA's qualifiers and the intrinsics the ops' C forms and the step.cuh headers use, as host C++
# (emu.h has them too, with the emulator's threads and atomics: 3 s of every compile)
CPU_PRELUDE = """#define FFK_EMULATE 1
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
using std::isinf;
using std::isnan;
using std::max;
using std::min;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n)
inline unsigned __float_as_uint(float v) { unsigned u; std::memcpy(&u, &v, 4); return u; }
inline float __uint_as_float(unsigned u) { float v; std::memcpy(&v, &u, 4); return v; }
inline float __int_as_float(int i) { float v; std::memcpy(&v, &i, 4); return v; }
inline float __expf(float x) { return expf(x); }"""


def _runtime_math() -> str:
    text = RUNTIME.read_text()
    end = text.find(RUNTIME_MATH_END)
    if end < 0:
        raise CompileError(f"{RUNTIME}: no line {RUNTIME_MATH_END!r} (where the CPU step's math ends)")
    return text[:end]


FUNCTION = "ffc_step"
ALIGN_FLOATS = 16  # every buffer starts on a 64-byte line
# -O3 with the host's own vector units (the loops are short and simple: -O2 left the products
# unvectorised, lstm at embed 64 101 -> 28 us on the CI machine's EPYC); no -ffast-math (NaN/Inf
# semantics, no reassociated sums)
CXX_FLAGS = ("-std=c++20", "-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC", "-w")
LIBS = ("-lmvec", "-lm")
# glibc's vector math (libmvec: expf, tanhf, logf ... 8 lanes at a time, within 4 ulp), declared
# as the vectoriser's variants of the scalar functions, as glibc's own math.h does under
# -ffast-math: an elementwise loop of sigmoids and tanhs then runs 8 elements a call instead of
# one libm call per element (~100 cycles an LSTM cell element otherwise)
SIMD_MATH = """#include <cmath>
extern "C" {
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
__attribute__((simd("notinbranch"))) float log1pf(float) noexcept;
__attribute__((simd("notinbranch"))) float expm1f(float) noexcept;
__attribute__((simd("notinbranch"))) float sinf(float) noexcept;
__attribute__((simd("notinbranch"))) float cosf(float) noexcept;
__attribute__((simd("notinbranch"))) float erff(float) noexcept;
__attribute__((simd("notinbranch"))) float powf(float, float) noexcept;
}"""
# A product keeps DOT_BLOCK outputs in registers over its k loop, as GCC vectors of 8 floats
# (vector_size(32): one AVX register, two SSE ones where the host prefers 128 bits). Written out,
# not left to the auto-vectoriser, which vectorised the k loop instead, with shuffles (perf on the
# CI machine's EPYC: 37 % of a step in the products' inner loops at 3.4 GMAC/s).
DOT_BLOCK = 64
VECTOR_TYPES = """typedef float ffc_v8 __attribute__((vector_size(32)));
static inline ffc_v8 ffc_load8(const float* p) { ffc_v8 v; __builtin_memcpy(&v, p, 32); return v; }
static inline void ffc_store8(float* p, ffc_v8 v) { __builtin_memcpy(p, &v, 32); }"""


class IO(ctypes.Structure):
    """The generated function's argument: arrays of pointers by position (``CStep.input_names``,
    ``output_names``, ``state_names``), the weight blob, the scratch buffer, the done word."""

    _fields_ = [
        ("inputs", ctypes.c_void_p),
        ("outputs", ctypes.c_void_p),
        ("states_in", ctypes.c_void_p),
        ("states_out", ctypes.c_void_p),
        ("weights", ctypes.c_void_p),
        ("scratch", ctypes.c_void_p),
        ("done", ctypes.c_void_p),
    ]


IO_DECL = """struct ffc_io {
    const float* const* inputs;
    float* const* outputs;
    const float* const* states_in;
    float* const* states_out;
    const float* weights;
    float* scratch;
    volatile unsigned* done;
};"""


@dataclass
class CStep:
    """A program's C++ step: the source, the weight blob it reads and the buffer layout."""

    program: Program
    source: str
    weights: np.ndarray
    scratch_floats: int
    input_names: list[str]
    output_names: list[str]
    state_names: list[str]
    nodes: int = 0
    counts: dict = field(default_factory=dict)

    @property
    def digest(self) -> str:
        h = hashlib.sha256(self.source.encode())
        h.update(self.weights.tobytes())
        return h.hexdigest()

    def describe(self) -> dict:
        return {
            "backend": "cpu",
            "function": FUNCTION,
            "source_sha256": hashlib.sha256(self.source.encode()).hexdigest(),
            "nodes": self.nodes,
            "weight_floats": int(self.weights.size),
            "scratch_floats": self.scratch_floats,
        }


def _aligned(n: int) -> int:
    return (n + ALIGN_FLOATS - 1) // ALIGN_FLOATS * ALIGN_FLOATS


def _loop_vars(shape, prefix: str) -> list:
    """An index per axis: a loop variable, or the constant 0 for an axis of extent 1 (no loop)."""
    return [ix.const(0) if int(d) == 1 else ix.Var(f"{prefix}{a}", int(d)) for a, d in enumerate(shape)]


def _loops(variables: list, pad: str = "    ") -> tuple[list[str], str]:
    """Nested for-loop heads over the variables of ``_loop_vars`` and the body's indentation."""
    heads = []
    for v in variables:
        if isinstance(v, ix.Var):
            heads.append(f"{pad}for (int {v.name} = 0; {v.name} < {v.extent}; ++{v.name})")
            pad += "    "
    return heads, pad


class _Generator:
    """Values are C expressions of an index: a Map is its source read through its index map, an
    elementwise op with one user is its C form over its arguments' expressions, so chains of
    reshapes, slices, broadcasts and elementwise math become one loop with no buffer between them.
    What is read more than once or by a loop of its own is computed into scratch (materialised):
    products, reductions, concatenations, elementwise values with several users or read by a
    product or a reduction, and outputs that other nodes read."""

    def __init__(self, program: Program):
        self.program = program
        self.lines: list[str] = []
        self.blob: list[np.ndarray] = []
        self.blob_floats = 0
        self.scratch = 0
        self.where: dict[int, str] = {}  # node id -> the C pointer its values are read from
        self.headers: list[Path] = []
        self.input_names = list(program.inputs)
        self.state_names = list(program.states)
        self.output_names = [n for n in program.outputs if n not in set(program.state_of.values())]
        self.order = program.nodes()
        self.users: dict[int, int] = {}
        self.looped: set[int] = set()  # read by a product's or a reduction's inner loop
        for node in self.order:
            for child in node.inputs():
                self.users[child.id] = self.users.get(child.id, 0) + 1
            if isinstance(node, (Dot, Reduce)):
                # its inner loop reads the source once per output block (or element): what the
                # source's index maps read is computed once, not in that loop
                child = node.src
                while isinstance(child, Map):
                    child = child.src
                self.looped.update((node.src.id, child.id))
        self.output_ids = {n.id for n in program.outputs.values()}

    def _weight(self, array: np.ndarray) -> int:
        offset = self.blob_floats
        flat = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        padded = _aligned(flat.size)
        self.blob.append(np.concatenate([flat, np.zeros(padded - flat.size, np.float32)]))
        self.blob_floats += padded
        return offset

    def materialised(self, node: Node) -> bool:
        if isinstance(node, Leaf):
            return False
        if isinstance(node, (Dot, Reduce, Concat)):
            return True
        if node.id in self.output_ids and self.users.get(node.id, 0):
            return True
        if isinstance(node, Ew):
            return self.users.get(node.id, 0) > 1 or node.id in self.looped
        return False  # a Map: its source's expression, re-indexed

    def expr(self, node: Node, index: list) -> str:
        """The C expression of ``node``'s element at multi-index ``index`` (IExprs)."""
        if node.id in self.where:
            return f"{self.where[node.id]}[{ix.to_c(ix.flatten(index, node.shape))}]"
        if isinstance(node, Leaf):
            if node.role == "const":
                return _f(float(node.array))
            raise CompileError(f"{node}: a {node.role} leaf outside a loop body")
        if isinstance(node, Map):
            return self.expr(node.src, node.source_index(list(index)))
        if isinstance(node, Ew):
            spec = EW[node.op]
            if spec.header is not None and spec.header not in self.headers:
                self.headers.append(spec.header)
            return spec.c([self.expr(a, index) for a in node.args], node.params)
        raise CompileError(f"{node}: no expression for a {type(node).__name__} (a compiler bug)")

    def leaf(self, node: Leaf) -> None:
        if node.role == "input":
            self.where[node.id] = f"io->inputs[{self.input_names.index(node.name)}]"
        elif node.role == "state":
            self.where[node.id] = f"io->states_in[{self.state_names.index(node.name)}]"
        elif node.role == "weight":
            self.where[node.id] = f"(w + {self._weight(node.array)})"
        elif node.role != "const":
            raise CompileError(f"{node}: a {node.role} leaf outside a loop body")

    def buffer(self, node: Node) -> str:
        """The scratch region of a materialised node: a local pointer named after it."""
        name = f"v{node.id}"
        self.lines.append(f"    float* __restrict__ const {name} = s + {self.scratch};  // {node!r}")
        self.scratch += _aligned(max(node.size, 1))
        return name

    def store(self, target: str, node: Node, value) -> None:
        """``target[flat index] = value(index)`` over ``node``'s shape."""
        variables = _loop_vars(node.shape, "i")
        heads, pad = _loops(variables)
        flat = ix.to_c(ix.flatten(variables, node.shape))
        self.lines += ["    {", *heads, f"{pad}{target}[{flat}] = {value(variables)};", "    }"]

    def ew(self, node: Ew) -> None:
        out = self.buffer(node)
        spec = EW[node.op]
        if spec.header is not None and spec.header not in self.headers:
            self.headers.append(spec.header)
        self.store(out, node, lambda index: spec.c([self.expr(a, index) for a in node.args], node.params))
        self.where[node.id] = out

    def map(self, node: Map) -> None:
        out = self.buffer(node)
        self.store(out, node, lambda index: self.expr(node, index))
        self.where[node.id] = out

    def concat(self, node: Concat) -> None:
        out = self.buffer(node)
        for src, offset in zip(node.srcs, node.offsets):
            variables = _loop_vars(src.shape, "i")
            position = [ix.add(v, ix.const(offset)) if a == node.axis else v for a, v in enumerate(variables)]
            heads, pad = _loops(variables)
            dst = ix.to_c(ix.flatten(position, node.shape))
            self.lines += ["    {", *heads, f"{pad}{out}[{dst}] = {self.expr(src, variables)};", "    }"]
        self.where[node.id] = out

    def reduce(self, node: Reduce) -> None:
        out = self.buffer(node)
        variables = _loop_vars(node.shape, "i")
        r = ix.Var("r", max(node.extent, 1))
        read = self.expr(node.src, node.source_index(variables, r))
        first = self.expr(node.src, node.source_index(variables, ix.const(0)))
        step = {
            "sum": f"acc = acc + {read};",
            "prod": f"acc = acc * {read};",
            "max": f"acc = ffk_max(acc, {read});",
            "min": f"acc = ffk_min(acc, {read});",
        }[node.op]
        heads, pad = _loops(variables)
        if node.op in ("max", "min"):  # from the first element (NaN-propagating ffk_max / ffk_min)
            body = [f"{pad}float acc = {first};", f"{pad}for (int r = 1; r < {node.extent}; ++r) {step}"]
        else:
            body = [f"{pad}float acc = {'0.0f' if node.op == 'sum' else '1.0f'};"]
            body.append(f"{pad}for (int r = 0; r < {node.extent}; ++r) {step}")
        flat = ix.to_c(ix.flatten(variables, node.shape))
        self.lines += [
            "    {",
            *heads,
            f"{pad}{{",
            *["    " + b for b in body],
            f"{pad}    {out}[{flat}] = acc;",
            f"{pad}}}",
            "    }",
        ]
        self.where[node.id] = out

    def dot(self, node: Dot) -> None:
        out = self.buffer(node)
        n, k = node.n, node.k
        rows = self._weight(np.ascontiguousarray(node.rows.T))  # [K, N]: the output loop innermost
        outer = _loop_vars(node.src.shape[:-1], "b")
        j = ix.Var("j", max(k, 1))
        x = self.expr(node.src, outer + [j])
        base = ix.to_c(ix.mul(ix.flatten(outer, node.shape[:-1]), n)) if outer else "0"
        heads, pad = _loops(outer, "        ")
        # outputs a block at a time, their sums in registers across the k loop (each output's own
        # chain in k order: the same sum as one output at a time, vectorised across outputs)
        body = ["    {", f"        const float* __restrict__ const rows = w + {rows};", *heads, f"{pad}{{"]
        body.append(f"{pad}    float* __restrict__ const o = {out} + {base};")
        inner = pad + "    "
        # blocks of 64 outputs (8 vectors: 8 independent chains hide the add's latency), then
        # one of 32, 16 and 8 as the rest allows, then single outputs
        blocks, c = [], 0
        for width in (DOT_BLOCK, 32, 16, 8):
            count = (n - c) // width if width == DOT_BLOCK else min(1, (n - c) // width)
            if count:
                blocks.append((c, width, count))
                c += width * count
        full = c
        for first, width, count in blocks:
            vectors = width // 8
            if count > 1:
                body.append(f"{inner}for (int c0 = {first}; c0 < {first + width * count}; c0 += {width}) {{")
            else:
                body += [f"{inner}{{", f"{inner}    const int c0 = {first};"]
            body += [
                f"{inner}    ffc_v8 " + ", ".join(f"a{v} = {{}}" for v in range(vectors)) + ";",
                f"{inner}    for (int j = 0; j < {k}; ++j) {{",
                f"{inner}        const float x = {x};",
                f"{inner}        const float* const row = rows + j * {n} + c0;",
                *[f"{inner}        a{v} += x * ffc_load8(row + {8 * v});" for v in range(vectors)],
                f"{inner}    }}",
                *[f"{inner}    ffc_store8(o + c0 + {8 * v}, a{v});" for v in range(vectors)],
                f"{inner}}}",
            ]
        if n > full:
            width = n - full
            body += [
                f"{inner}{{",
                f"{inner}    float acc[{width}] = {{}};",
                f"{inner}    for (int j = 0; j < {k}; ++j) {{",
                f"{inner}        const float x = {x};",
                f"{inner}        const float* const row = rows + j * {n} + {full};",
                f"{inner}        for (int c = 0; c < {width}; ++c) acc[c] += x * row[c];",
                f"{inner}    }}",
                f"{inner}    for (int c = 0; c < {width}; ++c) o[{full} + c] = acc[c];",
                f"{inner}}}",
            ]
        self.lines += body + [f"{pad}}}", "    }"]
        self.where[node.id] = out

    def copy_out(self, node: Node, target: str) -> None:
        if node.id in self.where and not isinstance(node, Leaf):
            self.lines.append(f"    std::memcpy({target}, {self.where[node.id]}, {4 * node.size});")
        else:
            self.store(target, node, lambda index: self.expr(node, index))

    def generate(self) -> CStep:
        program = self.program
        counts: dict[str, int] = {}
        for node in self.order:
            kind = type(node).__name__
            counts[kind] = counts.get(kind, 0) + 1
            if isinstance(node, Leaf):
                self.leaf(node)
            elif not isinstance(node, (Map, Concat, Ew, Reduce, Dot)):
                raise CompileError(
                    f"{node}: the CPU step runs the step form's nodes (Map, Concat, Ew, Reduce, Dot), "
                    f"not a {type(node).__name__} (a sequence form's recurrence)"
                )
            elif self.materialised(node):
                {Concat: self.concat, Ew: self.ew, Reduce: self.reduce, Dot: self.dot, Map: self.map}[
                    Concat if isinstance(node, Concat) else type(node)
                ](node)
        for i, name in enumerate(self.output_names):
            self.copy_out(program.outputs[name], f"io->outputs[{i}]")
        for i, name in enumerate(self.state_names):
            self.copy_out(program.outputs[program.state_of[name]], f"io->states_out[{i}]")
        includes = [
            SIMD_MATH,
            CPU_PRELUDE,
            VECTOR_TYPES,
            f"// ---- {RUNTIME.name}, its elementwise math\n{_runtime_math()}",
        ]
        includes += [f"// ---- {p.parent.name}/{p.name}\n{p.read_text()}" for p in self.headers]
        head = [
            f"// framefuse CPU step: {program.source or 'program'}; {len(self.order)} nodes "
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
            "// generated by framefuse/compiler/cstep.py: the materialised nodes in topological order",
            *includes,
            IO_DECL,
            f'extern "C" int {FUNCTION}(void* io_arg, void*) {{',
            "    const ffc_io* const io = (const ffc_io*)io_arg;",
            "    const float* __restrict__ const w = io->weights;",
            "    float* __restrict__ const s = io->scratch;",
        ]
        tail = ["    if (io->done) *io->done = 1u;", "    return 0;", "}", ""]
        blob = np.concatenate(self.blob) if self.blob else np.zeros(ALIGN_FLOATS, np.float32)
        return CStep(
            program=program,
            source="\n".join(head + self.lines + tail),
            weights=blob,
            scratch_floats=max(self.scratch, ALIGN_FLOATS),
            input_names=self.input_names,
            output_names=self.output_names,
            state_names=self.state_names,
            nodes=len(self.order),
            counts=counts,
        )


def generate(program: Program) -> CStep:
    """The C++ step of ``program``; CompileError naming the node it cannot run."""
    return _Generator(program).generate()


# -- building and running -------------------------------------------------------------------------

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}


def compiler() -> list[str] | None:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    return cxx.split() if cxx else None


def _host_signature() -> str:
    """What -march=native compiles for: the CPU's model and feature flags (a cached library from
    another machine's CPU is not reused)."""
    text = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                text += "|" + line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return text


def _cache_dir() -> Path:
    from framefuse.plugins.cuda import cache_dir

    return cache_dir() / "cpu"


def build(step: CStep) -> Path:
    """The compiled library of ``step`` (cached by source, compiler and CPU; written to a
    temporary name, then renamed)."""
    cxx = compiler()
    if cxx is None:
        raise CompileError("no C++ compiler for the CPU step (set CXX, or install g++)")
    try:
        version = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise CompileError(f"{' '.join(cxx)} --version failed: {exc}") from exc
    key = hashlib.sha256("\0".join([step.source, version, _host_signature(), *CXX_FLAGS, *LIBS]).encode()).hexdigest()[
        :16
    ]
    target = _cache_dir() / f"cstep-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    os.close(fd)
    source = Path(tmp + ".cpp")
    try:
        source.write_text(step.source)
        cmd = [*cxx, *CXX_FLAGS, "-o", tmp, str(source), *LIBS]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit status {done.returncode}"]
            raise CompileError(f"{' '.join(cmd)} failed: {lines[0]}")
        os.replace(tmp, target)
    finally:
        for path in (tmp, str(source)):
            if os.path.exists(path):
                os.unlink(path)
    return target


def load(step: CStep) -> ctypes.CDLL:
    path = str(build(step))
    with _lock:
        lib = _libraries.get(path)
        if lib is None:
            lib = _libraries[path] = ctypes.CDLL(path)
            getattr(lib, FUNCTION).restype = ctypes.c_int
            getattr(lib, FUNCTION).argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


def sanitize(step: CStep, steps: int = 3, timeout: float = 600.0) -> str:
    """Run ``step`` ``steps`` times in a process of its own built with AddressSanitizer and
    UndefinedBehaviorSanitizer (the CPU step's memcheck): every input, output, state half, the
    weights and the scratch in a heap block of exactly its size, random frames, the state halves
    alternating. Returns the sanitizers' report, "" when clean."""
    cxx = compiler()
    if cxx is None:
        raise CompileError("no C++ compiler for the CPU step (set CXX, or install g++)")
    program = step.program
    sizes = {
        "inputs": [program.inputs[n].size for n in step.input_names],
        "outputs": [program.outputs[n].size for n in step.output_names],
        "states": [program.states[n].size for n in step.state_names],
    }

    def table(values):
        return "{" + ", ".join(str(max(int(v), 0)) for v in values) + "}" if values else "{0}"

    harness = f"""
#include <cstdio>
#include <cstdlib>
#include <vector>
static float* ffc_block(long n) {{ float* p = (float*)std::malloc(sizeof(float) * (n ? n : 1)); for (long i = 0; i < n; ++i) p[i] = (float)std::rand() / RAND_MAX - 0.5f; return p; }}
int main() {{
    const long in_sizes[] = {table(sizes["inputs"])}, out_sizes[] = {table(sizes["outputs"])}, state_sizes[] = {table(sizes["states"])};
    const int n_in = {len(sizes["inputs"])}, n_out = {len(sizes["outputs"])}, n_state = {len(sizes["states"])};
    std::vector<const float*> ins(n_in + 1), states_in[2];
    std::vector<float*> outs(n_out + 1), states_out[2], halves[2];
    for (int i = 0; i < n_in; ++i) ins[i] = ffc_block(in_sizes[i]);
    for (int i = 0; i < n_out; ++i) outs[i] = ffc_block(out_sizes[i]);
    for (int h = 0; h < 2; ++h) for (int i = 0; i < n_state; ++i) halves[h].push_back(ffc_block(state_sizes[i]));
    for (int p = 0; p < 2; ++p) for (int i = 0; i < n_state; ++i) {{ states_in[p].push_back(halves[p][i]); states_out[p].push_back(halves[1 - p][i]); }}
    for (int p = 0; p < 2; ++p) {{ states_in[p].push_back(nullptr); states_out[p].push_back(nullptr); }}
    float* weights = ffc_block({step.weights.size});
    float* scratch = ffc_block({step.scratch_floats});
    unsigned done = 0;
    for (int t = 0; t < {steps}; ++t) {{
        ffc_io io{{ins.data(), outs.data(), states_in[t % 2].data(), states_out[t % 2].data(), weights, scratch, &done}};
        {FUNCTION}(&io, nullptr);
        if (done != 1u) {{ std::fprintf(stderr, "step %d: the done word is %u\\n", t, done); return 3; }}
        done = 0;
    }}
    return 0;
}}
"""
    folder = Path(tempfile.mkdtemp(prefix="framefuse-cstep-san-"))
    try:
        (folder / "step.cpp").write_text(step.source + harness)
        binary = folder / "step"
        flags = [f for f in CXX_FLAGS if f not in ("-shared", "-fPIC", "-O3")]
        cmd = [*cxx, *flags, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
        built = subprocess.run(
            [*cmd, "-o", str(binary), str(folder / "step.cpp"), *LIBS], capture_output=True, text=True, timeout=timeout
        )
        if built.returncode != 0:
            raise CompileError(f"the sanitized CPU step did not compile: {(built.stderr or built.stdout)[-2000:]}")
        env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}  # the harness keeps its blocks
        run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=timeout, env=env)
        if run.returncode != 0 or "runtime error" in run.stderr or "ERROR: AddressSanitizer" in run.stderr:
            return (run.stderr or f"exit status {run.returncode}")[-4000:]
        return ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Runner:
    """A compiled CPU step over its own buffers: ``io(parity)`` is the argument of one call (the
    state halves swapped by parity), ``function`` the address of the generated function. The
    arrays are kept alive by the runner; nothing is allocated per call."""

    def __init__(self, step: CStep):
        self.step = step
        self.lib = load(step)
        self.function = ctypes.cast(getattr(self.lib, FUNCTION), ctypes.c_void_p).value
        self._call = getattr(self.lib, FUNCTION)
        program = step.program
        self.weights = np.ascontiguousarray(step.weights, dtype=np.float32)
        self.scratch = np.zeros(step.scratch_floats, np.float32)
        self.inputs = {n: np.zeros(program.inputs[n].shape, np.float32) for n in step.input_names}
        self.outputs = {n: np.zeros(program.outputs[n].shape, np.float32) for n in step.output_names}
        self.halves = {n: [np.zeros(program.states[n].shape, np.float32) for _ in range(2)] for n in step.state_names}
        self.done = np.zeros(1, np.uint32)
        self._tables: list = []
        self._io = [self._make_io(parity) for parity in range(2)]
        self._io_addresses = [ctypes.addressof(io) for io in self._io]

    def _pointers(self, arrays) -> ctypes.Array:
        table = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        self._tables.append(table)
        return table

    def _make_io(self, parity: int) -> IO:
        s = self.step
        io = IO()
        io.inputs = ctypes.addressof(self._pointers([self.inputs[n] for n in s.input_names]))
        io.outputs = ctypes.addressof(self._pointers([self.outputs[n] for n in s.output_names]))
        io.states_in = ctypes.addressof(self._pointers([self.halves[n][parity] for n in s.state_names]))
        io.states_out = ctypes.addressof(self._pointers([self.halves[n][1 - parity] for n in s.state_names]))
        io.weights = self.weights.ctypes.data
        io.scratch = self.scratch.ctypes.data
        io.done = self.done.ctypes.data
        return io

    def io_address(self, parity: int) -> int:
        return self._io_addresses[parity]

    def call(self, parity: int) -> None:
        self._call(self._io_addresses[parity], None)

    def run(self, feeds: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray] | None = None) -> dict:
        """One step from ``feeds`` (graph inputs) and ``state`` (by state input name; zeros where
        not given): every output by name, the next state among them (copies)."""
        for name, array in self.inputs.items():
            array[...] = np.asarray(feeds[name], dtype=np.float32).reshape(array.shape)
        for name, halves in self.halves.items():
            halves[0][...] = 0.0 if state is None or name not in state else np.asarray(state[name], np.float32)
        self.call(0)
        result = {n: a.copy() for n, a in self.outputs.items()}
        for name in self.step.state_names:
            result[self.step.program.state_of[name]] = self.halves[name][1].copy()
        return result


__all__ = ["CStep", "FUNCTION", "IO", "Runner", "build", "compiler", "generate", "load", "sanitize"]
