"""ONNX ``LSTM`` / ``GRU`` nodes → framefuse ``LSTMSeq`` / ``GRUSeq``.

The fused ops run one direction over ``[T, B, I]`` with weights ``[4H, I]`` / ``[3H, I]`` (no
num_directions axis) and float32 states ``[B, H]``. This pass therefore

- takes direction d of W, R, B, initial_h, initial_c (folded for initializers, Gather otherwise),
- moves ``layout=1`` (batch-first) tensors to time-major and back,
- runs the reverse direction as a forward op on the time-reversed input (Slice with step −1)
  and reverses its Y back, so ``direction="reverse"`` and ``"bidirectional"`` are rewritten too
  (bidirectional = two fused nodes, outputs concatenated on the num_directions axis),
- rebuilds Y ``[T, num_dirs, B, H]`` (``[B, T, num_dirs, H]`` for layout 1), Y_h and Y_c
  in ONNX's shapes for the existing consumers (the Unsqueeze/Squeeze pairs this leaves are
  cancelled by the pipeline).

Declined with a reason: plain ``RNN`` (no fused op), peepholes (non-zero ``P``), ``clip``,
``input_forget``, non-default activations, variable ``sequence_lens``, GRU with
``linear_before_reset=0``.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from framefuse.rewrite import util as U
from framefuse.rewrite.base import AnchoredPass, Decline, Match, RewriteContext, make_framefuse_node
from framefuse.rewrite.builder import GraphBuilder

_DEFAULT_ACTIVATIONS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}
_GATES = {"LSTM": 4, "GRU": 3}
_FUSED_OP = {"LSTM": "LSTMSeq", "GRU": "GRUSeq"}


def _attr_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _input(node: gs.Node, i: int) -> gs.Tensor | None:
    if i >= len(node.inputs) or U.is_empty(node.inputs[i]):
        return None
    return node.inputs[i]


def _output(graph: gs.Graph, node: gs.Node, i: int) -> gs.Tensor | None:
    """Output i when something reads it (a consumer or a graph output), else None."""
    if i >= len(node.outputs) or U.is_empty(node.outputs[i]):
        return None
    t = node.outputs[i]
    return t if (t.outputs or U.is_graph_output(graph, t)) else None


class RnnNodePass(AnchoredPass):
    name = "rnn_nodes"

    def anchors(self, graph: gs.Graph):
        for node in list(graph.nodes):
            if node.domain in ("", "ai.onnx", None) and (node.op == "RNN" or node.op in _FUSED_OP):
                yield node

    def rewrite(self, graph: gs.Graph, ctx: RewriteContext, node: gs.Node) -> list[Match]:
        if node.op == "RNN":
            raise Decline(
                "ONNX RNN (Elman) node: framefuse has no fused op for it (left as it stands: the "
                "cuda-graph engine runs it as a loop over time, the step compiler as a loop in its kernel)"
            )
        self._check(node)
        return self._rewrite(graph, ctx, node)

    # -- checks -----------------------------------------------------------------------------

    def _check(self, node: gs.Node) -> None:
        """Decline (the reason) what the fused op cannot compute exactly."""
        op = node.op
        attrs = node.attrs
        direction = _attr_str(attrs.get("direction", "forward"))
        if direction not in ("forward", "reverse", "bidirectional"):
            raise Decline(f"unknown direction {direction!r}")
        n_dirs = 2 if direction == "bidirectional" else 1
        if "hidden_size" not in attrs:
            raise Decline("hidden_size attribute missing")
        if attrs.get("clip") is not None:
            raise Decline(f"clip={attrs['clip']} (cell clipping) is not supported by {_FUSED_OP[op]}")
        if op == "LSTM" and int(attrs.get("input_forget", 0)) != 0:
            raise Decline("input_forget=1 (coupled input-forget gate) is not supported by LSTMSeq")
        if op == "GRU" and int(attrs.get("linear_before_reset", 0)) != 1:
            raise Decline("GRU with linear_before_reset=0: GRUSeq implements linear_before_reset=1 (torch's GRU) only")
        acts = attrs.get("activations")
        if acts is not None:
            names = [_attr_str(a).lower() for a in acts]
            if names != _DEFAULT_ACTIVATIONS[op] * n_dirs:
                raise Decline(f"non-default activations {names} (fused op uses {_DEFAULT_ACTIVATIONS[op]})")
        if attrs.get("activation_alpha") is not None or attrs.get("activation_beta") is not None:
            raise Decline("activation_alpha/activation_beta given (parametric activations are not supported)")
        x = _input(node, 0)
        x_dtype = U.np_dtype(x)
        if x_dtype is None or x_dtype not in (np.float32, np.float16):
            raise Decline(f"input X has dtype {x_dtype}, expected float32 or float16")
        layout = int(attrs.get("layout", 0))
        x_shape = U.static_shape(x)
        seq_lens = _input(node, 4)
        if seq_lens is not None:
            value = U.const_value(seq_lens)
            if value is None or x_shape is None or not np.all(value == x_shape[1 if layout else 0]):
                raise Decline("sequence_lens given (variable-length sequences): the fused op runs all T steps")
        if op == "LSTM":
            peephole = _input(node, 7)
            if peephole is not None:
                value = U.const_value(peephole)
                if value is None or np.any(value != 0):
                    raise Decline("peephole connections (input P) are not supported by LSTMSeq")
        if direction != "forward" and x_shape is None:
            raise Decline(
                f"direction={direction} needs a static sequence length to reverse the input; X has shape {x.shape}"
            )
        for i, what in ((1, "W"), (2, "R")):
            t = _input(node, i)
            if t is None:
                raise Decline(f"input {what} missing")
            shape = U.static_shape(t)
            if shape is not None and (len(shape) != 3 or shape[0] != n_dirs):
                raise Decline(f"input {what} has shape {list(shape)}, expected [{n_dirs}, ...]")

    # -- rewrite ----------------------------------------------------------------------------

    def _rewrite(self, graph: gs.Graph, ctx: RewriteContext, node: gs.Node) -> list[Match]:
        gb = GraphBuilder(graph, ctx)
        op = node.op
        fused_op = _FUSED_OP[op]
        attrs = node.attrs
        direction = _attr_str(attrs.get("direction", "forward"))
        n_dirs = 2 if direction == "bidirectional" else 1
        layout = int(attrs.get("layout", 0))
        hidden = int(attrs["hidden_size"])
        x = node.inputs[0]
        x_dtype = U.np_dtype(x)
        U.static_shape(x)

        # Time-major input [T, B, I].
        x_tbi = gb.transpose(x, [1, 0, 2]) if layout == 1 else x
        tbi = U.static_shape(x_tbi)
        T, B = (tbi[0], tbi[1]) if tbi else (None, None)
        w, r, bias = _input(node, 1), _input(node, 2), _input(node, 3)
        h0_all = _input(node, 5)
        c0_all = _input(node, 6) if op == "LSTM" else None
        state_axis = 1 if layout == 1 else 0  # the num_directions axis of initial_h / Y_h

        y_out, yh_out = _output(graph, node, 0), _output(graph, node, 1)
        yc_out = _output(graph, node, 2) if op == "LSTM" else None

        ys, hs, cs, matches = [], [], [], []
        for d in range(n_dirs):
            backwards = direction == "reverse" or d == 1
            x_d = gb.reverse(x_tbi, 0, T) if backwards else x_tbi
            inputs = [
                x_d,
                gb.gather(w, d),
                gb.gather(r, d),
                gb.gather(bias, d) if bias is not None else None,
            ]
            for state in (h0_all, c0_all) if op == "LSTM" else (h0_all,):
                zeros = U.const_value(state) if state is not None else None
                if zeros is not None and not np.any(zeros):
                    state = None  # an all-zero initial state is the op's default: leave it out
                inputs.append(gb.cast(gb.gather(state, d, axis=state_axis), np.float32) if state is not None else None)
            y_d = gb.var(f"{fused_op}_Y", x_dtype, (T, B, hidden) if T else None)
            outs = [y_d, gb.var(f"{fused_op}_h_last", np.float32, (B, hidden) if B else None)]
            if op == "LSTM":
                outs.append(gb.var(f"{fused_op}_c_last", np.float32, (B, hidden) if B else None))
            fused = make_framefuse_node(graph, ctx, fused_op, inputs, outs)
            ys.append(gb.reverse(y_d, 0, T) if backwards else y_d)
            hs.append(outs[1])
            if op == "LSTM":
                cs.append(outs[2])
            matches.append(
                Match(
                    self.name,
                    fused_op,
                    fused.name,
                    [U.node_label(node)],
                    {
                        "source_op": op,
                        "direction": direction,
                        "part": "backward" if backwards else "forward",
                        "hidden_size": hidden,
                        "layout": layout,
                    },
                )
            )

        if y_out is not None:
            if layout == 1:
                parts = [gb.unsqueeze(gb.transpose(y, [1, 0, 2]), 2) for y in ys]
                y_new = parts[0] if n_dirs == 1 else gb.concat(parts, 2)
            else:
                parts = [gb.unsqueeze(y, 1) for y in ys]
                y_new = parts[0] if n_dirs == 1 else gb.concat(parts, 1)
            U.replace_tensor(graph, y_out, y_new)
        for out, states in ((yh_out, hs), (yc_out, cs)):
            if out is None:
                continue
            parts = [gb.unsqueeze(s, state_axis) for s in states]
            s_new = parts[0] if n_dirs == 1 else gb.concat(parts, state_axis)
            U.replace_tensor(graph, out, gb.cast(s_new, U.np_dtype(out) or x_dtype))
        U.detach_outputs(node)
        return matches
