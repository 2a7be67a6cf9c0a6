"""The WKVScan and GatedDeltaRuleScan rewrite passes on graphs exported from models written the way
their authors write them: plain torch loops, transformers' RWKV model (small random config, no
download) and transformers' Qwen3-Next `torch_recurrent_gated_delta_rule`. Each fused graph is
checked against the original in ONNX Runtime (the framefuse ops running their references)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from torch import nn

from framefuse.parity import ort_session
from framefuse.rewrite.pipeline import rewrite_model
from framefuse.rewrite.unrolled import PASSES, remaining_recurrence_ops

F = 8


def export(module: nn.Module, args: tuple, input_names, output_names) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=list(input_names),
            output_names=list(output_names),
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, 10)
    return model


def framefuse_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.domain == "framefuse"]


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if inp.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[inp.name] = rng.integers(0, 50, shape).astype(np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def assert_parity(model, fused, atol=1e-5):
    feeds = feeds_for(model)
    expected = ort_session(model, fused=True).run(None, feeds)
    actual = ort_session(fused, fused=True).run(None, feeds)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=atol)


def fuse(model, op_type, count=1):
    fused, report = rewrite_model(model, passes=PASSES)
    assert framefuse_ops(fused) == [op_type] * count, (report.declined, framefuse_ops(fused))
    return fused, report


# --- WKV ---------------------------------------------------------------------------------------


class WKVLoop(nn.Module):
    """RWKV-4 time mixing written as transformers' CPU path, with outputs stacked; the state
    (num, den, max) is given and returned when ``with_state``."""

    def __init__(self, C=6):
        super().__init__()
        self.key, self.value, self.receptance = nn.Linear(F, C), nn.Linear(F, C), nn.Linear(F, C)
        self.time_decay = nn.Parameter(torch.randn(C))
        self.time_first = nn.Parameter(torch.randn(C))

    def forward(self, x, num=None, den=None, mx=None):
        k, v = self.key(x), self.value(x)
        if num is None:
            num = torch.zeros_like(k[:, 0])
            den = torch.zeros_like(k[:, 0])
            mx = torch.zeros_like(k[:, 0]) - 1e38
        w, u = -torch.exp(self.time_decay), self.time_first
        outs = []
        for t in range(x.shape[1]):
            k_t, v_t = k[:, t], v[:, t]
            q = torch.maximum(mx, k_t + u)
            e1, e2 = torch.exp(mx - q), torch.exp(k_t + u - q)
            outs.append((e1 * num + e2 * v_t) / (e1 * den + e2))
            p = torch.maximum(mx + w, k_t)
            e1, e2 = torch.exp(mx + w - p), torch.exp(k_t - p)
            num, den, mx = e1 * num + e2 * v_t, e1 * den + e2, p
        return torch.sigmoid(self.receptance(x)) * torch.stack(outs, 1), num, den, mx


@pytest.mark.parametrize("B", [1, 2])
def test_wkv_loop_fuses_and_node_count_does_not_grow_with_T(B):
    counts = []
    for T in (5, 9):
        torch.manual_seed(0)
        model = export(WKVLoop(), (torch.randn(B, T, F),), ["x"], ["y", "num", "den", "max"])
        fused, report = fuse(model, "WKVScan")
        assert remaining_recurrence_ops(gs.import_onnx(fused)) == 0
        assert report.remaining_per_timestep_ops.get("unrolled", 0) == 0
        assert not [n for n in fused.graph.node if n.op_type in ("Max", "Exp", "Div")]
        assert_parity(model, fused)
        counts.append(len(fused.graph.node))
    assert counts[0] == counts[1]


@pytest.mark.parametrize("T", [1, 6])
def test_wkv_with_state_inputs_and_outputs(T):
    torch.manual_seed(1)
    B, C = 2, 6
    model = export(
        WKVLoop(C),
        (torch.randn(B, T, F), torch.randn(B, C), torch.rand(B, C) + 0.5, torch.randn(B, C)),
        ["x", "state.num", "state.den", "state.max"],
        ["y", "next_state.num", "next_state.den", "next_state.max"],
    )
    fused, _ = fuse(model, "WKVScan")
    node = next(n for n in fused.graph.node if n.op_type == "WKVScan")
    assert list(node.input[4:]) == ["state.num", "state.den", "state.max"]
    assert_parity(model, fused)


def test_wkv_with_intermediate_state_read_elsewhere_is_declined():
    class Leaky(WKVLoop):
        def forward(self, x):
            k, v = self.key(x), self.value(x)
            num = torch.zeros_like(k[:, 0])
            den = torch.zeros_like(k[:, 0])
            mx = torch.zeros_like(k[:, 0]) - 1e38
            w, u = -torch.exp(self.time_decay), self.time_first
            outs, maxes = [], []
            for t in range(x.shape[1]):
                k_t, v_t = k[:, t], v[:, t]
                q = torch.maximum(mx, k_t + u)
                e1, e2 = torch.exp(mx - q), torch.exp(k_t + u - q)
                outs.append((e1 * num + e2 * v_t) / (e1 * den + e2))
                p = torch.maximum(mx + w, k_t)
                e1, e2 = torch.exp(mx + w - p), torch.exp(k_t - p)
                num, den, mx = e1 * num + e2 * v_t, e1 * den + e2, p
                maxes.append(mx * 2.0)
            return torch.stack(outs, 1), torch.stack(maxes, 1)

    torch.manual_seed(2)
    model = export(Leaky(), (torch.randn(2, 4, F),), ["x"], ["y", "maxes"])
    fused, report = rewrite_model(model, passes=PASSES)
    assert "WKVScan" not in framefuse_ops(fused)
    reasons = [d.reason for d in report.declined if d.pass_name == "unrolled-wkv-scan"]
    assert any("intermediate state" in r and "also read by Mul" in r for r in reasons), report.declined
    assert_parity(model, fused)


def test_transformers_rwkv_model_fuses_every_wkv_recurrence():
    transformers = pytest.importorskip("transformers")

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            config = transformers.RwkvConfig(
                vocab_size=50,
                hidden_size=64,
                num_hidden_layers=2,
                attention_hidden_size=64,
                intermediate_size=128,
                context_length=64,
            )
            self.model = transformers.RwkvModel(config).eval()

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).last_hidden_state

    model = export(Wrap(), (torch.randint(0, 50, (1, 16)),), ["ids"], ["hidden"])
    fused, report = fuse(model, "WKVScan", count=2)
    # The recurrence's exponentials, running maxes and divisions are all inside the two ops.
    assert not [n for n in fused.graph.node if n.op_type in ("Max", "Exp", "Div")]
    assert all(m.detail["steps"] == 16 for m in report.matches if m.op_type == "WKVScan")
    assert_parity(model, fused, atol=1e-4)


def test_transformers_rwkv_step_form_with_state_fuses():
    """The game-loop call: one token, the model's state given and returned (use_cache)."""
    transformers = pytest.importorskip("transformers")

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            config = transformers.RwkvConfig(
                vocab_size=50,
                hidden_size=64,
                num_hidden_layers=2,
                attention_hidden_size=64,
                intermediate_size=128,
                context_length=64,
            )
            self.model = transformers.RwkvModel(config).eval()

        def forward(self, ids, *state):
            out = self.model(input_ids=ids, state=[s.clone() for s in state], use_cache=True)
            return (out.last_hidden_state, *out.state)

    state = [torch.randn(1, 64, 2) for _ in range(5)]
    model = export(
        Step(),
        (torch.randint(0, 50, (1, 1)), *state),
        ["ids"] + [f"state.s{i}" for i in range(5)],
        ["hidden"] + [f"next_state.s{i}" for i in range(5)],
    )
    fused, report = fuse(model, "WKVScan", count=2)
    assert not [n for n in fused.graph.node if n.op_type in ("Max", "Exp", "Div")]
    assert remaining_recurrence_ops(gs.import_onnx(fused)) == 0
    feeds = feeds_for(model)
    feeds["state.s3"] = np.abs(feeds["state.s3"]) + 0.5  # a denominator state is positive
    expected = ort_session(model, fused=True).run(None, feeds)
    actual = ort_session(fused, fused=True).run(None, feeds)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


# --- gated delta rule --------------------------------------------------------------------------


class GatedDeltaLoop(nn.Module):
    """Gated DeltaNet written as transformers' recurrent form, read-outs stacked, state in and out."""

    def __init__(self, H=2, dk=4, dv=3, sum_axis=-2):
        super().__init__()
        self.H, self.dk, self.dv, self.sum_axis = H, dk, dv, sum_axis
        self.q, self.k, self.v = nn.Linear(F, H * dk), nn.Linear(F, H * dk), nn.Linear(F, H * dv)
        self.a, self.b = nn.Linear(F, H), nn.Linear(F, H)

    def forward(self, x, S):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.H, self.dk).transpose(1, 2)
        k = nn.functional.normalize(self.k(x).view(B, T, self.H, self.dk), dim=-1).transpose(1, 2)
        v = self.v(x).view(B, T, self.H, self.dv).transpose(1, 2)
        g = -nn.functional.softplus(self.a(x)).transpose(1, 2)
        beta = torch.sigmoid(self.b(x)).transpose(1, 2)
        outs = []
        for t in range(T):
            S = S * torch.exp(g[:, :, t])[..., None, None]
            kv_mem = (S * k[:, :, t].unsqueeze(-1)).sum(dim=self.sum_axis)
            delta = (v[:, :, t] - kv_mem) * beta[:, :, t].unsqueeze(-1)
            S = S + k[:, :, t].unsqueeze(-1) * delta.unsqueeze(-2)
            outs.append((S * q[:, :, t].unsqueeze(-1)).sum(dim=-2))
        return torch.stack(outs, dim=2), S


@pytest.mark.parametrize("B", [1, 2])
def test_gated_delta_loop_fuses_and_node_count_does_not_grow_with_T(B):
    counts = []
    for T in (5, 9):
        torch.manual_seed(3)
        model = export(
            GatedDeltaLoop(), (torch.randn(B, T, F), torch.randn(B, 2, 4, 3)), ["x", "state.S"], ["o", "next_state.S"]
        )
        fused, report = fuse(model, "GatedDeltaRuleScan")
        assert remaining_recurrence_ops(gs.import_onnx(fused)) == 0
        assert report.remaining_per_timestep_ops.get("unrolled", 0) == 0
        node = next(n for n in fused.graph.node if n.op_type == "GatedDeltaRuleScan")
        assert node.input[5] == "state.S"
        assert_parity(model, fused)
        counts.append(len(fused.graph.node))
    assert counts[0] == counts[1]


class GatedDeltaFLA(nn.Module):
    """flash-linear-attention's naive recurrent form: the read-out is an einsum, g and β come as
    [B, T, H] and are transposed with q, k, v; the state starts at zeros."""

    def __init__(self, H=2, dk=4, dv=3):
        super().__init__()
        self.H, self.dk, self.dv = H, dk, dv
        self.q, self.k, self.v = nn.Linear(F, H * dk), nn.Linear(F, H * dk), nn.Linear(F, H * dv)
        self.a, self.b = nn.Linear(F, H), nn.Linear(F, H)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.H, self.dk) * self.dk**-0.5
        k = nn.functional.normalize(self.k(x).view(B, T, self.H, self.dk), dim=-1)
        v = self.v(x).view(B, T, self.H, self.dv)
        g, beta = nn.functional.logsigmoid(self.a(x)), torch.sigmoid(self.b(x))
        q, k, v, beta, g = (t.transpose(1, 2).contiguous().to(torch.float32) for t in (q, k, v, beta, g))
        h = torch.zeros(B, self.H, self.dk, self.dv)
        outs = []
        for i in range(T):
            h = h * g[:, :, i].exp()[..., None, None]
            b_v = v[:, :, i] - (h * k[:, :, i][..., None]).sum(-2)
            b_v = b_v * beta[:, :, i][..., None]
            h = h + k[:, :, i].unsqueeze(-1) * b_v.unsqueeze(-2)
            outs.append(torch.einsum("bhd,bhdm->bhm", q[:, :, i], h))
        return torch.stack(outs, dim=2), h


def test_gated_delta_fla_naive_form_with_einsum_readout():
    counts = []
    for T in (4, 7):
        torch.manual_seed(8)
        model = export(GatedDeltaFLA(), (torch.randn(1, T, F),), ["x"], ["o", "S"])
        fused, report = fuse(model, "GatedDeltaRuleScan")
        assert report.remaining_per_timestep_ops.get("unrolled", 0) == 0
        assert not [n for n in fused.graph.node if n.op_type in ("Einsum", "Exp")]
        assert_parity(model, fused)
        counts.append(len(fused.graph.node))
    assert counts[0] == counts[1]


def test_gated_delta_step_form():
    torch.manual_seed(4)
    model = export(
        GatedDeltaLoop(), (torch.randn(1, 1, F), torch.randn(1, 2, 4, 3)), ["x", "state.S"], ["o", "next_state.S"]
    )
    fused, _ = fuse(model, "GatedDeltaRuleScan")
    assert_parity(model, fused)


def test_gated_delta_summed_over_the_wrong_axis_is_declined():
    torch.manual_seed(5)
    # Σ over Dv instead of Dk: shapes only work when Dk = Dv, and it is not the gated delta rule.
    model = export(
        GatedDeltaLoop(dk=3, dv=3, sum_axis=-1),
        (torch.randn(2, 4, F), torch.randn(2, 2, 3, 3)),
        ["x", "state.S"],
        ["o", "next_state.S"],
    )
    fused, report = rewrite_model(model, passes=PASSES)
    assert "GatedDeltaRuleScan" not in framefuse_ops(fused)
    reasons = [d.reason for d in report.declined if d.pass_name == "unrolled-gated-delta-rule-scan"]
    assert any("key axis" in r for r in reasons), report.declined
    assert_parity(model, fused)


def test_transformers_qwen3_next_recurrent_gated_delta_rule_fuses():
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

    class Layer(nn.Module):
        def __init__(self, H=2, dk=8, dv=4):
            super().__init__()
            self.H, self.dk, self.dv = H, dk, dv
            self.q, self.k, self.v = nn.Linear(F, H * dk), nn.Linear(F, H * dk), nn.Linear(F, H * dv)
            self.a, self.b = nn.Linear(F, H), nn.Linear(F, H)
            self.A_log = nn.Parameter(torch.randn(H) * 0.5)

        def forward(self, x):
            B, T, _ = x.shape
            q = self.q(x).view(B, T, self.H, self.dk)
            k = self.k(x).view(B, T, self.H, self.dk)
            v = self.v(x).view(B, T, self.H, self.dv)
            g = -self.A_log.exp() * nn.functional.softplus(self.a(x))
            beta = torch.sigmoid(self.b(x))
            return qwen.torch_recurrent_gated_delta_rule(
                q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True
            )

    torch.manual_seed(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = export(Layer(), (torch.randn(1, 6, F),), ["x"], ["o", "S"])
    fused, report = fuse(model, "GatedDeltaRuleScan")
    # The per-step decay and the Σ over the key axis are all inside the op; what ReduceSums are left
    # (keepdims) are the L2 norms of q and k, computed once for the whole sequence.
    assert not [n for n in fused.graph.node if n.op_type == "Exp"]
    sums = [n for n in fused.graph.node if n.op_type == "ReduceSum"]
    assert len(sums) == 2 and all(a.i == 1 for n in sums for a in n.attribute if a.name == "keepdims")
    assert_parity(model, fused)


# --- the engine runs the fused graphs ----------------------------------------------------------


@pytest.mark.parametrize("which", ["wkv", "gated_delta"])
def test_cpu_executor_runs_fused_graph_like_torch(which):
    from framefuse.engines.executor import GraphExecutor

    torch.manual_seed(7)
    if which == "wkv":
        module, args, names, outs, op_type = (
            WKVLoop(),
            (torch.randn(2, 7, F),),
            ["x"],
            ["y", "num", "den", "max"],
            "WKVScan",
        )
    else:
        module, args = GatedDeltaLoop(), (torch.randn(2, 7, F), torch.randn(2, 2, 4, 3))
        names, outs, op_type = ["x", "state.S"], ["o", "next_state.S"], "GatedDeltaRuleScan"
    fused, _ = fuse(export(module, args, names, outs), op_type)
    executor = GraphExecutor(fused, device="cpu")
    result = executor.plan({n: tuple(a.shape) for n, a in zip(names, args)}).execute(dict(zip(names, args)))
    with torch.no_grad():
        expected = module(*args)
    for name, e in zip(outs, expected):
        torch.testing.assert_close(result[name], e, rtol=1e-4, atol=1e-5)
