"""The whole rewrite: pipeline bookkeeping, Loop/Scan recurrences, the CLI (rewrite + check,
parity failure path) and the zoo models."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

from framefuse.parity import compare
from framefuse.plugins.registry import OpUnavailableError, get_op
from framefuse.rewrite import rewrite_model
from framefuse.rewrite.pipeline import MAX_IR_VERSION

TOL = 1e-4


def require_ops(*ops):
    for op in ops:
        try:
            get_op(op)
        except OpUnavailableError as exc:
            pytest.skip(f"reference of {op} not available yet: {exc}")


def fused_types(model):
    return sorted(n.op_type for n in model.graph.node if n.domain == "framefuse")


class GruAttentionNet(torch.nn.Module):
    """What a user writes without framefuse in mind: a GRU encoder, then causal self-attention."""

    def __init__(self, features=12, hidden=32, heads=4):
        super().__init__()
        self.heads = heads
        self.gru = torch.nn.GRU(features, hidden, batch_first=True)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, 5)

    def forward(self, x):
        h, _ = self.gru(x)
        b, t, c = h.shape
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, t, c))


def export_user_model(path):
    model = GruAttentionNet().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(2, 9, 12),),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
        )
    proto = onnx.load(str(path))
    proto.metadata_props.add(key="framefuse.arch", value="user-net")
    onnx.save(proto, str(path))
    return path


def test_user_model_gru_and_sdpa(tmp_path):
    require_ops("GRUSeq", "Attention")
    path = export_user_model(tmp_path / "model.onnx")
    fused, report = rewrite_model(path)
    assert fused_types(fused) == ["Attention", "GRUSeq"]
    assert report.remaining_total == 0
    assert {m.pass_name for m in report.matches} == {"rnn_nodes", "attention"}
    # bookkeeping of the written model
    assert any(i.domain == "framefuse" and i.version == 1 for i in fused.opset_import)
    assert fused.ir_version <= MAX_IR_VERSION
    props = {p.key: p.value for p in fused.metadata_props}
    assert props["framefuse.arch"] == "user-net" and props["framefuse.rewritten"] == "1"
    onnx.checker.check_model(fused)
    parity = compare(path, fused, tolerance=TOL)
    assert parity.passed, parity.summary()


def test_report_json_and_table(tmp_path):
    require_ops("GRUSeq")
    path = export_user_model(tmp_path / "model.onnx")
    _, report = rewrite_model(path)
    data = json.loads(report.write(tmp_path / "rewrite-report.json").read_text())
    assert data["fused_ops"]["GRUSeq"] == 1
    gru_match = next(m for m in data["matches"] if m["op_type"] == "GRUSeq")
    assert gru_match["removed"] == ["/gru/GRU"] and gru_match["removed_count"] == 1
    assert gru_match["node_name"].startswith("GRUSeq")
    assert data["remaining_per_timestep_ops"]["GRU"] == 0
    assert data["nodes_after"] < data["nodes_before"]
    from rich.console import Console

    buf = io.StringIO()
    report.print(Console(file=buf, width=200))
    assert "GRUSeq" in buf.getvalue() and "per-timestep ops left" in buf.getvalue()


def test_no_passes_leaves_ops_and_counts_them(tmp_path):
    path = export_user_model(tmp_path / "model.onnx")
    fused, report = rewrite_model(path, passes=[])
    assert fused_types(fused) == []
    assert report.remaining_per_timestep_ops["GRU"] == 1
    assert any(i.domain == "framefuse" for i in fused.opset_import)


# --- Loop / Scan -------------------------------------------------------------------------

T, Bt, D = 6, 2, 4


def scan_model(body_kind="linear"):
    """Scan over (g, x): h' = sigmoid(g)·h + tanh(x)·w (linear), or an LSTM-ish tanh(h) body."""
    h_term = "h_in" if body_kind == "linear" else "th"
    nodes = [
        oh.make_node("Sigmoid", ["g_t"], ["a"]),
        oh.make_node("Tanh", ["x_t"], ["tx"]),
        oh.make_node("Mul", ["tx", "w"], ["b"]),
        oh.make_node("Mul", ["a", h_term], ["ah"]),
        oh.make_node("Add", ["ah", "b"], ["h_out"]),
        oh.make_node("Identity", ["h_out"], ["y_t"]),
    ]
    if body_kind != "linear":
        nodes.insert(0, oh.make_node("Tanh", ["h_in"], ["th"]))
    body = oh.make_graph(
        nodes,
        "body",
        [oh.make_tensor_value_info(n, TP.FLOAT, [Bt, D]) for n in ("h_in", "g_t", "x_t")],
        [oh.make_tensor_value_info(n, TP.FLOAT, [Bt, D]) for n in ("h_out", "y_t")],
        initializer=[nh.from_array(np.linspace(0.5, 1.5, D).astype(np.float32), "w")],
    )
    scan = oh.make_node("Scan", ["h0", "g", "x"], ["h_final", "ys"], num_scan_inputs=2, body=body, name="my_scan")
    graph = oh.make_graph(
        [scan],
        "g",
        [
            oh.make_tensor_value_info("h0", TP.FLOAT, [Bt, D]),
            oh.make_tensor_value_info("g", TP.FLOAT, [T, Bt, D]),
            oh.make_tensor_value_info("x", TP.FLOAT, [T, Bt, D]),
        ],
        [
            oh.make_tensor_value_info("h_final", TP.FLOAT, [Bt, D]),
            oh.make_tensor_value_info("ys", TP.FLOAT, [T, Bt, D]),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def loop_model():
    """Loop over t with a_t = A[t], x_t = X[t] (Gather by the iteration number): h' = h·a_t + x_t."""
    body = oh.make_graph(
        [
            oh.make_node("Gather", ["A", "i"], ["a_t"], axis=0),
            oh.make_node("Gather", ["X", "i"], ["x_t"], axis=0),
            oh.make_node("Mul", ["h_in", "a_t"], ["ah"]),
            oh.make_node("Add", ["x_t", "ah"], ["h_out"]),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Identity", ["h_out"], ["y_t"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", TP.INT64, []),
            oh.make_tensor_value_info("cond_in", TP.BOOL, []),
            oh.make_tensor_value_info("h_in", TP.FLOAT, [Bt, D]),
        ],
        [
            oh.make_tensor_value_info("cond_out", TP.BOOL, []),
            oh.make_tensor_value_info("h_out", TP.FLOAT, [Bt, D]),
            oh.make_tensor_value_info("y_t", TP.FLOAT, [Bt, D]),
        ],
    )
    loop = oh.make_node("Loop", ["M", "", "h0"], ["h_final", "ys"], body=body, name="my_loop")
    graph = oh.make_graph(
        [loop],
        "g",
        [
            oh.make_tensor_value_info("h0", TP.FLOAT, [Bt, D]),
            oh.make_tensor_value_info("A", TP.FLOAT, [T, Bt, D]),
            oh.make_tensor_value_info("X", TP.FLOAT, [T, Bt, D]),
        ],
        [
            oh.make_tensor_value_info("h_final", TP.FLOAT, [Bt, D]),
            oh.make_tensor_value_info("ys", TP.FLOAT, [T, Bt, D]),
        ],
        initializer=[nh.from_array(np.array(T, np.int64), "M")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("make", [scan_model, loop_model], ids=["scan", "loop"])
def test_linear_recurrence_loops_become_linear_scan(make):
    require_ops("LinearScan")
    model = make()
    fused, report = rewrite_model(model)
    assert fused_types(fused) == ["LinearScan"]
    assert not any(n.op_type in ("Scan", "Loop") for n in fused.graph.node)
    assert report.remaining_per_timestep_ops["Scan"] == 0 and report.remaining_per_timestep_ops["Loop"] == 0
    assert report.matches[0].removed == [model.graph.node[0].name]
    parity = compare(model, fused, tolerance=TOL)
    assert parity.passed, parity.summary()
    assert {o.name for o in parity.outputs} == {"h_final", "ys"}


def test_nonlinear_scan_body_declined_then_unrolled():
    """A body no pass fuses (tanh of the state) is declined by the loops pass, then copied once a
    position into the graph (rewrite/unroll.py): no Scan left for the engines to run, the
    unrolled copies counted as per-timestep ops left, the outputs those of the Scan."""
    model = scan_model("lstm-like")
    fused, report = rewrite_model(model)
    assert not any(n.op_type in ("Scan", "Loop") for n in fused.graph.node)
    assert [n.op_type for n in fused.graph.node].count("Tanh") == 2 * T
    first, unrolled = report.declined[0], report.declined[1]
    assert first.where == "my_scan" and "A ⊙ h + B" in first.reason
    assert unrolled.where == "my_scan" and f"unrolled into {T} copies of its 7-node body" in unrolled.reason
    assert report.remaining_per_timestep_ops["Scan"] == 0 and report.remaining_per_timestep_ops["unrolled"] > 0
    parity = compare(model, fused, tolerance=TOL)
    assert parity.passed, parity.summary()
    # the engine, which has no Scan, plans and runs the unrolled graph
    from framefuse.engines.cuda_graph import CudaGraphEngine
    from framefuse.plugins.ort_bridge import ort_session

    rng = np.random.default_rng(1)
    feeds = {
        n: rng.standard_normal(s).astype(np.float32) for n, s in (("h0", [Bt, D]), ("g", [T, Bt, D]), ("x", [T, Bt, D]))
    }
    expected = ort_session(model, fused=False).run(["h_final", "ys"], feeds)
    actual = CudaGraphEngine(fused, device="cpu").run(feeds)
    for name, want in zip(["h_final", "ys"], expected):
        np.testing.assert_allclose(actual[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_unrolling_keeps_each_scan_direction_and_axis():
    """Scan inputs read backwards along axis 1, outputs stacked backwards along axis 1 (the body
    declined: tanh of the state): the unrolled graph gives ONNX Runtime's outputs."""
    model = scan_model("lstm-like")
    scan = model.graph.node[0]
    for name, value in (("scan_input_directions", [1, 0]), ("scan_output_directions", [1])):
        scan.attribute.append(oh.make_attribute(name, value))
    fused, report = rewrite_model(model)
    assert not any(n.op_type == "Scan" for n in fused.graph.node)
    parity = compare(model, fused, tolerance=TOL)
    assert parity.passed, parity.summary()


def test_a_loop_past_the_unroll_budget_stays_a_loop(monkeypatch):
    from framefuse.rewrite import unroll

    model = scan_model("lstm-like")
    monkeypatch.setattr(unroll, "UNROLL_MAX_NODES", 7 * T - 1)
    fused, report = rewrite_model(model)
    assert [n.op_type for n in fused.graph.node] == ["Scan"]
    assert f"{T} iterations of a 7-node body are more than {7 * T - 1} nodes unrolled" in report.declined[1].reason
    assert report.remaining_per_timestep_ops["Scan"] == 1


def test_loop_with_data_dependent_stop_declined():
    model = loop_model()
    body = model.graph.node[0].attribute[0].g
    for node in body.node:
        if node.output[0] == "cond_out":
            node.op_type = "Not"  # stop condition now computed in the body
    fused, report = rewrite_model(model)
    assert "stop condition" in report.declined[0].reason


# --- CLI -----------------------------------------------------------------------------------


def run_cli(argv):
    from framefuse.cli import main

    return main([str(a) for a in argv])


def test_cli_rewrite_writes_fused_graph_and_reports(tmp_path):
    require_ops("GRUSeq", "Attention")
    path = export_user_model(tmp_path / "model.onnx")
    assert run_cli(["rewrite", path, "-q"]) == 0
    fused_path = tmp_path / "model.fused.onnx"
    assert fused_path.is_file()
    assert fused_types(onnx.load(str(fused_path))) == ["Attention", "GRUSeq"]
    parity = json.loads((tmp_path / "parity-report.json").read_text())
    assert parity["passed"] is True and parity["fused"] == str(fused_path)
    assert json.loads((tmp_path / "rewrite-report.json").read_text())["fused_ops"] == {"GRUSeq": 1, "Attention": 1}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # `check` on the folder compares model.fused.onnx against model.onnx again
    assert run_cli(["check", tmp_path, "-q"]) == 0


def test_cli_parity_failure_writes_no_fused_graph(tmp_path, monkeypatch, capsys):
    require_ops("GRUSeq", "Attention")
    gru = get_op("GRUSeq")
    right = gru.reference

    def wrong(*inputs, **attrs):  # a reference that is off by 1 % must fail parity
        outs = right(*inputs, **attrs)
        return tuple(o * 1.01 for o in outs)

    monkeypatch.setattr(gru, "reference", wrong)
    path = export_user_model(tmp_path / "model.onnx")
    status = run_cli(["rewrite", path, "-q", "--tolerance", "1e-5"])
    assert status == 3  # ParityError
    assert not (tmp_path / "model.fused.onnx").exists()
    assert json.loads((tmp_path / "parity-report.json").read_text())["passed"] is False
    assert "does not match" in capsys.readouterr().err


def test_cli_check_needs_a_fused_graph(tmp_path, capsys):
    assert run_cli(["check", tmp_path]) == 2
    assert "fused graph not found" in capsys.readouterr().err


# --- the zoo ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,fused_op", [("lstm", "LSTMSeq"), ("gru", "GRUSeq"), ("attention", "Attention")])
def test_zoo_models_fully_fused(tmp_path, arch, fused_op):
    require_ops(fused_op)
    exporter = pytest.importorskip("framefuse.exporter")
    results = exporter.export_forms(arch, out_dir=tmp_path, forms=["sequence", "step"])
    assert len(results) == 2
    for result in results:
        fused, report = rewrite_model(result.model_path)
        assert report.remaining_total == 0, report.remaining_per_timestep_ops
        assert fused_op in fused_types(fused)
        assert not any(n.op_type in ("LSTM", "GRU", "Softmax") for n in fused.graph.node)
        parity = compare(result.model_path, fused, tolerance=TOL)
        assert parity.passed, f"{result.model_path}: {parity.summary()}"


def test_lstm_like_scan_body_unrolled_and_fused_as_lstm():
    """A Scan whose body is an LSTM cell (two carried states, gates from x·W + h·R)."""
    H, I = 3, 2
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((I, 4 * H)).astype(np.float32), "Wx")
    r = nh.from_array(rng.standard_normal((H, 4 * H)).astype(np.float32), "Rh")
    nodes = [
        oh.make_node("MatMul", ["x_t", "Wx"], ["gx"]),
        oh.make_node("MatMul", ["h_in", "Rh"], ["gh"]),
        oh.make_node("Add", ["gx", "gh"], ["g"]),
        oh.make_node("Split", ["g"], ["gi", "go", "gf", "gc"], axis=-1, num_outputs=4),
        oh.make_node("Sigmoid", ["gi"], ["i"]),
        oh.make_node("Sigmoid", ["go"], ["o"]),
        oh.make_node("Sigmoid", ["gf"], ["f"]),
        oh.make_node("Tanh", ["gc"], ["c_hat"]),
        oh.make_node("Mul", ["f", "c_in"], ["fc"]),
        oh.make_node("Mul", ["i", "c_hat"], ["ic"]),
        oh.make_node("Add", ["fc", "ic"], ["c_out"]),
        oh.make_node("Tanh", ["c_out"], ["tc"]),
        oh.make_node("Mul", ["o", "tc"], ["h_out"]),
        oh.make_node("Identity", ["h_out"], ["y_t"]),
    ]
    body = oh.make_graph(
        nodes,
        "cell",
        [
            oh.make_tensor_value_info("h_in", TP.FLOAT, [Bt, H]),
            oh.make_tensor_value_info("c_in", TP.FLOAT, [Bt, H]),
            oh.make_tensor_value_info("x_t", TP.FLOAT, [Bt, I]),
        ],
        [oh.make_tensor_value_info(n, TP.FLOAT, [Bt, H]) for n in ("h_out", "c_out", "y_t")],
        initializer=[w, r],
    )
    scan = oh.make_node("Scan", ["h0", "c0", "x"], ["hT", "cT", "ys"], num_scan_inputs=1, body=body, name="lstm_scan")
    graph = oh.make_graph(
        [scan],
        "g",
        [
            oh.make_tensor_value_info("h0", TP.FLOAT, [Bt, H]),
            oh.make_tensor_value_info("c0", TP.FLOAT, [Bt, H]),
            oh.make_tensor_value_info("x", TP.FLOAT, [T, Bt, I]),
        ],
        [oh.make_tensor_value_info("ys", TP.FLOAT, [T, Bt, H])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    model.ir_version = 9
    fused, report = rewrite_model(model)
    # declined as a Scan, then unrolled: the copies are an unrolled LSTM cell, which the unrolled-
    # cell pass fuses into one LSTMSeq (the step compiler then runs it as a loop in its kernel)
    declined, unrolled = report.declined[:2]
    assert declined.where == "lstm_scan" and "LSTM/GRU-like" in declined.reason
    assert unrolled.where == "lstm_scan" and "unrolled into" in unrolled.reason
    assert fused_types(fused) == ["LSTMSeq"]
    assert report.remaining_total == 0, report.remaining_per_timestep_ops
    parity = compare(model, fused, tolerance=TOL)
    assert parity.passed, parity.summary()


def test_every_pass_is_driven_by_one_of_two_drivers_with_one_decline_type():
    """Issue 22: the graph passes are AnchoredPass subclasses (anchors + one rewrite, one loop in
    rewrite/base.py), the unrolled-recurrence family UnrolledPass (chains of copies over several
    rounds); both report a raised Decline as a Declined row."""
    from framefuse.rewrite.base import AnchoredPass
    from framefuse.rewrite.pipeline import default_passes
    from framefuse.rewrite.unrolled.common import UnrolledPass

    passes = default_passes()
    assert all(isinstance(p, (AnchoredPass, UnrolledPass)) for p in passes), [type(p).__name__ for p in passes]
    anchored = [p.name for p in passes if isinstance(p, AnchoredPass)]
    assert anchored == [
        "rnn_nodes",
        "onnx_attention",
        "attention",
        "loops",
        "unroll-loops",
        "log-space-scan",
        "chunked-ssd",
        "chunked-delta-rule",
        "chunked-gla",
        "unrolled-output-stacking",
        "unrolled-chunked-scan",
    ]
    # the ordered lists hold classes: each rewrite runs instances of its own (a pass keeps state
    # while it runs, output stacking for one), so two rewrites at once share none
    assert not {id(p) for p in passes} & {id(p) for p in default_passes()}


def test_the_anchored_pass_driver_reports_matches_declines_and_skips():
    """A toy pass over three Relu nodes: one rewritten (its Match reported), one declined (the
    reason with the pass's prefix, named by the node), one not a candidate (nothing reported);
    an anchor the rewrite before it removed is never tried."""
    import onnx_graphsurgeon as gs

    from framefuse.rewrite.base import AnchoredPass, Decline, Match, NotACandidate, RewriteContext

    x = gs.Variable("x", dtype=np.float32, shape=[2])
    values = [x]
    for name in ("fuse", "decline", "skip", "removed"):
        out = gs.Variable(f"{name}_out", dtype=np.float32, shape=[2])
        values.append(out)
    nodes = [
        gs.Node("Relu", name, inputs=[a], outputs=[b])
        for name, a, b in zip(("fuse", "decline", "skip", "removed"), values, values[1:])
    ]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[values[-1]])
    tried = []

    class Toy(AnchoredPass):
        name = "toy"
        reason_prefix = "toy pattern: "

        def anchors(self, graph):
            for node in list(graph.nodes):
                if node.op == "Relu" and node in graph.nodes:
                    yield node

        def rewrite(self, graph, ctx, node):
            tried.append(node.name)
            if node.name == "fuse":
                graph.nodes.remove(nodes[3])  # this rewrite takes the last node with it
                return Match(self.name, "ToyOp", "toy_0", [node.name])
            if node.name == "decline":
                raise Decline("the toy cannot")
            raise NotACandidate

    result = Toy().run(graph, RewriteContext())
    assert tried == ["fuse", "decline", "skip"]
    assert [m.removed for m in result.matches] == [["fuse"]]
    assert [(d.pass_name, d.where, d.reason) for d in result.declined] == [
        ("toy", "decline", "toy pattern: the toy cannot")
    ]
