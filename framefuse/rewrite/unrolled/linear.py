"""LinearScan from an unrolled linear recurrence h_t = a_t ⊙ h_{t−1} + b_t.

The proof: the step template (h_t in terms of h_{t−1}, see ``chains``) is walked and each node on
a path from h_{t−1} must be ``Add``/``Sub`` (of anything), ``Mul`` with exactly one factor
depending on h_{t−1}, ``Div`` with only the numerator depending on it, ``Neg`` or ``Identity``.
Walking it yields h_t = A ⊙ h_{t−1} + B with A and B expressions over leaves that do not depend on
h_{t−1} — the coefficients. Any other op on such a path declines the candidate with the op named
(e.g. "h_t depends on h_(t-1) through Tanh: not affine"). A and B are then lifted over all steps
(``lift``), broadcast to the state shape and fed to one LinearScan node.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite.base import Decline, RewriteContext, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder
from framefuse.rewrite.unrolled.chains import Chain, Tmpl
from framefuse.rewrite.unrolled.common import UnrolledPass, emit_state_outputs
from framefuse.rewrite.unrolled.graphutil import const_key, const_value
from framefuse.rewrite.unrolled.lift import Lifter

ONE = ("one",)
_AFFINE_OPS = {"Add", "Sub", "Neg", "Identity", "Mul", "Div"}


class NotAffine(Decline):
    pass


def _add(x, y):
    if x is None:
        return y
    if y is None:
        return x
    return ("add", x, y)


def _neg(x):
    return None if x is None else ("neg", x)


def _sub(x, y):
    if y is None:
        return x
    if x is None:
        return _neg(y)
    return ("sub", x, y)


def _mul(x, y):
    if x is None or y is None:
        return None
    if x == ONE:
        return y
    if y == ONE:
        return x
    return ("mul", x, y)


# Ops that only move or re-type data: on the path from h_(t-1) they keep the value affine when
# they leave it exactly as it was (a Cast to its own type, a Reshape/Expand to the same shape, a
# Transpose by the identity, a Slice taking everything...); see ``_passthrough``.
_LAYOUT_OPS = {"Reshape", "Expand", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Gather", "Concat", "Flatten"}


def _shape_of(t):
    shape = getattr(t, "shape", None)
    if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        return None
    return tuple(shape)


def _type_of(t):
    try:
        return None if t.dtype is None else np.dtype(t.dtype)
    except TypeError:
        return None


def _passthrough(tm: Tmpl) -> Tmpl | None:
    """The child ``tm`` equals element for element when its node is a no-op on the value (so the
    affine form passes through unchanged), else None."""
    node = tm.node
    if not tm.children or tm.children[0].kind == "leaf":
        return None
    child = tm.children[0]
    if node.op == "Cast":
        src, dst = _type_of(child.tensor), _type_of(tm.tensor)
        to = node.attrs.get("to")
        if to is not None:
            try:
                import onnx

                dst = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(to)))
            except Exception:  # noqa: BLE001 - unknown enum: not a no-op we can prove
                return None
        return child if src is not None and src == dst else None
    if node.op in _LAYOUT_OPS and node.op != "Concat":
        if any(c.kind != "leaf" for c in tm.children[1:]):
            return None  # the shape/index operand itself depends on h
        before, after = _shape_of(child.tensor), _shape_of(tm.tensor)
        if before is None or before != after:
            return None
        if node.op == "Transpose":
            perm = list(node.attrs.get("perm", reversed(range(len(before)))))
            # Only axes of size 1 may move: the element order is then unchanged.
            moved = [a for i, a in enumerate(perm) if a != i]
            return child if all(before[a] == 1 for a in moved) else None
        if node.op == "Gather":
            return None  # same shape but a permutation of indices is not provably the identity
        if node.op == "Slice":
            steps = const_value(tm.children[4].tensor) if len(tm.children) > 4 else None
            return child if steps is None or bool(np.all(steps == 1)) else None
        return child  # Reshape / Expand / Squeeze / Unsqueeze / Flatten to the same shape
    return None


def _layout_reason(tm: Tmpl) -> str:
    before = _shape_of(tm.children[0].tensor) if tm.children else None
    return (
        f"it changes the layout of the state ({before} → {_shape_of(tm.tensor)}) inside the step, so h_t is "
        "not an elementwise function of h_(t-1) in its own layout; "
    )


def _cast_reason(tm: Tmpl) -> str:
    src = _type_of(tm.children[0].tensor) if tm.children else None
    return (
        f"it converts the state from {src} to {_type_of(tm.tensor)} inside the step (the fused scan keeps "
        "float32 throughout and would skip that rounding); "
    )


def _diagonal_scale(tm: Tmpl):
    """(index of the h operand, constant broadcasting like the diagonal) when a MatMul multiplies h
    by a constant diagonal matrix: h @ D scales the last axis, D @ h the one before it — the only
    matrix products of h an elementwise scan can carry."""
    h_side = [k for k, c in enumerate(tm.children) if c.kind != "leaf"]
    if len(h_side) != 1:
        return None
    k = h_side[0]
    value = const_value(tm.children[1 - k].tensor)
    if value is None or value.ndim != 2 or value.shape[0] != value.shape[1]:
        return None
    if np.any(value - np.diag(np.diag(value))):
        return None
    diag = np.diag(value).astype(value.dtype)
    shaped = diag if k == 0 else diag.reshape(-1, 1)
    return k, gs.Constant(f"{tm.node.name}/diagonal", np.ascontiguousarray(shaped))


def _where(cond, yes, no):
    if yes is None and no is None:
        return None
    return ("where", cond, yes, no)


def _apply_node(node, data: np.ndarray) -> np.ndarray | None:
    """``node`` (a data-movement op) applied to ``data`` in place of its first input, by ONNX's
    reference evaluator; None when its other inputs are not constants or it cannot run."""
    consts = []
    for t in node.inputs[1:]:
        if not t.name:
            consts.append(None)
            continue
        value = const_value(t)
        if value is None:
            return None
        consts.append(np.asarray(value))
    names = ["x"] + [f"c{i}" if c is not None else "" for i, c in enumerate(consts)]
    attrs = {k: v for k, v in node.attrs.items() if isinstance(v, (int, float, str, list, tuple))}
    # Every unrolled step repeats the same op on the same shape: evaluate it once.
    cache_key = (
        node.op,
        repr(sorted(attrs.items())),
        data.shape,
        tuple(None if c is None else const_key(c) for c in consts),
    )
    if cache_key in _APPLY_CACHE:
        cached = _APPLY_CACHE[cache_key]
        return None if cached is None else cached.copy()
    result = _evaluate_node(node.op, names, attrs, data, consts)
    if len(_APPLY_CACHE) > 4096:
        _APPLY_CACHE.clear()
    _APPLY_CACHE[cache_key] = result
    return None if result is None else result.copy()


_APPLY_CACHE: dict = {}


def _evaluate_node(op, names, attrs, data, consts):
    import onnx
    from onnx.reference import ReferenceEvaluator

    try:
        onnx_node = onnx.helper.make_node(op, names, ["y"], **attrs)
        feeds = {"x": data, **{f"c{i}": c for i, c in enumerate(consts) if c is not None}}
        inputs = [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for n, v in feeds.items()
        ]
        graph = onnx.helper.make_graph(
            [onnx_node], "view", inputs, [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT64, None)]
        )
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])
    except Exception:  # noqa: BLE001 - an op the evaluator cannot run is simply not a provable view
        return None


def _view(tm: Tmpl, memo: dict):
    """Where the elements of ``tm``'s value sit in h_(t-1): an int64 array of the value's shape of
    indices into flattened h, or None when the value is laid out exactly like h."""
    return memo.get(("view", tm.tensor.name))


def _common_view(tm: Tmpl, parts, memo: dict):
    views = [_view(c, memo) for c, (a, _) in zip(tm.children, parts) if a is not None]
    first = views[0] if views else None
    for other in views[1:]:
        if (first is None) != (other is None) or first is not None and not np.array_equal(first, other):
            raise NotAffine(
                f"{tm.node.op} node {tm.node.name!r} combines h_(t-1) in two different layouts: "
                "not an elementwise function of h_(t-1)"
            )
    return first


def _rearrange(tm: Tmpl, memo: dict):
    """(A, B) of a data-movement node on the state path: the elements are rearranged, not changed,
    so the coefficients are rearranged the same way and the layout of h is tracked (``_view``)."""
    node, child = tm.node, tm.children[0]
    if any(c.kind != "leaf" for c in tm.children[1:]):
        return None
    a, b = affine(child, memo)
    where = _view(child, memo)
    h_shape = memo.get("_hole_shape")
    if h_shape is None:
        return None
    # The child's value is h laid out as ``where`` (shapes of folded tensors may be unknown).
    in_shape = _shape_of(child.tensor) or (tuple(where.shape) if where is not None else tuple(h_shape))
    if a is not None and in_shape != (tuple(where.shape) if where is not None else tuple(h_shape)):
        return None  # h broadcast to a larger shape before the rearrangement: not a pure relayout
    index = _apply_node(node, np.arange(int(np.prod(in_shape)), dtype=np.int64).reshape(in_shape))
    if index is None:
        return None
    if where is None:
        where = np.arange(int(np.prod(h_shape)), dtype=np.int64).reshape(h_shape)
    moved = where.reshape(-1)[index]
    identity = moved.shape == tuple(h_shape) and np.array_equal(moved.reshape(-1), np.arange(moved.size))
    memo[("view", tm.tensor.name)] = None if identity else moved
    if not identity:
        memo.setdefault("_view_nodes", []).append(f"{node.op} node {node.name!r}")

    def carry(e):
        return None if e is None else ("view", e, tuple(in_shape), index)

    return carry(a), carry(b)


def affine(tm: Tmpl, memo: dict | None = None):
    """(A, B) with value(tm) = A ⊙ h + B; A, B are expressions over leaves (None is 0)."""
    if memo is None:
        memo = {}
        result = affine(tm, memo)
        if _view(tm, memo) is not None:
            moved_by = ", ".join(memo.get("_view_nodes", [])) or "a layout op"
            raise NotAffine(
                f"h_t depends on h_(t-1) rearranged ({moved_by}): its elements do not return to "
                "their places within the step, so it is not an elementwise recurrence: not affine"
            )
        return result
    key = tm.tensor.name
    if key in memo:
        return memo[key]
    if tm.kind == "hole":
        memo["_hole_shape"] = _shape_of(tm.tensor)
        result = (ONE, None)
    elif tm.kind == "leaf":
        result = (None, ("leaf", tm.tensor))
    else:
        op, node = tm.node.op, tm.node
        passthrough = _passthrough(tm)
        if passthrough is not None:
            memo[key] = result = affine(passthrough, memo)
            memo[("view", key)] = _view(passthrough, memo)
            return result
        if op == "Where" and len(tm.children) == 3:
            cond, yes, no = (affine(c, memo) for c in tm.children)
            if cond[0] is not None:
                raise NotAffine(f"h_t depends on h_(t-1) through the condition of Where node {node.name!r}: not affine")
            memo[("view", key)] = _common_view(tm, [cond, yes, no], memo)
            result = (_where(cond[1], yes[0], no[0]), _where(cond[1], yes[1], no[1]))
            memo[key] = result
            return result
        if op == "MatMul" and len(tm.children) == 2:
            scale = _diagonal_scale(tm)
            if scale is not None:
                inner = affine(tm.children[scale[0]], memo)
                memo[("view", key)] = _view(tm.children[scale[0]], memo)
                leaf = ("leaf", scale[1])
                result = (_mul(inner[0], leaf), _mul(inner[1], leaf))
                memo[key] = result
                return result
        if op in _LAYOUT_OPS and op != "Concat" and tm.children and tm.children[0].kind != "leaf":
            result = _rearrange(tm, memo)
            if result is not None:
                memo[key] = result
                return result
        if op not in _AFFINE_OPS:  # named before looking inside, so the outermost culprit is reported
            why = (
                "a matrix product mixes the channels, it is not an elementwise recurrence (no framefuse op "
                "carries a matrix-valued transition); "
                if op in ("MatMul", "Gemm", "Einsum", "Conv")
                else _layout_reason(tm)
                if op in _LAYOUT_OPS
                else _cast_reason(tm)
                if op == "Cast"
                else ""
            )
            raise NotAffine(f"h_t depends on h_(t-1) through {op} (node {node.name!r}): {why}not affine")
        parts = [affine(c, memo) for c in tm.children]
        memo[("view", key)] = view = _common_view(tm, parts, memo)
        out_shape = _shape_of(tm.tensor)
        if view is not None and out_shape is not None and out_shape != view.shape:
            raise NotAffine(
                f"{op} node {node.name!r} broadcasts the rearranged h_(t-1) {view.shape} to {out_shape}: "
                "not an elementwise recurrence"
            )
        depends = [a is not None for a, _ in parts]
        where = f"{op} node {node.name!r}"
        if op == "Add":
            result = (_add(parts[0][0], parts[1][0]), _add(parts[0][1], parts[1][1]))
        elif op == "Sub":
            result = (_sub(parts[0][0], parts[1][0]), _sub(parts[0][1], parts[1][1]))
        elif op == "Neg":
            result = (_neg(parts[0][0]), _neg(parts[0][1]))
        elif op == "Identity":
            result = parts[0]
        elif op == "Mul":
            if all(depends):
                raise NotAffine(
                    f"h_t depends on h_(t-1) through a product of two terms that both depend on it "
                    f"({where}): not affine"
                )
            (a0, b0), (a1, b1) = parts
            if depends[0]:
                result = (_mul(a0, b1), _mul(b0, b1))
            else:
                result = (_mul(b0, a1), _mul(b0, b1))
        elif op == "Div":
            if depends[1]:
                raise NotAffine(f"h_t depends on h_(t-1) through the divisor of {where}: not affine")
            (a0, b0), (_, b1) = parts
            result = (None if a0 is None else ("div", a0, b1), None if b0 is None else ("div", b0, b1))
        else:
            raise NotAffine(f"h_t depends on h_(t-1) through {op} (node {node.name!r}): not affine")
    memo[key] = result
    return result


def expr_signature(e, lifter: Lifter):
    if e is None or e == ONE:
        return e
    if e[0] == "leaf":
        return ("leaf", lifter.key(e[1]))
    if e[0] == "view":
        return ("view", expr_signature(e[1], lifter), e[2], const_key(e[3]))
    return (e[0], *(expr_signature(x, lifter) for x in e[1:]))


class LinearScanPass(UnrolledPass):
    name = "unrolled-linear-scan"
    op_type = "LinearScan"
    report_problems = True  # the last pass: it reports the candidates no pass could use

    def rewrite_chain(
        self, graph: gs.Graph, ctx: RewriteContext, chain: Chain, lifter: Lifter, emit: GraphBuilder
    ) -> dict:
        tl = lifter.tl
        shapes = tl.shapes
        if chain.coupled_with:
            raise Decline(
                f"the step reads another recurrent state ({', '.join(chain.coupled_with)}): a coupled "
                "recurrence, not one LinearScan"
            )
        state_shape = shapes.need_shape(chain.states[-1], "final state")
        dtype = shapes.dtype(chain.states[-1])
        if dtype != np.float32:
            raise Decline(
                f"state {chain.states[-1].name!r} is {dtype}, only float32 graphs are rewritten "
                "(lower the precision after the rewrite)"
            )
        for h in chain.states[1:]:
            if shapes.shape(h) != state_shape:
                raise Decline(f"state {h.name!r} has shape {shapes.shape(h)}, expected {state_shape}")
        coeffs = [affine(link) for link in chain.structural_links]
        sigs = [[expr_signature(e, lifter) for e in pair] for pair in coeffs]
        if (
            len(sigs) > 2
            and sigs[0] != sigs[1]
            and all(sig == sigs[1] for sig in sigs[2:])
            and const_value(chain.states[0]) is not None
            and not chain.folded_first
        ):
            # Constant folding rewrote the first step around the constant h_0 (-h_0 became a
            # constant). The step is the same function of its frame as the others: their
            # coefficients, lifted over every frame, give it too (ORT parity is checked).
            coeffs, sigs = coeffs[1:], sigs[1:]
        for i, sig in enumerate(sigs[1:], start=1):
            if sig != sigs[0]:
                raise Decline(f"step {i} has different coefficients than step 0")
        a_expr, b_expr = coeffs[0]
        if a_expr is None:
            raise NotAffine("h_t does not depend on h_(t-1)")
        steps = chain.steps
        rank = len(state_shape)
        full = (steps, *state_shape)
        a = emit.expand(self._emit_expr(a_expr, lifter, emit, rank), full, np.float32)
        b = (
            emit.expand(self._emit_expr(b_expr, lifter, emit, rank), full, np.float32)
            if b_expr is not None
            else emit.const(np.zeros(full, np.float32))
        )
        batch = state_shape[0] if rank >= 2 else 1
        width = int(np.prod(state_shape[1:])) if rank >= 2 else int(np.prod(state_shape))
        perm = [1, 0, *range(2, rank + 1)] if rank >= 2 else list(range(rank + 1))
        moved = (batch, steps, *state_shape[1:]) if rank >= 2 else full

        def to_bdt(t):
            return emit.reshape(emit.transpose(t, perm, moved, np.float32), (batch, steps, width), np.float32)

        h0 = chain.states[0]
        h0_value = const_value(h0)
        if h0_value is not None and not np.any(h0_value):
            h0_in = None  # zeros: the op's default
        else:
            if shapes.shape(h0) != state_shape:
                h0 = emit.expand(h0, state_shape, np.float32)
            h0_in = emit.reshape(h0, (batch, width), np.float32)
        h_all = gs.Variable(ctx.unique_name("linear_scan_h"), dtype=np.float32, shape=[batch, steps, width])
        h_last = gs.Variable(ctx.unique_name("linear_scan_h_last"), dtype=np.float32, shape=[batch, width])
        node = make_framefuse_node(graph, ctx, "LinearScan", [to_bdt(a), to_bdt(b), h0_in], [h_all, h_last])
        emit.new_nodes.append(node)
        # Per-step states [T, *state] (time-major) for the consumers of h_1 .. h_{T-1}.
        if steps > 1:
            h_tm = emit.transpose(emit.reshape(h_all, moved, np.float32), perm, full, np.float32)
        else:
            h_tm = None
        emit_state_outputs(graph, emit, chain, h_tm, emit.reshape(h_last, state_shape, np.float32), state_shape)
        return {"node": node, "steps": steps, "state_shape": list(state_shape)}

    def _emit_expr(self, e, lifter: Lifter, emit: GraphBuilder, rank: int):
        """Emit ``e`` time-major with rank ``rank + 1`` (size-1 axes where it broadcasts)."""
        if e == ONE:
            return emit.const(np.ones((1,) * (rank + 1), np.float32))
        if e[0] == "leaf":
            leaf = e[1]
            shape = lifter.shapes.need_shape(leaf)
            if len(shape) > rank:
                raise Decline(f"coefficient {leaf.name!r} {shape} has a higher rank than the state")
            if lifter.tl.time_of(leaf):
                return lifter._align(leaf, rank)
            pad = rank - len(shape)
            return emit.unsqueeze(leaf, list(range(pad + 1)), (1,) * (pad + 1) + tuple(shape), lifter.dtype(leaf))
        if e[0] == "view":  # the coefficient rearranged like h: gather its elements by index
            _, inner, in_shape, index = e
            value = self._emit_expr(inner, lifter, emit, len(in_shape))
            value = emit.node("Expand", [value, emit.ints((1, *in_shape))], None, np.float32)
            flat = emit.node("Reshape", [value, emit.ints((0, -1))], None, np.float32)
            picked = emit.node(
                "Gather", [flat, emit.const(index.astype(np.int64))], None, np.float32, attrs={"axis": 1}
            )
            if index.ndim > rank:
                raise Decline(f"a rearranged coefficient has rank {index.ndim}, the state {rank}")
            if index.ndim < rank:  # broadcast from the right, after the time axis
                picked = emit.unsqueeze(picked, list(range(1, rank - index.ndim + 1)), None, np.float32)
            return picked
        if e[0] == "where":
            cond = self._emit_expr(e[1], lifter, emit, rank)
            zero = emit.const(np.zeros((1,) * (rank + 1), np.float32))
            yes = zero if e[2] is None else self._emit_expr(e[2], lifter, emit, rank)
            no = zero if e[3] is None else self._emit_expr(e[3], lifter, emit, rank)
            return emit.node("Where", [cond, yes, no], None, np.float32)
        args = [self._emit_expr(x, lifter, emit, rank) for x in e[1:]]
        op = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "neg": "Neg"}[e[0]]
        return emit.node(op, args, None, np.float32)
