"""The step compiler: a fused step graph as ONE persistent CUDA kernel per model and shape.

    model.fused.onnx ─lower─▶ IR ─simplify─▶ IR ─schedule─▶ tasks ─codegen─▶ CUDA source ─NVRTC─▶ kernel

- :mod:`.lower`     ONNX → the IR of :mod:`.ir` (shape computations and constants folded on the way);
- :mod:`.simplify`  composes index maps, sinks slices into products, merges common subexpressions;
- :mod:`.naive`     the reference interpreter of the IR (numpy), checked against ONNX Runtime;
- :mod:`.schedule`  what is materialized, what is recomputed, what each block computes;
- :mod:`.codegen`   the kernel's CUDA source; :mod:`.emulate` runs that source on the CPU;
- :mod:`.engine`    the compiled kernel on a GPU and its buffers (engines/stepkernel.py runs it: the
                    executor plan, mapped host memory, the step bindings).

``README.md`` in this folder has the design and the measured cost of each choice.
"""

from __future__ import annotations

from framefuse.compiler.ir import CompileError, Program


def lower_program(
    model_or_path,
    *,
    simplified: bool = True,
    compose_input: bool | None = None,
    roll_recurrences: bool | None = None,
    roll_bodies: bool | None = None,
    widen_storage: bool = False,
    split: bool | None = None,
) -> Program:
    """The step IR of a fused ONNX graph (path or ModelProto), simplified unless asked not to
    (``compose_input``: the first layer's products as products of the frame, see
    simplify.ComposeInputProducts; None: simplify.COMPOSE_INPUT_PRODUCTS; ``roll_recurrences``:
    unrolled Elman cells rolled into loops, see simplify.RollRecurrences; None: simplify.ROLL_RECURRENCES;
    ``roll_bodies``: any other unrolled cell rolled into a loop over its body, see simplify.RollBodies;
    None: simplify.ROLL_BODIES; ``widen_storage``: an fp16 / bf16 build's graph with its weights as it
    stores them and its activations in float32, see lower.lower_model; ``split``: products of a
    recurrence's output as partial sums summed by their readers, see simplify.SplitProducts; None:
    simplify.SPLIT_PRODUCTS)."""
    from framefuse.compiler.lower import lower_onnx
    from framefuse.compiler.simplify import simplify

    program = lower_onnx(model_or_path, widen_storage=widen_storage)
    if not simplified:
        return program
    return simplify(
        program, compose_input=compose_input, roll_recurrences=roll_recurrences, roll_bodies=roll_bodies, split=split
    )


def generate_source(
    model_or_path,
    *,
    grid: int,
    threads: int = 256,
    smem_limit_bytes: int = 200 * 1024,
    resident: bool = False,
    widen_storage: bool = False,
    recomputed_scalars: int | None = None,
    replicated_dot_macs: int | None = None,
    split: bool | None = None,
    **fields,
):
    """The generated kernel for a grid of ``grid`` blocks, without a GPU (tests, nvcc checks,
    ``--dump-source``): returns a :class:`framefuse.compiler.codegen.Kernel` (``resident``: the
    kernel launched once that runs a frame per bell; ``widen_storage``: see lower_program;
    ``recomputed_scalars``, ``replicated_dot_macs``: see schedule.schedule; ``split``: see
    lower_program; ``fields``: the code's
    settings, codegen.CodeSettings.of: ``weight_format``, ``one_pass``, ``inputs_ahead``, ...)."""
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.schedule import schedule

    program = lower_program(model_or_path, widen_storage=widen_storage, split=split)
    sched = schedule(
        program,
        grid=grid,
        threads=threads,
        smem_floats=smem_limit_bytes // 8,
        recomputed_scalars=recomputed_scalars,
        replicated_dot_macs=replicated_dot_macs,
    )
    return generate(sched, smem_limit_bytes=smem_limit_bytes, resident=resident, **fields)


__all__ = ["CompileError", "Program", "generate_source", "lower_program"]
