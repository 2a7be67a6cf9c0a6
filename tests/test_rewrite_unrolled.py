"""Unrolled recurrences (Python loops over a static T, exported with the TorchScript exporter) are
rewritten into one framefuse node each, with no per-timestep ops left, and the fused graph
computes what the original does (ONNX Runtime, framefuse nodes through their references)."""

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

B, F, D = 2, 4, 3


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


def rewrite(model: onnx.ModelProto):
    return rewrite_model(model, passes=PASSES)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model, fused=True).run(None, feeds)


def ops(model: onnx.ModelProto, domain: str | None = None) -> list[str]:
    return [n.op_type for n in model.graph.node if domain is None or n.domain == domain]


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def check_fused(model: onnx.ModelProto, op_type: str, count: int = 1, atol: float = 1e-4):
    """Rewrite ``model``; exactly ``count`` ``op_type`` nodes, nothing per-step left, same outputs."""
    fused, report = rewrite(model)
    assert ops(fused, "framefuse") == [op_type] * count, (report.declined, ops(fused))
    assert remaining_recurrence_ops(gs.import_onnx(fused)) == 0
    assert report.remaining_per_timestep_ops.get("unrolled", 0) == 0
    feeds = feeds_for(model)
    expected = run(model, feeds)
    actual = run(fused, feeds)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=atol)
    return fused, report


# --- models written the way authors write them -------------------------------------------------


class MinGRULoop(nn.Module):
    """Projections for all t, recurrence in a loop, zeros initial state, stacked outputs."""

    def __init__(self, state_input: bool = False):
        super().__init__()
        self.lz, self.lh, self.out = nn.Linear(F, D), nn.Linear(F, D), nn.Linear(D, F)
        self.state_input = state_input

    def forward(self, x, h=None):
        z = torch.sigmoid(self.lz(x))
        h_tilde = self.lh(x)
        h = x.new_zeros(x.shape[0], D) if h is None else h
        hs = []
        for t in range(x.shape[1]):
            h = (1 - z[:, t]) * h + z[:, t] * h_tilde[:, t]
            hs.append(h)
        y = self.out(torch.stack(hs, dim=1))
        return (y, h) if self.state_input else y


class MinGRUPerStepLinear(nn.Module):
    """Projections inside the loop (Gemm per step on x[:, t]), lerp update h + z (h̃ − h)."""

    def __init__(self):
        super().__init__()
        self.lz, self.lh = nn.Linear(F, D), nn.Linear(F, D)

    def forward(self, x):
        h = torch.zeros(x.shape[0], D)
        outs = []
        for t in range(x.shape[1]):
            x_t = x[:, t]
            z = torch.sigmoid(self.lz(x_t))
            h = h + z * (self.lh(x_t) - h)
            outs.append(h.unsqueeze(1))
        return torch.cat(outs, dim=1)


class MinLSTMLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.lf, self.li, self.lh = nn.Linear(F, D), nn.Linear(F, D), nn.Linear(F, D)

    def forward(self, x):
        f, i = torch.sigmoid(self.lf(x)), torch.sigmoid(self.li(x))
        f, i = f / (f + i), i / (f + i)
        h_tilde = self.lh(x)
        h = torch.zeros(x.shape[0], D)
        hs = []
        for t in range(x.shape[1]):
            h = f[:, t] * h + i[:, t] * h_tilde[:, t]
            hs.append(h)
        return torch.stack(hs, dim=1)


class GatedSSMLoop(nn.Module):
    """Multi-head state [B, H, P] with a per-head decay: a = exp(-softplus(w x)) broadcast over P."""

    def __init__(self, heads: int = 2, width: int = 3):
        super().__init__()
        self.heads, self.width = heads, width
        self.decay = nn.Linear(F, heads)
        self.inp = nn.Linear(F, heads * width)

    def forward(self, x):
        Bsz, T, _ = x.shape
        a = torch.exp(-nn.functional.softplus(self.decay(x)))  # [B, T, H]
        u = self.inp(x).view(Bsz, T, self.heads, self.width)
        h = torch.zeros(Bsz, self.heads, self.width)
        ys = []
        for t in range(T):
            h = a[:, t].unsqueeze(-1) * h + (1 - a[:, t]).unsqueeze(-1) * u[:, t]
            ys.append(h.sum(-1))
        return torch.stack(ys, dim=1)


class StepCell(nn.Module):
    """Step form: one frame and the state in, output and new state out."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lz, self.lh, self.out = nn.Linear(F, D), nn.Linear(F, D), nn.Linear(D, F)

    def forward(self, x, h):
        z = torch.sigmoid(self.lz(x))
        if self.kind == "min_gru":
            h = (1 - z) * h + z * self.lh(x)
        elif self.kind == "lerp":
            h = h + z * (self.lh(x) - h)
        elif self.kind == "decay_only":
            h = z * h
        return self.out(h), h


class TanhRNN(nn.Module):
    """h_t = tanh(W h_{t-1}) + x_t: not linear in h."""

    def __init__(self):
        super().__init__()
        self.w = nn.Linear(F, F, bias=False)

    def forward(self, x):
        h = torch.zeros(x.shape[0], F)
        hs = []
        for t in range(x.shape[1]):
            h = torch.tanh(self.w(h)) + x[:, t]
            hs.append(h)
        return torch.stack(hs, dim=1)


class SquareRNN(nn.Module):
    """h_t = h_{t-1}² ⊙ a_t + x_t: quadratic in h."""

    def forward(self, x):
        a = torch.sigmoid(x)
        h = torch.ones(x.shape[0], x.shape[2])
        hs = []
        for t in range(x.shape[1]):
            h = h * h * a[:, t] + x[:, t]
            hs.append(h)
        return torch.stack(hs, dim=1)


def seq_input(T: int = 5):
    return torch.randn(B, T, F)


# --- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [MinGRULoop, MinGRUPerStepLinear, MinLSTMLoop, GatedSSMLoop],
    ids=["min_gru", "min_gru_per_step_linear", "min_lstm", "gated_ssm"],
)
def test_sequence_form_fuses_into_one_linear_scan(module):
    torch.manual_seed(0)
    model = export(module(), (seq_input(),), ["x"], ["y"])
    fused, report = check_fused(model, "LinearScan")
    assert report.matches[0].detail["steps"] == 5
    assert not report.declined


def test_no_op_count_grows_with_T():
    """No per-timestep ops are left: the recurrence fuses into one LinearScan at every T, the fused
    graph is the same size for any T while the export grows with T, and it computes what the
    export does."""
    torch.manual_seed(0)
    sizes, exported = set(), []
    for T in (3, 6):
        model = export(MinGRUPerStepLinear(), (seq_input(T),), ["x"], ["y"])
        fused, report = check_fused(model, "LinearScan")
        assert report.matches[0].detail["steps"] == T
        sizes.add(len(fused.graph.node))
        exported.append(len(model.graph.node))
    assert len(sizes) == 1
    assert exported[1] > exported[0]  # the unrolled export does grow: there was something to fuse


def test_sequence_form_with_state_input_and_output():
    torch.manual_seed(0)
    model = export(
        MinGRULoop(state_input=True), (seq_input(), torch.randn(B, D)), ["x", "state.h"], ["y", "next_state.h"]
    )
    fused, report = check_fused(model, "LinearScan")
    scan = [n for n in fused.graph.node if n.op_type == "LinearScan"][0]
    assert len(scan.input) == 3 and scan.input[2]  # h0 is the state input, not the zeros default


@pytest.mark.parametrize("kind", ["min_gru", "lerp", "decay_only"])
def test_step_form_fuses_into_one_linear_scan(kind):
    torch.manual_seed(0)
    model = export(StepCell(kind), (torch.randn(B, F), torch.randn(B, D)), ["x", "state.h"], ["y", "next_state.h"])
    fused, report = check_fused(model, "LinearScan")
    assert report.matches[0].detail == {"steps": 1, "state_shape": [B, D], "form": "step"}


def test_nonlinear_recurrence_is_declined_with_reason():
    torch.manual_seed(0)
    model = export(TanhRNN(), (seq_input(),), ["x"], ["y"])
    fused, report = rewrite(model)
    assert not ops(fused, "framefuse")
    reasons = [d.reason for d in report.declined]
    assert any("through Tanh" in r and "not affine" in r for r in reasons), reasons
    assert remaining_recurrence_ops(gs.import_onnx(fused)) > 0


def test_quadratic_recurrence_is_declined_with_reason():
    model = export(SquareRNN(), (seq_input(),), ["x"], ["y"])
    fused, report = rewrite(model)
    assert not ops(fused, "framefuse")
    reasons = [d.reason for d in report.declined]
    assert any("product of two terms" in r and "not affine" in r for r in reasons), reasons
    assert remaining_recurrence_ops(gs.import_onnx(fused)) > 0


# --- the zoo, exported by the exporter (both forms, small configs) ------------------------------

ZOO_OPS = {
    "min_gru": "LinearScan",
    "min_lstm": "LinearScan",
    "gated_ssm": "LinearScan",
    "mamba": "SelectiveScan",
    "jamba": "SelectiveScan",  # its Mamba layer (the attention layer's KV cache is not a recurrence)
    "liquid": "LiquidScan",
    "delta_net": "DeltaRuleScan",
    "xlstm": "MLSTMScan",
}


def zoo_export(arch: str, form: str, seq: int = 5) -> onnx.ModelProto:
    from framefuse.exporter.export import prepare_export, resolve_config, resolve_model

    model_cfg = {"embed": 16, "layers": 2}
    if arch in ("mamba", "jamba"):
        model_cfg["d_state"] = 4
    cfg = resolve_config(
        {"arch": arch, "model": model_cfg, "batch": 1, "seq": seq, "in_features": 8, "out_features": 4}, arch
    )
    model, label = resolve_model(arch, cfg)
    return onnx.load_from_string(prepare_export(model, form=form, config=cfg, arch=label).onnx_bytes)


@pytest.mark.parametrize("form", ["sequence", "step"])
@pytest.mark.parametrize("arch", sorted(ZOO_OPS))
def test_zoo_model_is_fully_fused(arch, form):
    model = zoo_export(arch, form)
    assert remaining_recurrence_ops(gs.import_onnx(model)) > 0  # there is a recurrence to fuse
    fused, report = rewrite(model)
    op_types = ops(fused, "framefuse")
    assert op_types and set(op_types) == {ZOO_OPS[arch]}, (op_types, report.declined)
    assert remaining_recurrence_ops(gs.import_onnx(fused)) == 0
    assert report.remaining_per_timestep_ops.get("unrolled", 0) == 0
    feeds = feeds_for(model, seed=1)
    expected = ort_session(model, fused=False).run(None, feeds)
    actual = run(fused, feeds)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


# --- the non-linear recurrences, written differently from the zoo ---------------------------------


class CfCVariant(nn.Module):
    """CfC with cat([h, x_t]) (state first), timespan 0.5, and optionally ReLU instead of tanh."""

    def __init__(self, act=torch.tanh):
        super().__init__()
        self.act = act
        self.heads = nn.ModuleList(nn.Linear(D + F, D) for _ in range(4))

    def forward(self, x):
        h = torch.zeros(x.shape[0], D)
        hs = []
        for t in range(x.shape[1]):
            xh = torch.cat([h, x[:, t]], dim=1)
            ff1, ff2 = self.act(self.heads[0](xh)), self.act(self.heads[1](xh))
            tau = torch.sigmoid(self.heads[2](xh) * 0.5 + self.heads[3](xh))
            h = ff1 * (1.0 - tau) + tau * ff2
            hs.append(h)
        return torch.stack(hs, dim=1)


class DeltaVariant(nn.Module):
    """S + β (v − S k) kᵀ with the outer product as a MatMul, S0 a state input."""

    def __init__(self, heads=2, dk=3, dv=2):
        super().__init__()
        self.heads, self.dk, self.dv = heads, dk, dv
        self.q, self.k = nn.Linear(F, heads * dk), nn.Linear(F, heads * dk)
        self.v, self.b = nn.Linear(F, heads * dv), nn.Linear(F, heads)

    def forward(self, x, S):
        Bsz, T, _ = x.shape
        q = self.q(x).view(Bsz, T, self.heads, self.dk).transpose(1, 2)
        k = nn.functional.normalize(self.k(x).view(Bsz, T, self.heads, self.dk), dim=-1).transpose(1, 2)
        v = self.v(x).view(Bsz, T, self.heads, self.dv).transpose(1, 2)
        beta = torch.sigmoid(self.b(x)).transpose(1, 2)
        outs = []
        for t in range(T):
            k_t, v_t = k[:, :, t].unsqueeze(-1), v[:, :, t].unsqueeze(-1)
            S = S + torch.matmul(beta[:, :, t, None, None] * (v_t - torch.matmul(S, k_t)), k_t.transpose(-1, -2))
            outs.append(torch.matmul(S, q[:, :, t].unsqueeze(-1)).squeeze(-1))
        return torch.stack(outs, dim=2), S


class MLSTMVariant(nn.Module):
    """mLSTM with logσ written as −softplus(−f) and the gates projected inside the loop."""

    def __init__(self, heads=2, d=3, eps=None, eps_step=0.0):
        super().__init__()
        self.heads, self.d = heads, d
        # eps: added to the read-out's denominator as transformers' xLSTM does (None: not at all);
        # eps_step: grows it per step (a recurrence MLSTMScan's single eps cannot express).
        self.eps, self.eps_step = eps, eps_step
        self.qkv = nn.Linear(F, 3 * heads * d)
        self.gates = nn.Linear(F, 2 * heads)

    def forward(self, x):
        Bsz, T, _ = x.shape
        H, d = self.heads, self.d
        C, n, m = torch.zeros(Bsz, H, d, d), torch.zeros(Bsz, H, d), torch.zeros(Bsz, H)
        hs = []
        for t in range(T):
            q, k, v = self.qkv(x[:, t]).view(Bsz, 3, H, d).unbind(1)
            k = k / d**0.5
            i_pre, f_pre = self.gates(x[:, t]).view(Bsz, 2, H).unbind(1)
            log_f = -nn.functional.softplus(-f_pre)
            m_new = torch.maximum(log_f + m, i_pre)
            i_act, f_act = torch.exp(i_pre - m_new), torch.exp(log_f + m - m_new)
            C = f_act[..., None, None] * C + i_act[..., None, None] * (v.unsqueeze(-1) * k.unsqueeze(-2))
            n = f_act[..., None] * n + i_act[..., None] * k
            m = m_new
            num = torch.matmul(C, q.unsqueeze(-1)).squeeze(-1)
            den = torch.maximum((n * q).sum(-1).abs(), torch.exp(-m))
            if self.eps is not None:
                den = den + (self.eps + self.eps_step * t)
            hs.append(num / den.unsqueeze(-1))
        return torch.stack(hs, dim=2)


class TransformersMLSTM(nn.Module):
    """transformers' xLSTM mLSTM step (`mlstm_recurrent_step_native`, called as its sequence form
    does): m and the gates [B, H, 1], C = k⊗v [Dk, Dv] by MatMul, q scaled inside, read-outs as
    MatMuls, `.to(dtype_state)` Casts, ε = 1e-6. Dk ≠ Dv so a C left untransposed cannot pass."""

    def __init__(self, heads=2, dk=3, dv=5):
        super().__init__()
        self.heads, self.dk, self.dv = heads, dk, dv
        self.qk = nn.Linear(F, 2 * heads * dk)
        self.v = nn.Linear(F, heads * dv)
        self.gates = nn.Linear(F, 2 * heads)

    def forward(self, x, C, n, m):
        from transformers.models.xlstm.modeling_xlstm import mlstm_recurrent_step_native

        Bsz, T, _ = x.shape
        H = self.heads
        q, k = self.qk(x).view(Bsz, T, 2, H, self.dk).permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, T, Dk]
        v = self.v(x).view(Bsz, T, H, self.dv).transpose(1, 2)
        i_pre, f_pre = self.gates(x).view(Bsz, T, 2, H).permute(2, 0, 3, 1).unbind(0)  # [B, H, T]
        hs = []
        for t in range(T):
            h_t, (C, n, m) = mlstm_recurrent_step_native(
                q[:, :, t], k[:, :, t], v[:, :, t], i_pre[:, :, t, None], f_pre[:, :, t, None], C, n, m
            )
            hs.append(h_t)
        return torch.stack(hs, dim=2), C, n, m


def test_transformers_mlstm_layout_fuses_with_eps():
    """transformers' layout: C transposed into and out of the op, m reshaped, ε as the attribute;
    all outputs (h and the final C, n, m) match the unfused graph."""
    pytest.importorskip("transformers.models.xlstm.modeling_xlstm")
    torch.manual_seed(0)
    H, dk, dv = 2, 3, 5
    states = (torch.randn(B, H, dk, dv), torch.randn(B, H, dk), torch.randn(B, H, 1))
    model = export(TransformersMLSTM(H, dk, dv), (seq_input(), *states), ["x", "C0", "n0", "m0"], ["y", "C", "n", "m"])
    fused, report = check_fused(model, "MLSTMScan")
    (node,) = [n for n in fused.graph.node if n.op_type == "MLSTMScan"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"eps": np.float32(1e-6)}
    assert report.matches[0].detail["layout"] == "m [B, H, 1], C = k⊗v"
    assert report.matches[0].detail["state_shape"] == [B, H, dv, dk]


class MambaVariant(nn.Module):
    """S6 discretised inside the loop with broadcast Muls (no einsum for a_t, b_t)."""

    def __init__(self, d=3, n=2):
        super().__init__()
        self.d, self.n = d, n
        self.proj = nn.Linear(F, 2 * d + 2 * n)
        self.A_log = nn.Parameter(torch.randn(d, n))

    def forward(self, x):
        u, dt, B, C = torch.split(self.proj(x), [self.d, self.d, self.n, self.n], dim=-1)
        dt = nn.functional.softplus(dt)
        A = -torch.exp(self.A_log)
        h = torch.zeros(x.shape[0], self.d, self.n)
        ys = []
        for t in range(x.shape[1]):
            dA = torch.exp(dt[:, t].unsqueeze(-1) * A)
            dBu = (dt[:, t] * u[:, t]).unsqueeze(-1) * B[:, t].unsqueeze(1)
            h = dA * h + dBu
            ys.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
        return torch.stack(ys, dim=1)


def test_cfc_variant_fuses_into_liquid_scan():
    torch.manual_seed(0)
    fused, report = check_fused(export(CfCVariant(), (seq_input(),), ["x"], ["y"]), "LiquidScan")
    assert report.matches[0].detail["ts"] == 0.5


def test_cfc_with_another_activation_is_declined_with_reason():
    torch.manual_seed(0)
    fused, report = rewrite(export(CfCVariant(act=torch.relu), (seq_input(),), ["x"], ["y"]))
    assert not ops(fused, "framefuse")
    liquid = [d.reason for d in report.declined if d.pass_name == "unrolled-liquid-scan"]
    assert liquid and "not the CfC update" in liquid[0], report.declined


def test_delta_rule_variant_fuses_into_delta_rule_scan():
    torch.manual_seed(0)
    model = export(DeltaVariant(), (seq_input(), torch.randn(B, 2, 2, 3)), ["x", "state.S"], ["y", "next_state.S"])
    check_fused(model, "DeltaRuleScan")


def test_mlstm_variant_fuses_into_mlstm_scan():
    torch.manual_seed(0)
    check_fused(export(MLSTMVariant(), (seq_input(),), ["x"], ["y"]), "MLSTMScan")


def test_mlstm_with_eps_fuses_with_the_eps_attribute():
    """The read-out max(|n·q|, exp(−m)) + ε (transformers' xLSTM, ε = 1e-6) becomes the op's eps.
    ε = 0.25 here so that parity would fail if the attribute were lost (1e-6 is below tolerance)."""
    torch.manual_seed(0)
    fused, report = check_fused(export(MLSTMVariant(eps=0.25), (seq_input(),), ["x"], ["y"]), "MLSTMScan")
    (node,) = [n for n in fused.graph.node if n.op_type == "MLSTMScan"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"eps": 0.25}
    torch.manual_seed(0)
    plain, _ = check_fused(export(MLSTMVariant(), (seq_input(),), ["x"], ["y"]), "MLSTMScan")
    (node,) = [n for n in plain.graph.node if n.op_type == "MLSTMScan"]
    assert not node.attribute  # no ε in the model: the node stays as before the attribute existed


def test_mlstm_with_eps_varying_per_step_is_declined_with_reason():
    torch.manual_seed(0)
    fused, report = rewrite(export(MLSTMVariant(eps=0.25, eps_step=0.5), (seq_input(),), ["x"], ["y"]))
    assert "MLSTMScan" not in ops(fused, "framefuse")
    reasons = [d.reason for d in report.declined if d.pass_name == "unrolled-mlstm-scan"]
    assert reasons and "ε differs between steps" in reasons[0], report.declined


def test_mamba_variant_fuses_into_selective_scan():
    torch.manual_seed(0)
    check_fused(export(MambaVariant(), (seq_input(),), ["x"], ["y"]), "SelectiveScan")


@pytest.mark.parametrize("arch", ["liquid", "xlstm"])
def test_long_unrolled_loop_is_rewritten(arch):
    """32 unrolled steps of the cells with the most shared subexpressions per step (templates are
    DAGs: walking them as trees would take exponential time)."""
    model = zoo_export(arch, "sequence", seq=32)
    fused, report = rewrite(model)
    assert set(ops(fused, "framefuse")) == {ZOO_OPS[arch]}
    assert report.matches[0].detail["steps"] == 32
    feeds = feeds_for(model, seed=2)
    for e, a in zip(ort_session(model, fused=False).run(None, feeds), run(fused, feeds)):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


class RichPerStepGate(nn.Module):
    """Coefficients computed inside the loop through ops whose axes shift when lifted over time:
    Reshape, Transpose, Softmax, Gather, LayerNormalization, Slice, Concat, ReduceMean, MatMul."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, 2 * D)
        self.lin2 = nn.Linear(F, D)
        self.w = nn.Parameter(torch.randn(D, D))

    def forward(self, x):
        h = torch.zeros(x.shape[0], D)
        hs = []
        for t in range(x.shape[1]):
            x_t = x[:, t]
            u = self.lin(x_t).view(x.shape[0], 2, D).transpose(1, 2)
            g = torch.softmax(u, dim=-1)[..., 0]
            nrm = nn.functional.layer_norm(self.lin2(x_t), (D,)) @ self.w
            b = torch.cat([nrm[:, D // 2 :], nrm[:, : D // 2]], 1)
            a = g * torch.sigmoid(b.mean(-1, keepdim=True))
            h = a * h + b
            hs.append(h)
        return torch.stack(hs, dim=1)


def test_coefficients_through_axis_ops_are_lifted():
    torch.manual_seed(0)
    fused, _ = check_fused(export(RichPerStepGate(), (seq_input(),), ["x"], ["y"]), "LinearScan")
    lifted = ops(fused)
    for op_type in ("Softmax", "LayerNormalization", "ReduceMean", "Concat"):
        assert lifted.count(op_type) == 1, (op_type, lifted)  # one copy over all steps, not five


def test_bounded_dependency_walk_agrees_with_the_forward_closure():
    """The chain finder asks whether a tensor depends on h_(t-1) by walking back no further than
    h_(t-1)'s topological position (linear rewrite time in T and layers); the answer must be the
    forward closure's, for every pair of a recurrent state and a tensor of the unrolled graph."""
    from framefuse.rewrite.unrolled.chains import _DependsOn
    from framefuse.rewrite.unrolled.graphutil import descendants
    from framefuse.rewrite.unrolled.timeline import Timeline

    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            h1 = torch.zeros(1, 4)
            h2 = torch.zeros(1, 4)
            ys = []
            for t in range(x.shape[1]):
                h1 = torch.tanh(self.a(x[:, t]) + h1 * 0.5)
                h2 = torch.sigmoid(self.b(h1)) * h2 + h1
                ys.append(h2)
            return torch.stack(ys, 1)

    model = export(TwoLayers().eval(), (torch.randn(1, 6, 4),), ["x"], ["y"])
    graph = gs.import_onnx(model)
    tl = Timeline(graph)
    tensors = [t for t in graph.tensors().values() if t.name and not isinstance(t, gs.Constant)]
    holes = [t for t in tensors if t.inputs][:: max(1, len(tensors) // 25)]
    assert len(holes) >= 10
    for hole in holes:
        forward = descendants(hole)
        bounded = _DependsOn(hole, tl.order)
        for t in tensors:
            assert bounded.depends_on(t) == (t.name in forward), (hole.name, t.name)


# --- GRU cells stepped in a Python loop (issue 21) ------------------------------------------------


class GRUCellLoop(nn.Module):
    """nn.GRUCell over the frames, the initial state given (``h0``) or zeros; one or two layers."""

    def __init__(self, layers: int = 1, given_h0: bool = True):
        super().__init__()
        self.given_h0 = given_h0
        self.cells = nn.ModuleList(nn.GRUCell(F if i == 0 else D, D) for i in range(layers))

    def forward(self, x, h0=None):
        hs = [h0 if self.given_h0 else torch.zeros(x.shape[0], D) for _ in self.cells]
        ys = []
        for t in range(x.shape[1]):
            inp = x[:, t]
            for i, cell in enumerate(self.cells):
                hs[i] = cell(inp, hs[i])
                inp = hs[i]
            ys.append(inp)
        return torch.stack(ys, dim=1)


class HandGRU(nn.Module):
    """A GRU written out by hand, a Linear per gate and side, with the other update convention
    (h' = z ⊙ n + (1 − z) ⊙ h); ``reset_inside``: r applied before the recurrent product
    (ONNX linear_before_reset = 0, which GRUSeq does not implement); ``act``: the candidate's
    activation."""

    def __init__(self, reset_inside: bool = False, act=torch.tanh):
        super().__init__()
        self.reset_inside, self.act = reset_inside, act
        self.wx = nn.ModuleList(nn.Linear(F, D) for _ in range(3))
        self.wh = nn.ModuleList(nn.Linear(D, D) for _ in range(3))

    def forward(self, x):
        h = torch.zeros(x.shape[0], D)
        ys = []
        for t in range(x.shape[1]):
            xt = x[:, t]
            z = torch.sigmoid(self.wx[0](xt) + self.wh[0](h))
            r = torch.sigmoid(self.wx[1](xt) + self.wh[1](h))
            inner = self.wh[2](r * h) if self.reset_inside else r * self.wh[2](h)
            n = self.act(self.wx[2](xt) + inner)
            h = z * n + (1 - z) * h
            ys.append(h)
        return torch.stack(ys, dim=1)


@pytest.mark.parametrize("given_h0", [True, False], ids=["h0_input", "zeros"])
def test_gru_cell_loop_fuses_into_gru_seq(given_h0):
    torch.manual_seed(0)
    module = GRUCellLoop(given_h0=given_h0)
    args = (seq_input(6), torch.randn(B, D)) if given_h0 else (seq_input(6),)
    names = ["x", "h0"] if given_h0 else ["x"]
    fused, report = check_fused(export(module, args, names, ["y"]), "GRUSeq")
    (match,) = report.matches
    assert match.detail["convention"] == "z keeps h" and match.detail["check_max_abs_diff"] < 1e-6
    gru = [n for n in fused.graph.node if n.op_type == "GRUSeq"][0]
    assert len(gru.input) == (5 if given_h0 else 4)  # h0 an input only when it is not zeros


class BidirectionalGRUCells(nn.Module):
    """A bidirectional layer written with two nn.GRUCell loops, the backward one over the frames
    reversed (from a given h_0 or zeros), their outputs concatenated per frame."""

    def __init__(self, given_h0: bool = False):
        super().__init__()
        self.fwd, self.bwd = nn.GRUCell(F, D), nn.GRUCell(F, D)
        self.given_h0 = given_h0

    def forward(self, x, h0=None):
        outs = []
        for cell, order in ((self.fwd, range(x.shape[1])), (self.bwd, reversed(range(x.shape[1])))):
            h = h0 if self.given_h0 else torch.zeros(x.shape[0], D)
            ys = {}
            for t in order:
                h = cell(x[:, t], h)
                ys[t] = h
            outs.append(torch.stack([ys[t] for t in range(x.shape[1])], dim=1))
        return torch.cat(outs, dim=-1)


@pytest.mark.parametrize("given_h0", [False, True], ids=["zeros", "h0_input"])
def test_bidirectional_gru_cell_loops_fuse_into_two_gru_seqs(given_h0):
    """The backward loop is found in the reversed Timeline (every state of it depends on the last
    frame, so the forward search sees no chain) and runs GRUSeq over the frames reversed."""
    torch.manual_seed(0)
    args = (seq_input(5), torch.randn(B, D)) if given_h0 else (seq_input(5),)
    names = ["x", "h0"] if given_h0 else ["x"]
    fused, report = check_fused(export(BidirectionalGRUCells(given_h0), args, names, ["y"]), "GRUSeq", count=2)
    assert sorted(m.detail.get("direction", "forward") for m in report.matches) == ["forward", "reverse"]
    # the backward outputs, stacked in frame order, are the op's output reversed: no Gather a frame
    assert "Gather" not in ops(fused), ops(fused)


def test_a_backward_linear_recurrence_fuses_into_a_linear_scan():
    """h_t = a_t ⊙ h_(t+1) + b_t over the frames backwards (a suffix scan): LinearScan over the
    frames reversed, the per-frame outputs restacked in frame order."""

    class BackwardScan(nn.Module):
        def __init__(self):
            super().__init__()
            self.la, self.lb = nn.Linear(F, D), nn.Linear(F, D)

        def forward(self, x):
            a, b = torch.sigmoid(self.la(x)), self.lb(x)
            h = torch.zeros(x.shape[0], D)
            ys = {}
            for t in reversed(range(x.shape[1])):
                h = a[:, t] * h + b[:, t]
                ys[t] = h
            return torch.stack([ys[t] for t in range(x.shape[1])], dim=1)

    torch.manual_seed(0)
    model = export(BackwardScan(), (seq_input(6),), ["x"], ["y"])
    # the independent count of what is left sees a backward loop's steps too (the reversed Timeline)
    assert remaining_recurrence_ops(gs.import_onnx(model)) > 0
    fused, report = check_fused(model, "LinearScan")
    assert report.matches[0].detail["direction"] == "reverse"


def test_stacked_gru_cells_fuse_into_one_gru_seq_each():
    torch.manual_seed(0)
    check_fused(export(GRUCellLoop(layers=2, given_h0=False), (seq_input(5),), ["x"], ["y"]), "GRUSeq", count=2)


def test_gru_cell_step_form_fuses_with_its_state():
    """The step form (one frame, the state in and out by name) a game loop calls every frame."""

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.GRUCell(F, D)

        def forward(self, x, h):
            h = self.cell(x, h)
            return h * 2.0, h

    torch.manual_seed(0)
    model = export(Step(), (torch.randn(B, F), torch.randn(B, D)), ["x", "state.h"], ["y", "next_state.h"])
    check_fused(model, "GRUSeq")


def test_hand_written_gru_with_the_other_update_convention_fuses():
    torch.manual_seed(0)
    fused, report = check_fused(export(HandGRU(), (seq_input(6),), ["x"], ["y"]), "GRUSeq")
    assert report.matches[0].detail["convention"] == "z keeps n"


@pytest.mark.parametrize(
    "module", [HandGRU(reset_inside=True), HandGRU(act=torch.relu)], ids=["reset_before_product", "relu"]
)
def test_a_cell_that_is_not_gru_seq_is_declined_with_its_reason(module):
    """A GRU with the reset gate inside the recurrent product (linear_before_reset = 0) and a cell
    whose candidate is not a tanh are not the GRU GRUSeq computes: nothing fuses, and a decline
    names the chain and the reason (the GRU pass's own for the cell that has a tanh)."""
    torch.manual_seed(0)
    fused, report = rewrite(export(module, (seq_input(5),), ["x"], ["y"]))
    assert not ops(fused, "framefuse")
    assert report.declined
    gru = [d.reason for d in report.declined if d.pass_name == "unrolled-gru-cell"]
    if module.act is torch.tanh:
        assert gru and "not a GRU update" in gru[0], report.declined
    else:
        assert any("not affine" in d.reason for d in report.declined), report.declined


# --- LSTM cells stepped in a Python loop (issue 21) -----------------------------------------------


class LSTMCellLoop(nn.Module):
    """nn.LSTMCell over the frames from given (``h0``, ``c0``) or zero states; one or two layers;
    ``return_c``: the last cell state returned beside the outputs."""

    def __init__(self, layers: int = 1, given_state: bool = True, return_c: bool = False, bias: bool = True):
        super().__init__()
        self.given_state, self.return_c = given_state, return_c
        self.cells = nn.ModuleList(nn.LSTMCell(F if i == 0 else D, D, bias=bias) for i in range(layers))

    def forward(self, x, h0=None, c0=None):
        if self.given_state:
            hs, cs = [h0 for _ in self.cells], [c0 for _ in self.cells]
        else:
            hs = [torch.zeros(x.shape[0], D) for _ in self.cells]
            cs = [torch.zeros(x.shape[0], D) for _ in self.cells]
        ys = []
        for t in range(x.shape[1]):
            inp = x[:, t]
            for i, cell in enumerate(self.cells):
                hs[i], cs[i] = cell(inp, (hs[i], cs[i]))
                inp = hs[i]
            ys.append(inp)
        y = torch.stack(ys, dim=1)
        return (y, cs[-1]) if self.return_c else y


class HandLSTM(nn.Module):
    """An LSTM written out by hand, a Linear per gate and side (no fused 4H product, no Split);
    ``peephole``: the forget gate also reads c (not the LSTM LSTMSeq computes); ``act``: the
    output's activation of c."""

    def __init__(self, peephole: bool = False, act=torch.tanh):
        super().__init__()
        self.peephole, self.act = peephole, act
        self.wx = nn.ModuleList(nn.Linear(F, D) for _ in range(4))
        self.wh = nn.ModuleList(nn.Linear(D, D, bias=False) for _ in range(4))
        self.p = nn.Parameter(torch.randn(D))

    def forward(self, x):
        h = torch.zeros(x.shape[0], D)
        c = torch.zeros(x.shape[0], D)
        ys = []
        for t in range(x.shape[1]):
            xt = x[:, t]
            i = torch.sigmoid(self.wx[0](xt) + self.wh[0](h))
            f_pre = self.wx[1](xt) + self.wh[1](h)
            f = torch.sigmoid(f_pre + self.p * c if self.peephole else f_pre)
            g = torch.tanh(self.wx[2](xt) + self.wh[2](h))
            o = torch.sigmoid(self.wx[3](xt) + self.wh[3](h))
            c = f * c + i * g
            h = o * self.act(c)
            ys.append(h)
        return torch.stack(ys, dim=1)


@pytest.mark.parametrize("given_state", [True, False], ids=["state_inputs", "zeros"])
def test_lstm_cell_loop_fuses_into_lstm_seq(given_state):
    torch.manual_seed(0)
    module = LSTMCellLoop(given_state=given_state)
    args = (seq_input(6), torch.randn(B, D), torch.randn(B, D)) if given_state else (seq_input(6),)
    names = ["x", "h0", "c0"] if given_state else ["x"]
    fused, report = check_fused(export(module, args, names, ["y"]), "LSTMSeq")
    (match,) = report.matches
    assert match.detail["steps"] == 6 and match.detail["check_max_abs_diff"] < 1e-6
    assert match.detail["initial_state"] == ("given" if given_state else "zeros")
    lstm = [n for n in fused.graph.node if n.op_type == "LSTMSeq"][0]
    assert len(lstm.input) == (6 if given_state else 4)  # h0, c0 inputs only when not zeros


def test_stacked_lstm_cells_fuse_and_the_last_cell_state_is_the_ops():
    """Two layers, each its own LSTMSeq; the returned c_T is the second op's final cell state."""
    torch.manual_seed(0)
    module = LSTMCellLoop(layers=2, given_state=False, return_c=True)
    check_fused(export(module, (seq_input(5),), ["x"], ["y", "c"]), "LSTMSeq", count=2)


def test_lstm_cell_without_biases_fuses():
    torch.manual_seed(0)
    module = LSTMCellLoop(given_state=False, bias=False)
    check_fused(export(module, (seq_input(4),), ["x"], ["y"]), "LSTMSeq")


def test_hand_written_lstm_fuses():
    torch.manual_seed(0)
    check_fused(export(HandLSTM(), (seq_input(5),), ["x"], ["y"]), "LSTMSeq")


@pytest.mark.parametrize("module", [HandLSTM(peephole=True), HandLSTM(act=torch.sigmoid)], ids=["peephole", "sigmoid"])
def test_a_cell_that_is_not_lstm_seq_is_not_fused_as_one(module):
    """A peephole forget gate and an output gated through sigmoid(c) are not the LSTM LSTMSeq
    computes: no LSTMSeq appears, and the LSTM pass says why where it found the cells."""
    torch.manual_seed(0)
    model = export(module, (seq_input(5),), ["x"], ["y"])
    fused, report = rewrite(model)
    assert "LSTMSeq" not in ops(fused, "framefuse")
    lstm = [d.reason for d in report.declined if d.pass_name == "unrolled-lstm-cell"]
    if module.peephole:
        assert lstm and "not an LSTM update" in lstm[0] and lstm[0].startswith("step 4 ("), report.declined
    feeds = feeds_for(model)
    for e, a in zip(run(model, feeds), run(fused, feeds)):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


def test_lstm_cell_step_form_fuses_with_its_states():
    """The step form a game loop calls every frame: one frame, h and c in and out by name."""

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(F, D)

        def forward(self, x, h, c):
            h, c = self.cell(x, (h, c))
            return h * 2.0, h, c

    torch.manual_seed(0)
    args = (torch.randn(B, F), torch.randn(B, D), torch.randn(B, D))
    model = export(Step(), args, ["x", "state.h", "state.c"], ["y", "next_state.h", "next_state.c"])
    fused, report = check_fused(model, "LSTMSeq")
    assert report.matches[0].detail["form"] == "step"


class BidirectionalLSTMCells(nn.Module):
    """A bidirectional layer written with two nn.LSTMCell loops, the backward one over the frames
    reversed, their outputs concatenated per frame."""

    def __init__(self):
        super().__init__()
        self.fwd, self.bwd = nn.LSTMCell(F, D), nn.LSTMCell(F, D)

    def forward(self, x):
        outs = []
        for cell, order in ((self.fwd, range(x.shape[1])), (self.bwd, reversed(range(x.shape[1])))):
            h = torch.zeros(x.shape[0], D)
            c = torch.zeros(x.shape[0], D)
            ys = {}
            for t in order:
                h, c = cell(x[:, t], (h, c))
                ys[t] = h
            outs.append(torch.stack([ys[t] for t in range(x.shape[1])], dim=1))
        return torch.cat(outs, dim=-1)


def test_bidirectional_lstm_cell_loops_fuse_into_two_lstm_seqs():
    torch.manual_seed(0)
    fused, report = check_fused(export(BidirectionalLSTMCells(), (seq_input(5),), ["x"], ["y"]), "LSTMSeq", count=2)
    assert sorted(m.detail["direction"] for m in report.matches) == ["forward", "reverse"]
    assert "Gather" not in ops(fused), ops(fused)


def test_stacked_lstm_cells_step_form_fuse_one_lstm_seq_a_layer():
    """Two layers in the step form: the second layer's cell reads the first one's states through
    its frame, and still finds its own h among the state inputs."""

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.cells = nn.ModuleList([nn.LSTMCell(F, D), nn.LSTMCell(D, D)])

        def forward(self, x, h0, c0, h1, c1):
            h0, c0 = self.cells[0](x, (h0, c0))
            h1, c1 = self.cells[1](h0, (h1, c1))
            return h1, h0, c0, h1, c1

    torch.manual_seed(0)
    args = (torch.randn(B, F), *[torch.randn(B, D) for _ in range(4)])
    names = ["x", "state.l0_h", "state.l0_c", "state.l1_h", "state.l1_c"]
    outs = ["y", "next_state.l0_h", "next_state.l0_c", "next_state.l1_h", "next_state.l1_c"]
    check_fused(export(Step(), args, names, outs), "LSTMSeq", count=2)
