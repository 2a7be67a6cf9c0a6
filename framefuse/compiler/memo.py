"""Lowered programs and schedules kept for the build's tactics.

The build times up to nine step-kernel tactics of one graph (engines.fusion.STEPKERNELS); three
of them (`stepkernel-pieces`, `stepkernel-paced`, `stepkernel-skewed`) differ from the plain kernel only in the code
generated from the same schedule, and a window's schedule takes 15-30 s on a 2-core CPU (mamba's
and xlstm's at T = 32). The last few programs and schedules are kept, keyed by the graph's bytes,
the options, and every setting (upper-case module constant) of the modules they come from, so a
changed setting (``bench/microbench/stepkernel_variants.py`` flips them) never reuses a stale one.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

from framefuse.compiler import iexpr, lower, lower_program, simplify
from framefuse.compiler import schedule as scheduling
from framefuse.compiler.ir import Program

MEMO_ENTRIES = 4  # per kind; a window's schedule holds per-block numpy ranges of every unit

_programs: OrderedDict = OrderedDict()
_schedules: OrderedDict = OrderedDict()


def settings_key() -> tuple:
    """Every upper-case constant of the modules a program and its schedule come from."""
    return tuple(
        (module.__name__, name, repr(value))
        for module in (iexpr, lower, simplify, scheduling)
        for name, value in sorted(vars(module).items())
        if name.isupper() and not name.startswith("_")
    )


def source_digest(model_or_path) -> str:
    """A digest of the graph: the file's bytes for a path, the serialized proto otherwise."""
    if isinstance(model_or_path, (str, Path)):
        data = Path(model_or_path).read_bytes()
    else:
        data = model_or_path.SerializeToString()
    return hashlib.sha256(data).hexdigest()


def _remember(memo: OrderedDict, key, value):
    memo[key] = value
    memo.move_to_end(key)
    while len(memo) > MEMO_ENTRIES:
        memo.popitem(last=False)
    return value


def cached_program(
    model_or_path,
    *,
    compose_input: bool | None = None,
    roll_recurrences: bool | None = None,
    widen_storage: bool = False,
    split: bool | None = None,
) -> Program:
    """lower_program, the same Program object for the same graph, options and settings.
    ``roll_recurrences`` False: nothing rolled, neither Elman cells nor any other body (the tactic
    stepkernel-unrolled); where the rolling program already rolled nothing, it is that program (the
    tactic then schedules nothing again and builds the same kernel). ``widen_storage``: see
    lower_program (a precision build's graph). ``split``: see lower_program; where the split program has
    no partial sums (nothing to split), it is the program that does not split."""
    digest, settings = source_digest(model_or_path), settings_key()
    widen_storage = bool(widen_storage)
    if split is not None and bool(split) == bool(simplify.SPLIT_PRODUCTS):
        split = None  # the default's program
    key = (digest, compose_input, roll_recurrences, widen_storage, settings, split)
    if key in _programs:
        _programs.move_to_end(key)
        return _programs[key]
    if compose_input is False:
        # a program whose input products nothing composed is the same one: schedule it once
        # (every window of T = 32 is one: stepkernel-unframed scheduled xlstm's again, 8.6 of 59 s)
        composing = _programs.get((digest, None, roll_recurrences, widen_storage, settings, split))
        if composing is not None and not simplify.composed_inputs(composing):
            return _remember(_programs, key, composing)
    if roll_recurrences is False:
        rolling = _programs.get((digest, compose_input, None, widen_storage, settings, split))
        if rolling is not None and not simplify.rolled_recurrences(rolling) and not simplify.rolled_bodies(rolling):
            return _remember(_programs, key, rolling)
    program = lower_program(
        model_or_path,
        compose_input=compose_input,
        roll_recurrences=roll_recurrences,
        roll_bodies=False if roll_recurrences is False else None,
        widen_storage=widen_storage,
        split=split,
    )
    if split is not None and simplify.split_products(program) == 0:
        plain = cached_program(
            model_or_path, compose_input=compose_input, roll_recurrences=roll_recurrences, widen_storage=widen_storage
        )
        return _remember(_programs, key, plain)
    return _remember(_programs, key, program)


def cached_schedule(
    program: Program,
    *,
    grid: int,
    threads: int,
    smem_floats: int,
    replica_floats: int | None = None,
    recomputed_scalars: int | None = None,
    replicated_dot_macs: int | None = None,
) -> scheduling.Schedule:
    """schedule.schedule, the same Schedule for the same program object, sizes and settings."""
    key = (
        id(program),
        grid,
        threads,
        smem_floats,
        replica_floats,
        recomputed_scalars,
        replicated_dot_macs,
        settings_key(),
    )
    found = _schedules.get(key)
    if found is not None and found.program is program:
        _schedules.move_to_end(key)
        return found
    sched = scheduling.schedule(
        program,
        grid=grid,
        threads=threads,
        smem_floats=smem_floats,
        replica_floats=replica_floats,
        recomputed_scalars=recomputed_scalars,
        replicated_dot_macs=replicated_dot_macs,
    )
    return _remember(_schedules, key, sched)


def clear() -> None:
    _programs.clear()
    _schedules.clear()


__all__ = ["cached_program", "cached_schedule", "clear", "settings_key", "source_digest"]
