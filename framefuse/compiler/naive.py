"""The reference interpreter of the step IR: every node evaluated whole, with numpy, in float64.

This is the meaning of each instruction (``naive.py`` beside the generated kernel, as each fused
op keeps one beside its CUDA kernel): CI runs it on every lowered zoo graph against ONNX Runtime on
the original graph, without a GPU, and the generated kernel is checked against the same outputs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from framefuse.compiler import iexpr as ix
from framefuse.compiler.ir import (
    BodyLoop,
    CompileError,
    Concat,
    DeltaScan,
    Dot,
    Ew,
    Leaf,
    Map,
    Node,
    Program,
    Recur,
    Reduce,
    Scan,
)
from framefuse.compiler.ops import EW


def index_grid(shape) -> tuple[list[ix.Var], dict]:
    """Vars for each axis of ``shape`` and an env binding them to the full row-major grid."""
    variables = [ix.Var(f"i{a}", max(int(d), 1)) for a, d in enumerate(shape)]
    if not shape:
        return [], {}
    grids = np.meshgrid(*[np.arange(int(d)) for d in shape], indexing="ij")
    return variables, {v: g.reshape(-1) for v, g in zip(variables, grids)}


def _gather(src: np.ndarray, index: list, env: dict, size: int) -> np.ndarray:
    coords = [np.broadcast_to(ix.evaluate(e, env), (size,)) for e in index]
    if not coords:
        return np.broadcast_to(src.reshape(()), (size,))
    return src[tuple(coords)]


def evaluate_node(node: Node, values: Mapping[int, np.ndarray]) -> np.ndarray:
    """The value of ``node`` from its inputs' values (keyed by node id)."""
    shape = node.shape
    if isinstance(node, Leaf):
        raise CompileError(f"{node}: leaves are fed, not evaluated")
    if isinstance(node, Map):
        variables, env = index_grid(shape)
        source = values[node.src.id]
        return _gather(source, node.source_index(variables), env, node.size).reshape(shape)
    if isinstance(node, Concat):
        return np.concatenate([values[s.id] for s in node.srcs], axis=node.axis)
    if isinstance(node, Ew):
        spec = EW[node.op]
        with np.errstate(all="ignore"):
            return np.asarray(spec.numpy(*[values[a.id] for a in node.args], node.params), dtype=np.float64).reshape(
                shape
            )
    if isinstance(node, Reduce):
        src = values[node.src.id]
        fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[node.op]
        with np.errstate(all="ignore"):
            return np.asarray(fn(src, axis=node.axes), dtype=np.float64).reshape(shape)
    if isinstance(node, Dot):
        return np.asarray(values[node.src.id] @ node.rows.astype(np.float64).T).reshape(shape)
    if isinstance(node, Scan):
        spec = EW[node.op]
        xs = [np.moveaxis(values[x.id], node.axis, 0) for x in node.xs]
        h = np.asarray(values[node.init.id], dtype=np.float64)
        out = np.empty((node.steps,) + h.shape, dtype=np.float64)
        with np.errstate(all="ignore"):
            for t in range(node.steps):
                h = np.asarray(spec.numpy(*node.step_args([x[t] for x in xs], h), node.params), dtype=np.float64)
                out[t] = h.reshape(out.shape[1:])
        return np.moveaxis(out, 0, node.axis)
    if isinstance(node, Recur):
        return recur(node, values)
    if isinstance(node, DeltaScan):
        return delta_scan(node, values)
    if isinstance(node, BodyLoop):
        return body_loop(node, values)
    raise CompileError(f"{node}: no reference for {type(node).__name__}")


def recur(node: Recur, values: Mapping[int, np.ndarray]) -> np.ndarray:
    """The positions of a nonlinear recurrence in order, the cell's numpy twin at each (ir.Recur)."""
    H, G = node.hidden, node.gates
    xg = values[node.xg.id]
    h = np.array(values[node.h0.id], dtype=np.float64)
    c = None if node.c0 is None else np.array(values[node.c0.id], dtype=np.float64)
    rows = node.rows.astype(np.float64)
    rbias = 0.0 if node.rbias is None else node.rbias.astype(np.float64)
    out = np.empty(node.shape, dtype=np.float64)
    with np.errstate(all="ignore"):
        for t in range(node.steps):
            r = h @ rows.T + rbias  # [B, G·H]
            x = [xg[t][:, k * H : (k + 1) * H] for k in range(G)]
            rk = [r[:, k * H : (k + 1) * H] for k in range(G)]
            if node.cell == "lstm":
                i, o, f, g = (a + b for a, b in zip(x, rk))
                c = EW["lstm_cell"].numpy(i, f, g, c, ())
                h = EW["lstm_hidden"].numpy(o, c, ())
                out[t] = np.concatenate([h, c], axis=-1)
            elif node.cell == "gru":
                h = EW["gru_hidden"].numpy(x[0], rk[0], x[1], rk[1], x[2], rk[2], h, ())
                out[t] = h
            elif node.cell.startswith("rnn_"):
                h = EW[node.cell.removeprefix("rnn_")].numpy(x[0] + rk[0], ())
                out[t] = h
            else:
                h = EW["liquid_hidden"].numpy(*(a + b for a, b in zip(x, rk)), node.params)
                out[t] = h
            h = np.asarray(h, dtype=np.float64)
    return out


def body_loop(node: BodyLoop, values: Mapping[int, np.ndarray]) -> np.ndarray:
    """The positions in order, the body evaluated whole at each with its slots bound
    (ir.BodyLoop): the carried value to the position before's, each slot to its window's row."""
    windows = [np.asarray(values[w.id], dtype=np.float64) for w in node.windows]
    bound = {leaf.id: np.asarray(values[f.id], dtype=np.float64) for leaf, f in zip(node.fixed_slots, node.fixed)}
    h = np.asarray(values[node.h0.id], dtype=np.float64)
    order = node.body_nodes()
    out = np.empty(node.shape, dtype=np.float64)
    for t in range(node.steps):
        inner = dict(bound)
        inner[node.carried.id] = h
        for leaf, window in zip(node.slots, windows):
            inner[leaf.id] = window[t]
        for n in order:
            if n.id in inner:
                continue
            if isinstance(n, Leaf):
                inner[n.id] = np.broadcast_to(n.array.astype(np.float64), n.shape)
            else:
                inner[n.id] = evaluate_node(n, inner)
        h = np.asarray(inner[node.body.id], dtype=np.float64)
        out[t] = h
    return out


def run(
    program: Program, feeds: Mapping[str, np.ndarray], *, dot_rows: Mapping[int, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Every output of ``program`` (float32) for graph inputs and states given by name.
    ``dot_rows``: {Dot id: the weight rows to use instead of its own} (a kernel whose products
    read narrow weights: codegen.Kernel.dot_rows)."""
    values: dict[int, np.ndarray] = {}
    for node in program.nodes():
        if isinstance(node, Leaf):
            if node.role in ("input", "state"):
                if node.name not in feeds:
                    raise CompileError(f"no value given for {node.role} '{node.name}'")
                value = np.asarray(feeds[node.name], dtype=np.float64)
                if value.shape != node.shape:
                    raise CompileError(
                        f"{node.role} '{node.name}' is {list(value.shape)}, the program takes {list(node.shape)}"
                    )
                values[node.id] = value
            else:
                values[node.id] = np.broadcast_to(node.array.astype(np.float64), node.shape)
            continue
        if dot_rows and node.id in dot_rows:
            rows = np.asarray(dot_rows[node.id], dtype=np.float64)
            values[node.id] = np.asarray(values[node.src.id] @ rows.T).reshape(node.shape)
            continue
        values[node.id] = evaluate_node(node, values)
    return {name: values[node.id].astype(np.float32) for name, node in program.outputs.items()}


def delta_scan(node: DeltaScan, values: Mapping[int, np.ndarray]) -> np.ndarray:
    """The positions of a delta-rule recurrence in order, every state row at once (ir.DeltaScan)."""
    spec = EW[node.op]
    q, k, v = (values[x.id] for x in (node.q, node.k, node.v))
    gates = [values[g.id] for g in node.gates]
    S = np.array(values[node.init.id], dtype=np.float64)  # [B, H, Dv, Dk]
    T = node.steps
    out = np.empty(node.shape, dtype=np.float64)
    with np.errstate(all="ignore"):
        for t in range(T):
            kt = k[:, :, t][:, :, None, :]
            sk = (S * kt).sum(-1)[..., None]
            args = [g[:, :, t][..., None, None] for g in gates] + [kt, v[:, :, t][..., None], sk]
            S = np.asarray(spec.numpy(S, *args, ()), dtype=np.float64)
            out[..., t] = (S * q[:, :, t][:, :, None, :]).sum(-1)
    out[..., T:] = S
    return out


__all__ = ["body_loop", "delta_scan", "evaluate_node", "index_grid", "recur", "run"]
