"""A step's last level on the host CPU: the program cut into a device part and a host tail.

Issue 18 (a resident step in <= 10 us host to host) is a count of levels: each costs ~0.9 us on
the H100 (flag-tagged words through L2), above a ~5.2 us floor for the frame's and the answer's
trips over PCIe. A zoo model's last level is its head (LayerNorm of the residual stream y and 32
products of 256: 8,192 multiply-adds) on 4 blocks, which stage all of y a level after it is
computed and write the 32 outputs to host memory. The host spins on that answer anyway; if the
blocks that compute y write it to host memory instead (tagged words, codegen.TAGGED_OUTPUTS), the
host can compute the head itself (compiler/cstep.py's C++ step function of the tail) with no level
on the GPU: ~8K multiply-adds of one CPU core in vectors, a few hundred nanoseconds, against a
level. `bench/microbench/tail_roundtrip.cu` measures the trade on a GPU; this module makes the cut.

The cut comes from a schedule of the whole program: the tasks of its last level whose roots are
graph outputs that are not states (the head), and the materialized values they read (the
frontier: y, or y's parts). The device program computes the states and the frontier values (as
outputs of their own, named ``TAIL_PREFIX`` + k); the tail program reads the frontier values (and
the frame, where the head reads it) as inputs and computes the graph's other outputs. Declined,
with the reason: a head that stores or reads a state itself, a graph output computed outside the
last level, a program without state, a tail of more than ``HOST_TAIL_MAX_MACS`` multiply-adds or
a frontier of more than ``HOST_TAIL_MAX_FLOATS`` floats (a split program's head reads partial
sums: 8,448), and a device program that schedules into as many levels as the whole (xLSTM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from framefuse.compiler.ir import Dot, Leaf, Node, Program
from framefuse.compiler.simplify import with_inputs

TAIL_PREFIX = "__tail."
# Multiply-adds a host tail may hold: a zoo head is 8,192 (32 x 256), its function (cstep's, in
# lanes) 0.37-0.48 us p50 on the CI machine's CPU with its LayerNorm (tail_roundtrip.cu's "host head
# alone" row and host_tail.py's tail_ns say on the GPU's host)
HOST_TAIL_MAX_MACS = 16384
# ... and frontier floats the GPU writes to host memory a step (gated_ssm's head reads 3 x 256; a
# split program's head reads partial sums, 16 x 256 a product: declined)
HOST_TAIL_MAX_FLOATS = 1024


@dataclass
class HostTail:
    device: Program  # the states and the frontier values (outputs TAIL_PREFIX + k)
    tail: Program  # the frontier values (and graph inputs) in, the graph's other outputs out
    frontier: dict[str, Node]  # TAIL_PREFIX + k -> the node of the whole program it stands for
    macs: int  # the tail's multiply-adds
    levels: int  # the device program's, scheduled as the whole program was (fewer than the whole's)


def _macs(program: Program) -> int:
    return sum(int(n.rows.size) for n in program.nodes() if isinstance(n, Dot))


def split_host_tail(
    program: Program,
    sched,
    max_macs: int | None = None,
    max_floats: int | None = None,
    reschedule: Callable[[Program], object] | None = None,
) -> HostTail | str:
    """The program cut before its last level (see the module's docstring), or why not (a line
    naming the node). ``sched``: a schedule.Schedule of ``program``; ``max_macs`` /
    ``max_floats``: HOST_TAIL_MAX_MACS / HOST_TAIL_MAX_FLOATS where None; ``reschedule``: how the
    device program is scheduled to count its levels (default: schedule.schedule with ``sched``'s
    sizes and settings; an engine passes its own shared-memory budget): a cut that saves no level
    is declined."""
    max_macs = HOST_TAIL_MAX_MACS if max_macs is None else max_macs
    max_floats = HOST_TAIL_MAX_FLOATS if max_floats is None else max_floats
    state_outputs = set(program.state_of.values())
    graph_outputs = {name: node for name, node in program.outputs.items() if name not in state_outputs}
    if not graph_outputs:
        return "no graph output other than the states"
    if not program.states:
        return "a program without state: its whole step is the head"
    task_levels = sched.task_levels()
    top = max(task_levels, default=0)
    if top < 2:
        return "one level: nothing left on the GPU before the head"
    output_ids = {node.id for node in graph_outputs.values()}
    state_ids = {program.outputs[name].id for name in state_outputs}
    head = [i for i, task in enumerate(sched.tasks) if task_levels[i] == top and task.root.id in output_ids]
    if not head:
        return f"the last level ({top}) computes no graph output"
    for i in head:
        task = sched.tasks[i]
        stored = [task.root, *task.side]
        if any(node.id in state_ids for node in stored):
            return f"the head task of {task.root.label or task.root.id} also stores a state"
    by_head = {sched.tasks[i].root.id for i in head} | {n.id for i in head for n in sched.tasks[i].side}
    for name, node in graph_outputs.items():
        if node.id not in by_head:
            return f"graph output {name!r} ({node.label or node.id}) is not computed by the last level"
    frontier_ids: list[int] = []
    for i in head:
        for nid in sorted(sched.tasks[i].reads):
            if nid not in frontier_ids:
                frontier_ids.append(nid)
    frontier = {f"{TAIL_PREFIX}{k}": sched.materialized[nid] for k, nid in enumerate(frontier_ids)}
    floats = sum(int(np.prod(node.shape)) for node in frontier.values())
    if floats > max_floats:
        return (
            f"the last level reads {floats} floats of {len(frontier)} value(s) "
            f"(more than HOST_TAIL_MAX_FLOATS = {max_floats} to write to host memory a step)"
        )
    leaves = {
        node.id: Leaf("input", name, node.shape, label=f"{name} ({node.label})") for name, node in frontier.items()
    }

    done: dict[int, Node] = {}
    head_program = Program(program.inputs, {}, graph_outputs, {}, program.source)
    for node in head_program.nodes():
        if node.id in leaves:
            done[node.id] = leaves[node.id]
        else:
            done[node.id] = with_inputs(node, [done[c.id] for c in node.inputs()])
    tail_outputs = {name: done[node.id] for name, node in graph_outputs.items()}
    tail_program = Program({}, {}, tail_outputs, {}, program.source, [f"the host tail of {program.source}"])
    inputs: dict[str, Leaf] = {}
    for node in tail_program.nodes():
        if isinstance(node, Leaf) and node.role == "state":
            return f"the head reads state {node.name!r} itself (not through a value the GPU computes)"
        if isinstance(node, Leaf) and node.role == "input":
            inputs[node.name] = node
    tail_program.inputs = inputs
    macs = _macs(tail_program)
    if macs > max_macs:
        return f"the last level holds {macs} multiply-adds (more than HOST_TAIL_MAX_MACS = {max_macs})"
    device_outputs = {name: program.outputs[name] for name in state_outputs} | frontier
    device = Program(program.inputs, program.states, device_outputs, dict(program.state_of), program.source)
    device.notes = [*program.notes, f"the last level ({len(head)} task(s), {macs} multiply-adds) on the host"]
    if reschedule is None:
        from framefuse.compiler.schedule import schedule

        def reschedule(p: Program):
            return schedule(
                p,
                grid=sched.grid,
                threads=sched.threads,
                replica_floats=sched.replica_floats,
                recomputed_scalars=sched.recomputed_scalars,
                replicated_dot_macs=sched.replicated_dot_macs,
            )

    levels = reschedule(device).levels()
    if levels >= top:
        # xLSTM at embed 256: with its frontier values as host outputs, 9 levels against the whole's 8
        return f"the program less its last level schedules into {levels} levels, not fewer than {top}"
    return HostTail(device, tail_program, frontier, macs, levels)
