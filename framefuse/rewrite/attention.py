"""Attention → framefuse ``Attention``.

Two sources:

1. ``AttentionPass``: the decomposed pattern every exporter writes,
   ``MatMul(Q, Kᵀ) → scale → mask → Softmax(−1) → MatMul(·, V)``. It covers hand-written
   attention and torch's legacy export of ``F.scaled_dot_product_attention``, which
   (torch 2.11–2.13, opset 17) emits: ``Mul(Q, √s)``, ``Mul(Transpose(K), √s)`` with
   ``s = 1/√Dh`` computed from ``Shape`` (constant after folding), ``MatMul``, for ``is_causal``
   an ``Add`` of ``Where(Trilu(ones)==0, −inf, 0)`` (constant after folding), for a float
   ``attn_mask`` an ``Add``, for a bool one an ``Add`` of ``Where(mask, 0, −inf)`` and after the
   Softmax ``Where(IsNaN(p), 0, p)`` (fully masked rows → 0, as the fused op does), then
   ``MatMul(p, V)``. GQA via ``repeat_interleave`` exports as
   ``Reshape(Tile(Unsqueeze(kv, 2), [1,1,n,1,1]))``; via ``expand`` (HF's ``repeat_kv``) as
   ``Reshape(Expand(Unsqueeze(kv, 2)))``: both give query head h the KV head h // n, exactly the
   op's grouping, so the un-repeated K/V are fed to the node. Anything else (e.g.
   ``K.repeat(1, n, 1, 1)``, which gives head h the KV head h % Hkv) is passed as is, Hkv = Hq.
2. ``OnnxAttentionPass``: the opset-23 ``Attention`` op (4-D or 3-D inputs, optional mask,
   past_key/past_value concatenated in the graph, ``is_causal``).

Masks: every additive term is normalised to one of the op's mask layouts; a constant mask that is
exactly the bottom-right-aligned causal mask (query i sees keys j ≤ i + Tk − Tq) becomes
``causal=1``; an all-zero one disappears; any other mask is passed as the ``mask`` input.
The pass declines (with the reason) when it is unsure: softmax over another axis, a scale that is
not a positive constant, an op it does not understand between the MatMuls, probabilities that
something else also reads, V's head size different from Q's.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Match, NotACandidate, RewriteContext, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder

# A mask value at or below this is "masked out": exp(x + score) is 0 in float32 for any sane score.
MASKED_OUT = -1e9


def _is_default(node: gs.Node | None) -> bool:
    return node is not None and node.domain in ("", "ai.onnx", None)


def _op(t: gs.Tensor, *ops: str) -> gs.Node | None:
    node = U.producer_op(t, *ops)
    return node if _is_default(node) else None


def _scalar_operand(node: gs.Node) -> tuple[gs.Tensor, float] | None:
    """For Mul/Div with one constant one-element operand: (the other operand, the factor)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    vb, va = U.scalar_value(b), U.scalar_value(a)
    if node.op == "Mul":
        if vb is not None:
            return a, vb
        if va is not None:
            return b, va
    if node.op == "Div" and vb is not None and vb != 0:
        return a, 1.0 / vb
    return None


def _peel_scales(t: gs.Tensor) -> tuple[gs.Tensor, float, list[gs.Node]]:
    """Walk up through Mul/Div by constant scalars; returns (source, product of factors, nodes)."""
    factor, nodes = 1.0, []
    while True:
        node = _op(t, "Mul", "Div")
        operand = _scalar_operand(node) if node is not None else None
        if operand is None:
            return t, factor, nodes
        t, f = operand
        factor *= f
        nodes.append(node)


def _is_float_cast(node: gs.Node) -> bool:
    """A Cast between float types (fp16/bf16/fp32/fp64): a precision change, not a new value."""
    src = U.np_dtype(node.inputs[0])
    to = int(node.attrs.get("to", 0))
    return src is not None and src.kind == "f" and to in (1, 10, 11, 16)


def _reaches_matmul(t: gs.Tensor, depth: int = 6) -> bool:
    """Whether `t` is computed from a MatMul through the ops a score path may contain."""
    for _ in range(depth):
        node = U.producer(t)
        if not _is_default(node):
            return False
        if node.op == "MatMul":
            return True
        if node.op in ("Mul", "Div"):
            operand = _scalar_operand(node)
            if operand is None:  # a runtime scale: still a score path (declined later, with the reason)
                return any(_reaches_matmul(i, depth - 1) for i in node.inputs)
            t = operand[0]
        elif node.op == "Add":
            return any(_reaches_matmul(i, depth - 1) for i in node.inputs)
        elif node.op == "Where":
            return any(_reaches_matmul(i, depth - 1) for i in node.inputs[1:])
        elif node.op == "Cast" and _is_float_cast(node):
            t = node.inputs[0]
        else:
            return False
    return False


def _path_to_matmul(t: gs.Tensor, depth: int = 4) -> list[str]:
    """Labels of the single-reader nodes from ``t`` down to a MatMul that reads the result as
    its left operand (P·V), or [] when there is none within ``depth`` nodes."""
    path = []
    for _ in range(depth):
        readers = list(t.outputs)
        if len(readers) != 1 or not _is_default(readers[0]) or not readers[0].outputs:
            return []
        node = readers[0]
        path.append(U.node_label(node))
        if node.op == "MatMul":
            return path if node.inputs[0] is t and len(path) > 1 else []
        t = node.outputs[0]
    return []


def _unrepeat_heads(t: gs.Tensor) -> tuple[gs.Tensor, int] | None:
    """If `t` [B, Hkv·n, T, D] is a head repeat of a tensor [B, Hkv, T, D] in which repeated head
    h comes from head h // n (repeat_interleave / expand-then-reshape), return (that tensor, n)."""
    reshape = _op(t, "Reshape")
    out_shape = U.static_shape(t)
    if reshape is None or out_shape is None or len(out_shape) != 4:
        return None
    mid = reshape.inputs[0]
    mid_shape = U.static_shape(mid)
    rep = _op(mid, "Tile", "Expand")
    if rep is None or mid_shape is None or len(mid_shape) != 5:
        return None
    b, hkv, n, tt, d = mid_shape
    if (b, hkv * n, tt, d) != out_shape:
        return None
    src = rep.inputs[0]
    unsq = _op(src, "Unsqueeze")
    if unsq is not None:
        axes = U.const_value(unsq.inputs[1]) if len(unsq.inputs) > 1 else None
        if axes is None or [int(a) % 5 for a in np.ravel(axes)] != [2]:
            return None
        base = unsq.inputs[0]
    else:
        return None
    if U.static_shape(base) != (b, hkv, tt, d):
        return None
    if rep.op == "Tile":
        reps = U.const_value(rep.inputs[1])
        if reps is None or [int(r) for r in np.ravel(reps)] != [1, 1, n, 1, 1]:
            return None
    # Expand: the input shape [B, Hkv, 1, T, D] and output shape [B, Hkv, n, T, D] (checked
    # above) pin the broadcast to the new axis.
    return base, n


def causal_offset_mask(tq: int, tk: int) -> np.ndarray:
    """Boolean [Tq, Tk]: True where query i may see key j (j ≤ i + Tk − Tq, bottom-right)."""
    i = np.arange(tq)[:, None]
    j = np.arange(tk)[None, :]
    return j <= i + (tk - tq)


def is_bottom_right_causal(mask2d: np.ndarray) -> bool:
    tq, tk = mask2d.shape
    if tk < tq:
        return False  # some rows would be fully masked; keep the explicit mask
    allowed = causal_offset_mask(tq, tk)
    return bool(np.all(mask2d[allowed] == 0) and np.all(mask2d[~allowed] <= MASKED_OUT))


class _MaskBuilder:
    """Collects the additive mask terms of one attention block and emits one mask input."""

    def __init__(self):
        self.terms: list[tuple[gs.Tensor, float]] = []

    def add(self, t: gs.Tensor, factor: float):
        self.terms.append((t, factor))

    def build(self, graph, ctx, full_shape: tuple[int, int, int, int], dtype) -> tuple[gs.Tensor | None, int, dict]:
        """(mask input or None, causal flag, detail) for scores of shape [B, Hq, Tq, Tk]."""
        gb = GraphBuilder(graph, ctx)
        if not self.terms:
            return None, 0, {"mask": "none"}
        b, h, tq, tk = full_shape
        values = [U.const_value(t) for t, _ in self.terms]
        if all(v is not None for v in values):
            with np.errstate(invalid="ignore", over="ignore"):
                total = sum(
                    np.broadcast_to(v.astype(np.float32) * np.float32(f), full_shape)
                    for v, (_, f) in zip(values, self.terms)
                )
            total = np.asarray(total, dtype=np.float32)
            if np.isnan(total).any():
                raise Decline("constant mask contains NaN")
            same_everywhere = bool(np.all(total == total[:1, :1]))
            if same_everywhere:
                m2 = total[0, 0]
                if np.all(m2 == 0):
                    return None, 0, {"mask": "all-zero constant (dropped)"}
                if is_bottom_right_causal(m2):
                    return None, 1, {"mask": "constant causal mask → causal=1"}
                return gb.const(m2.astype(dtype), name="attn_mask"), 0, {"mask": "constant [Tq,Tk]"}
            if np.all(total == total[:, :1]):
                return (gb.const(total[:, :1].astype(dtype), name="attn_mask"), 0, {"mask": "constant [B,1,Tq,Tk]"})
            return gb.const(total.astype(dtype), name="attn_mask"), 0, {"mask": "constant [B,Hq,Tq,Tk]"}
        # Variable mask terms: sum them in the graph, then bring the sum to a layout the op takes.
        mask = None
        for t, f in self.terms:
            if U.np_dtype(t) is None or U.np_dtype(t).kind != "f":
                raise Decline(f"mask {t.name} has dtype {U.np_dtype(t)}, expected a float additive mask")
            if f != 1.0:
                t = gb.node(
                    "Mul",
                    [t, gb.const(np.asarray(f, dtype=U.np_dtype(t)), name="mask_scale")],
                    shape=U.static_shape(t),
                    dtype=t.dtype,
                )
            if mask is None:
                mask = t
            else:
                shape = (
                    np.broadcast_shapes(U.static_shape(mask), U.static_shape(t))
                    if U.static_shape(mask) and U.static_shape(t)
                    else None
                )
                mask = gb.node("Add", [mask, t], shape=shape, dtype=mask.dtype)
        mask = gb.cast(mask, dtype)
        shape = U.static_shape(mask)
        if shape is None:
            raise Decline(f"mask {mask.name} has no static shape")
        try:
            np.broadcast_shapes(shape, full_shape)
        except ValueError:
            raise Decline(f"mask shape {list(shape)} does not broadcast to the scores {list(full_shape)}") from None
        if shape == (tq, tk) or shape == (b, 1, tq, tk) or shape == full_shape:
            return mask, 0, {"mask": f"input {list(shape)}"}
        if len(shape) <= 4 and shape[-2:] == (tq, tk) and all(d == 1 for d in shape[:-2]):
            return gb.reshape(mask, (tq, tk)), 0, {"mask": f"input {list(shape)} → [Tq,Tk]"}
        # Broadcast explicitly, keeping a head axis of 1 when the mask has no per-head values.
        per_head = len(shape) >= 3 and shape[-3] != 1
        target = (b, h if per_head else 1, tq, tk)
        expanded = gb.node(
            "Expand",
            [mask, gb.const(np.asarray(target, dtype=np.int64), name="mask_shape")],
            shape=target,
            dtype=mask.dtype,
        )
        return expanded, 0, {"mask": f"input {list(shape)} expanded to {list(target)}"}


class AttentionPass(AnchoredPass):
    name = "attention"

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.op == "Softmax" and _is_default(node) and node.outputs:
                yield node

    def rewrite(self, graph: gs.Graph, ctx: RewriteContext, softmax: gs.Node) -> Match:
        gb = GraphBuilder(graph, ctx)
        removed = [softmax]
        probs = softmax.outputs[0]
        scores_in = softmax.inputs[0]
        if not _reaches_matmul(scores_in):
            raise NotACandidate
        # --- downstream: Softmax → [Where(IsNaN(p), 0, p)] → MatMul(p, V)
        readers = list(probs.outputs)
        pv = None
        while (
            len(readers) == 1
            and readers[0].op == "Cast"
            and _is_float_cast(readers[0])
            and len(readers[0].outputs[0].outputs) == 1
            and not U.is_graph_output(graph, probs)
        ):
            # Softmax computed in a wider type, cast back before P·V (mixed-precision exports);
            # transformers' eager attention writes two (softmax(dtype=float32).to(q.dtype), then
            # dropout's), which stay in the graph as float→float Casts.
            removed.append(readers[0])
            probs = readers[0].outputs[0]
            readers = list(probs.outputs)
        if len(readers) == 1 and readers[0].op == "MatMul" and readers[0].inputs[0] is probs:
            pv = readers[0]
        elif len(readers) == 2 and {r.op for r in readers} == {"IsNaN", "Where"}:
            isnan = next(r for r in readers if r.op == "IsNaN")
            guard = next(r for r in readers if r.op == "Where")
            zero = U.scalar_value(guard.inputs[1])
            if (
                guard.inputs[0] is isnan.outputs[0]
                and zero == 0
                and guard.inputs[2] is probs
                and len(guard.outputs[0].outputs) == 1
                and guard.outputs[0].outputs[0].op == "MatMul"
                and guard.outputs[0].outputs[0].inputs[0] is guard.outputs[0]
            ):
                pv = guard.outputs[0].outputs[0]
                removed += [isnan, guard]
        if pv is None:
            if any(r.op == "MatMul" for r in readers):
                names = ", ".join(U.node_label(r) for r in readers)
                raise Decline(
                    f"attention probabilities are also read by other nodes ({names}); fusing would not remove them"
                )
            path = _path_to_matmul(probs)
            if path:
                raise Decline(
                    f"the probabilities reach P·V ({path[-1]}) through {' → '.join(path[:-1])}, which the "
                    "attention pattern does not cover (only float Casts and the IsNaN guard)"
                )
            raise NotACandidate
        if U.is_graph_output(graph, probs) or U.is_graph_output(graph, softmax.outputs[0]):
            raise Decline("attention probabilities are a graph output")
        removed.append(pv)

        scores_shape = U.static_shape(scores_in)
        if scores_shape is None:
            raise Decline("attention scores have no static shape (run shape inference / export with static shapes)")
        rank = len(scores_shape)
        # Softmax's default axis is 1 before opset 13 (where it also flattens from that axis on:
        # the same as a last-axis softmax only when axis = rank − 1, which is what is checked).
        axis = int(softmax.attrs.get("axis", -1 if ctx.opset >= 13 else 1))
        if axis % rank != rank - 1:
            raise Decline(f"Softmax over axis {axis} of a rank-{rank} tensor, not over the keys (last axis)")
        if rank not in (3, 4):
            raise Decline(f"attention scores have rank {rank}, expected 3 or 4")

        # --- upstream: Softmax ← (Add mask | Where mask | Mul/Div scale)* ← MatMul(Q, Kᵀ)
        alpha = 1.0
        masks = _MaskBuilder()
        t = scores_in
        while True:
            node = U.producer(t)
            if not _is_default(node):
                raise Decline(f"unexpected producer of {t.name} on the score path")
            if node.op == "MatMul":
                qk = node
                break
            removed.append(node)
            if node.op == "Cast":
                if not _is_float_cast(node):
                    raise Decline(f"{U.node_label(node)} casts the scores to a non-float type")
                t = node.inputs[0]
            elif node.op in ("Mul", "Div"):
                operand = _scalar_operand(node)
                if operand is None:
                    raise Decline(f"score scale {U.node_label(node)} is not a constant scalar")
                t, f = operand
                alpha *= f
            elif node.op == "Add":
                a, b = node.inputs
                ra, rb = _reaches_matmul(a), _reaches_matmul(b)
                if ra == rb:
                    raise Decline(f"cannot tell scores from mask in {U.node_label(node)}")
                t, m = (a, b) if ra else (b, a)
                masks.add(m, alpha)
            elif node.op == "Where":
                cond, x, y = node.inputs
                vx, vy = U.scalar_value(x), U.scalar_value(y)
                if vy is not None and _reaches_matmul(x):  # keep scores where cond, else fill
                    t, fill, keep_if = x, vy, True
                elif vx is not None and _reaches_matmul(y):  # fill where cond, else scores
                    t, fill, keep_if = y, vx, False
                else:
                    raise Decline(f"{U.node_label(node)}: Where on the score path is not a masked fill")
                if fill > MASKED_OUT:
                    raise Decline(f"{U.node_label(node)}: masked fill value {fill} is not -inf (or ≤ {MASKED_OUT})")
                fill_term = self._fill_mask(graph, ctx, cond, keep_if)
                masks.add(fill_term, 1.0)
            else:
                raise Decline(f"op {node.op} ({U.node_label(node)}) between the QK MatMul and the Softmax")
        removed.append(qk)
        if alpha <= 0 or not np.isfinite(alpha):
            raise Decline(f"score scale {alpha} is not a positive finite constant")

        q, q_scale, q_nodes = _peel_scales(qk.inputs[0])
        kt, k_scale, k_nodes = _peel_scales(qk.inputs[1])
        removed += q_nodes + k_nodes
        scale = alpha * q_scale * k_scale
        tr = _op(kt, "Transpose")
        k = None
        if tr is not None:
            perm = list(tr.attrs.get("perm", []))
            if perm == list(range(rank - 2)) + [rank - 1, rank - 2]:
                k, k_scale2, k_nodes2 = _peel_scales(tr.inputs[0])
                scale *= k_scale2
                removed += [tr] + k_nodes2
        v = pv.inputs[1]

        # Shapes ([B,H,T,D], or [N,T,D] handled as B=1, H=N).
        q_shape, v_shape = U.static_shape(q), U.static_shape(v)
        kt_shape = U.static_shape(kt)
        if q_shape is None or v_shape is None or kt_shape is None:
            raise Decline("Q, K or V has no static shape")
        if not (len(q_shape) == len(v_shape) == len(kt_shape) == rank):
            raise Decline(f"Q/K/V ranks differ from the scores' rank {rank} (broadcasting MatMul)")
        if k is None:
            k = gb.transpose(kt, list(range(rank - 2)) + [rank - 1, rank - 2])
        dh, dv = q_shape[-1], v_shape[-1]
        if dv != dh:
            raise Decline(f"V head size {dv} differs from Q/K head size {dh} (the op needs Dv = Dh)")
        if scale <= 0 or not np.isfinite(scale):
            raise Decline(f"attention scale {scale} is not a positive finite constant")

        detail: dict = {}
        if rank == 4:
            k_base, v_base = _unrepeat_heads(k), _unrepeat_heads(v)
            if k_base and v_base and k_base[1] == v_base[1]:
                k, v = k_base[0], v_base[0]
                detail["kv_repeat"] = f"un-repeated x{k_base[1]} (repeat_interleave/expand of KV heads)"
            elif k_base or v_base:
                detail["kv_repeat"] = "repeat not provable for both K and V: repeated tensors passed"
        else:
            q, k, v = (gb.unsqueeze(x, 0) for x in (q, k, v))
        B, Hq, Tq, _ = U.static_shape(q)
        Bk, Hk, Tk, _ = U.static_shape(k)
        Bv, Hv, Tv, _ = U.static_shape(v)
        if not (B == Bk == Bv):
            raise Decline(f"batch sizes of Q/K/V differ ({B}, {Bk}, {Bv}): broadcasting over batch is not fused")
        if Hk != Hv or Tk != Tv or Hq % Hk != 0:
            raise Decline(f"heads/lengths do not group: Hq={Hq}, Hk={Hk}, Hv={Hv}, Tk={Tk}, Tv={Tv}")
        dtype = U.np_dtype(q)
        if dtype is None or dtype.kind != "f":
            raise Decline(f"Q has dtype {dtype}, expected a float type")
        mask_full = (B, Hq, Tq, Tk)
        if rank == 3:
            masks.terms = [
                (gb.unsqueeze(m, 0) if (U.static_shape(m) and len(U.static_shape(m)) == 3) else m, f)
                for m, f in masks.terms
            ]
        mask, causal, mdetail = masks.build(graph, ctx, mask_full, dtype)
        detail.update(mdetail)

        out = pv.outputs[0]
        U.detach_outputs(pv)
        attrs = {"scale": float(scale), "causal": int(causal)}
        if rank == 4:
            fused = make_framefuse_node(graph, ctx, "Attention", [q, k, v, mask], [out], attrs)
        else:
            o4 = gb.var("Attention_o", dtype, (B, Hq, Tq, dh))
            fused = make_framefuse_node(graph, ctx, "Attention", [q, k, v, mask], [o4], attrs)
            graph.nodes.append(
                gs.Node(
                    "Squeeze",
                    name=ctx.unique_name("Squeeze"),
                    inputs=[o4, gb.const(np.asarray([0], np.int64), name="axes")],
                    outputs=[out],
                )
            )
        detail.update({"q": [B, Hq, Tq, dh], "kv_heads": Hk, "Tk": Tk, "scale": float(scale), "causal": causal})
        names = []
        for n in removed:
            if U.node_label(n) not in names:
                names.append(U.node_label(n))
        return Match(self.name, "Attention", fused.name, names, detail)

    @staticmethod
    def _fill_mask(graph, ctx, cond: gs.Tensor, keep_if: bool) -> gs.Tensor:
        """Additive mask equal to Where(cond, scores, -inf) (keep_if) / Where(cond, -inf, scores)."""
        gb = GraphBuilder(graph, ctx)
        zero, neg = np.float32(0), np.float32(-np.inf)
        value = U.const_value(cond)
        x, y = (zero, neg) if keep_if else (neg, zero)
        if value is not None:
            return gb.const(np.where(value.astype(bool), x, y).astype(np.float32), name="fill_mask")
        return gb.where(
            cond,
            gb.const(np.asarray(x), name="zero_or_inf"),
            gb.const(np.asarray(y), name="zero_or_inf"),
            dtype=np.float32,
            shape=U.static_shape(cond),
        )


class OnnxAttentionPass(AnchoredPass):
    """The opset-23 ONNX ``Attention`` op → framefuse ``Attention``."""

    name = "onnx_attention"

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.op == "Attention" and _is_default(node):
                yield node

    def rewrite(self, graph, ctx, node: gs.Node) -> Match:
        gb = GraphBuilder(graph, ctx)

        def inp(i):
            return None if i >= len(node.inputs) or U.is_empty(node.inputs[i]) else node.inputs[i]

        def outp(i):
            if i >= len(node.outputs) or U.is_empty(node.outputs[i]):
                return None
            t = node.outputs[i]
            return t if (t.outputs or U.is_graph_output(graph, t)) else None

        attrs = node.attrs
        if float(attrs.get("softcap", 0.0)) != 0.0:
            raise Decline(f"softcap={attrs['softcap']} is not supported by the fused op")
        if int(attrs.get("qk_matmul_output_mode", 0)) != 0 or outp(3) is not None:
            raise Decline("the qk_matmul_output output is used")
        if inp(6) is not None:
            raise Decline("nonpad_kv_seqlen (opset 24) is not supported")
        if int(attrs.get("left_window_size", -1)) >= 0 or int(attrs.get("right_window_size", -1)) >= 0:
            raise Decline("sliding-window attributes are not supported")
        q, k, v, mask, past_k, past_v = (inp(i) for i in range(6))
        if (past_k is None) != (past_v is None):
            raise Decline("past_key and past_value must be given together")
        shapes = [U.static_shape(t) for t in (q, k, v)]
        if any(s is None for s in shapes):
            raise Decline("Q, K or V has no static shape")
        rank = len(shapes[0])
        dtype = U.np_dtype(q)
        if rank == 3:
            hq, hkv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
            if hq is None or hkv is None:
                raise Decline("3-D inputs without q_num_heads/kv_num_heads")
            hq, hkv = int(hq), int(hkv)

            def heads(t, h):
                b, s, hidden = U.static_shape(t)
                return gb.transpose(gb.reshape(t, (b, s, h, hidden // h)), [0, 2, 1, 3])

            q, k, v = heads(q, hq), heads(k, hkv), heads(v, hkv)
        elif rank != 4:
            raise Decline(f"inputs of rank {rank}, expected 3 or 4")
        B, Hq, Tq, Dh = U.static_shape(q)
        _, Hk, Tnew, _ = U.static_shape(k)
        Dv = U.static_shape(v)[3]
        if Dv != Dh:
            raise Decline(f"V head size {Dv} differs from Q/K head size {Dh}")
        past_len = 0
        # present_key/present_value readers are rewired at the end, once nothing can decline.
        presents = [(outp(1), k), (outp(2), v)]
        if past_k is not None:
            past_len = U.static_shape(past_k)[2]
            k = gb.concat([past_k, k], 2)
            v = gb.concat([past_v, v], 2)
            presents = [(outp(1), k), (outp(2), v)]
        Tk = U.static_shape(k)[2]
        if Hq % Hk != 0:
            raise Decline(f"q heads {Hq} not a multiple of kv heads {Hk}")
        scale = attrs.get("scale")
        scale = float(scale) if scale is not None else float(1.0 / np.sqrt(Dh))

        masks = _MaskBuilder()
        causal = 0
        if mask is not None:
            mshape = U.static_shape(mask)
            if mshape is None or mshape[-1] != Tk:
                raise Decline(f"attn_mask shape {mshape} does not cover all {Tk} keys (padding is not supported)")
            if U.np_dtype(mask) == np.bool_:
                mask = AttentionPass._fill_mask(graph, ctx, mask, keep_if=True)
            masks.add(mask, 1.0)
        if int(attrs.get("is_causal", 0)):
            if past_len == Tk - Tq:
                causal = 1  # ONNX aligns the causal frontier at offset past_len = Tk − Tq here
            else:
                allowed = np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + past_len
                masks.add(gb.const(np.where(allowed, 0.0, -np.inf).astype(np.float32), name="causal_mask"), 1.0)
        mask_t, mask_causal, detail = masks.build(graph, ctx, (B, Hq, Tq, Tk), dtype)
        causal = causal or mask_causal

        y_old = outp(0)
        for old, new in presents:
            if old is not None:
                U.replace_tensor(graph, old, new)
        U.detach_outputs(node)
        a = {"scale": scale, "causal": int(causal)}
        if rank == 4 and y_old is not None:
            fused = make_framefuse_node(graph, ctx, "Attention", [q, k, v, mask_t], [y_old], a)
        else:
            o = gb.var("Attention_o", dtype, (B, Hq, Tq, Dh))
            fused = make_framefuse_node(graph, ctx, "Attention", [q, k, v, mask_t], [o], a)
            if y_old is not None:
                merged = gb.reshape(gb.transpose(o, [0, 2, 1, 3]), (B, Tq, Hq * Dh))
                U.replace_tensor(graph, y_old, merged)
        detail.update(
            {"q": [B, Hq, Tq, Dh], "kv_heads": Hk, "Tk": Tk, "scale": scale, "causal": causal, "past_len": past_len}
        )
        return Match(self.name, "Attention", fused.name, [U.node_label(node)], detail)
