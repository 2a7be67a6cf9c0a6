"""Recurrences and attention written the way other libraries write them (issue 8, items 2-3).

Small hand-written modules reproduce each style exactly (casts to the same type, Where with a
frame-dependent condition, in-place output writes, growing concatenations, a loop after an
unfused loop, a loop the passes cannot see); transformers' own Mamba is checked at B = 1 and
B = 2. Every fused graph must match ONNX Runtime on the original, keep the same node count at two
T, and leave no per-step op; every decline must name the node.
"""

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
from framefuse.rewrite.steps import chained_step_nodes


def export(module: nn.Module, args: tuple) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=[f"in{i}" for i in range(len(args))],
            output_names=["y"],
        )
    return onnx.load_from_string(buffer.getvalue())


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


def framefuse_ops(model: onnx.ModelProto) -> list[str]:
    return sorted(n.op_type for n in model.graph.node if n.domain == "framefuse")


def check(model: onnx.ModelProto, expected_ops: list[str], atol: float = 1e-4):
    fused, report = rewrite_model(model)
    assert framefuse_ops(fused) == sorted(expected_ops), (report.declined, framefuse_ops(fused))
    assert report.remaining_total == 0, report.remaining_per_timestep_ops
    feeds = feeds_for(model)
    expected = ort_session(model, fused=True).run(None, feeds)
    actual = ort_session(fused, fused=True).run(None, feeds)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=atol)
    return fused, report


class CastingScan(nn.Module):
    """h = a_t * h.float() + b_t with .to(dtype) everywhere, as transformers writes it."""

    def __init__(self, d: int = 6):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        a, b = torch.sigmoid(self.a(x)), self.b(x)
        h = torch.zeros(x.shape[0], x.shape[2], dtype=x.dtype)
        outs = []
        for t in range(x.shape[1]):
            h = (a[:, t].float() * h.float() + b[:, t].float()).to(x.dtype)
            outs.append(h.to(x.dtype))
        return torch.stack(outs, 1)


class GatedScan(nn.Module):
    """A reset written as Where with a frame-dependent condition: h stays when the gate is off."""

    def __init__(self, d: int = 6):
        super().__init__()
        self.a, self.b, self.g = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        a, b, g = torch.sigmoid(self.a(x)), self.b(x), self.g(x)
        h = torch.zeros(x.shape[0], x.shape[2])
        outs = []
        for t in range(x.shape[1]):
            h = torch.where(g[:, t] > 0, a[:, t] * h + b[:, t], -h)
            outs.append(h)
        return torch.stack(outs, 1)


class InPlaceWrites(nn.Module):
    """out[:, t] = h (a ScatterND chain) or out = cat([out, h[:, None]]) (a Concat chain).

    "scatter_like" is transformers' RWKV: out = zeros_like(b) with b computed from a time-shifted
    (padded) input, so the buffer's shape is unknown when the pipeline folds constants and each
    write's index arithmetic (reading the buffer's shape) stays in the graph until the ScatterND
    chain is replaced."""

    def __init__(self, d: int = 6, style: str = "scatter"):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)
        self.style = style

    def forward(self, x):
        bsz, steps, d = x.shape
        shifted = nn.functional.pad(x, (0, 0, 1, -1)) if self.style == "scatter_like" else x
        a, b = torch.sigmoid(self.a(x)), self.b(shifted)
        h = torch.zeros(bsz, d)
        if self.style == "scatter_like":
            out = torch.zeros_like(b)
        else:
            out = torch.zeros(bsz, steps, d) if self.style == "scatter" else h.new_zeros(bsz, 0, d)
        for t in range(steps):
            h = a[:, t] * h + b[:, t]
            if self.style.startswith("scatter"):
                out[:, t] = h
            else:
                out = torch.cat([out, h[:, None]], 1)
        return out


class TwoLoops(nn.Module):
    """A tanh loop (no framefuse op) followed by a linear loop over its outputs."""

    def __init__(self, d: int = 6):
        super().__init__()
        self.w, self.a, self.b = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = torch.zeros(x.shape[0], x.shape[2])
        first = []
        for t in range(x.shape[1]):
            h = torch.tanh(self.w(h) + x[:, t])
            first.append(h)
        z = torch.stack(first, 1)
        a, b = torch.sigmoid(self.a(z)), self.b(z)
        g = torch.zeros(x.shape[0], x.shape[2])
        second = []
        for t in range(x.shape[1]):
            g = a[:, t] * g + b[:, t]
            second.append(g)
        return torch.stack(second, 1)


class Autonomous(nn.Module):
    """h = tanh(W h) with no frame input: no slice of a sequence tells where the steps are."""

    def __init__(self, d: int = 6, steps: int = 8):
        super().__init__()
        self.lin, self.steps = nn.Linear(d, d), steps

    def forward(self, h):
        outs = []
        for _ in range(self.steps):
            h = torch.tanh(self.lin(h))
            outs.append(h)
        return torch.stack(outs, 1)


class Transposing(nn.Module):
    """h = a ⊙ hᵀ + b: the layout of h changes inside the step."""

    def forward(self, x):
        h = torch.zeros(x.shape[0], x.shape[2], x.shape[3])
        outs = []
        for t in range(x.shape[1]):
            h = torch.sigmoid(x[:, t]) * h.transpose(1, 2) + x[:, t]
            outs.append(h)
        return torch.stack(outs, 1)


@pytest.mark.parametrize("module", [CastingScan, GatedScan], ids=["casts", "where"])
@pytest.mark.parametrize("batch", [1, 2])
def test_affine_proof_through_casts_and_where(module, batch):
    torch.manual_seed(0)
    m = module()
    sizes = set()
    for steps in (5, 9):
        fused, _ = check(export(m, (torch.randn(batch, steps, 6),)), ["LinearScan"])
        sizes.add(len(fused.graph.node))
    assert len(sizes) == 1, sizes  # nothing per-step left: the same graph at every T


@pytest.mark.parametrize("style", ["scatter", "scatter_like", "concat"])
def test_in_place_and_growing_output_writes_are_stacking(style):
    torch.manual_seed(0)
    m = InPlaceWrites(style=style)
    sizes = set()
    for steps in (5, 9):
        fused, report = check(export(m, (torch.randn(2, steps, 6),)), ["LinearScan"])
        assert not report.declined, report.declined
        ops = [n.op_type for n in fused.graph.node]
        assert "ScatterND" not in ops or style.startswith("scatter")
        # One write of all frames is left, not the chain of T writes.
        assert ops.count("ScatterND") <= 1, ops
        if style == "scatter_like":
            # Every intermediate buffer was read only through its (static) shape: all such reads
            # became constants, so the old writes and the per-step index arithmetic are gone.
            (stack,) = [x for x in report.matches if x.pass_name == "unrolled-output-stacking"]
            assert stack.detail["writes"] == steps and stack.detail["shape_reads"] > 0, stack.detail
            assert "Range" not in ops, ops
        sizes.add(len(fused.graph.node))
    assert len(sizes) == 1, sizes


def test_loop_after_an_unfused_loop_is_fused_and_the_first_is_counted():
    torch.manual_seed(0)
    model = export(TwoLoops(), (torch.randn(2, 6, 6),))
    fused, report = rewrite_model(model)
    assert framefuse_ops(fused) == ["LinearScan"], report.declined
    assert any("Tanh" in d.reason for d in report.declined), report.declined
    assert report.remaining_per_timestep_ops["unrolled"] > 0
    feeds = feeds_for(model)
    np.testing.assert_allclose(
        ort_session(fused, fused=True).run(None, feeds)[0],
        ort_session(model, fused=True).run(None, feeds)[0],
        rtol=1e-4,
        atol=1e-5,
    )


def test_loop_no_pass_sees_is_still_counted():
    torch.manual_seed(0)
    model = export(Autonomous(), (torch.randn(2, 6),))
    graph = gs.import_onnx(model)
    assert {n.op for n in chained_step_nodes(graph)} >= {"Tanh"}
    _, report = rewrite_model(model)
    assert report.remaining_per_timestep_ops["unrolled"] > 0
    assert report.remaining_total > 0


def test_layer_stack_is_not_counted_as_a_loop():
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 6), nn.GELU()) for _ in range(4)])
    model = export(layers, (torch.randn(2, 5, 6),))
    assert chained_step_nodes(gs.import_onnx(model)) == []


def test_layout_change_of_the_state_is_declined_naming_the_node():
    model = export(Transposing(), (torch.randn(2, 5, 4, 4),))
    fused, report = rewrite_model(model)
    assert framefuse_ops(fused) == []
    reasons = " ".join(d.reason for d in report.declined)
    assert "Transpose" in reasons and "node '" in reasons, report.declined
    assert report.remaining_total > 0


def test_cast_to_another_float_type_is_declined_naming_the_node():
    class HalfStep(nn.Module):
        def forward(self, x):
            h = torch.zeros(x.shape[0], x.shape[2])
            outs = []
            for t in range(x.shape[1]):
                h = (torch.sigmoid(x[:, t]) * h).to(torch.float16).to(torch.float32) + x[:, t]
                outs.append(h)
            return torch.stack(outs, 1)

    _, report = rewrite_model(export(HalfStep(), (torch.randn(2, 5, 6),)))
    reasons = " ".join(d.reason for d in report.declined)
    assert "Cast" in reasons and "float16" in reasons, report.declined
    assert report.remaining_total > 0


class _LastHidden(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).last_hidden_state


def _mamba(cls_name: str):
    transformers = pytest.importorskip("transformers")
    cfg_cls = getattr(transformers, cls_name + "Config")
    model_cls = getattr(transformers, cls_name + "Model")
    torch.manual_seed(0)
    cfg = cfg_cls(
        hidden_size=32, num_hidden_layers=2, vocab_size=50, state_size=4, expand=2, conv_kernel=4, use_cache=False
    )
    return _LastHidden(model_cls(cfg).eval())


@pytest.mark.parametrize("cls_name", ["Mamba", "FalconMamba"])
@pytest.mark.parametrize("batch", [1, 2])
def test_transformers_mamba_slow_path_fuses_into_selective_scans(cls_name, batch):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, cls_name + "Model"):
        pytest.skip(f"transformers has no {cls_name}Model")
    m = _mamba(cls_name)
    sizes = set()
    for steps in (6, 10):
        fused, _ = check(export(m, (torch.randint(0, 50, (batch, steps)),)), ["SelectiveScan"] * 2)
        sizes.add(len(fused.graph.node))
    assert len(sizes) == 1, sizes


def test_transformers_eager_attention_with_two_casts_is_fused():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        vocab_size=50,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        attn_implementation="eager",
        use_cache=False,
    )
    llama = transformers.LlamaModel(cfg).eval()

    class WithMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = llama

        def forward(self, ids):
            return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state

    check(export(WithMask(), (torch.randint(0, 50, (2, 8)),)), ["Attention"])


def test_chunked_segment_sum_scan_is_reported_not_silently_left():
    class SegmentSum(nn.Module):
        """y = (exp(segsum(log a)) masked to s ≤ t) @ x: one chunk of an SSD-style scan."""

        def forward(self, log_a, x):
            cs = torch.cumsum(log_a, -1)
            seg = cs[:, :, None] - cs[:, None, :]
            steps = log_a.shape[-1]
            mask = torch.tril(torch.ones(steps, steps, dtype=torch.bool))
            return torch.exp(seg.masked_fill(~mask, float("-inf"))) @ x

    model = export(SegmentSum(), (-torch.rand(2, 6), torch.randn(2, 6, 4)))
    fused, report = rewrite_model(model)
    chunked = [d for d in report.declined if d.pass_name == "unrolled-chunked-scan"]
    assert len(chunked) == 1, report.declined
    assert "CumSum" in chunked[0].where and "Exp" in chunked[0].where
    assert "no pass mapped it" in chunked[0].reason
    assert framefuse_ops(fused) == []


def test_matmul_by_a_diagonal_matrix_is_affine_and_a_full_one_is_declined():
    class MatrixStep(nn.Module):
        def __init__(self, matrix):
            super().__init__()
            self.register_buffer("m", matrix)

        def forward(self, x):
            h = torch.zeros(x.shape[0], x.shape[2])
            outs = []
            for t in range(x.shape[1]):
                h = torch.sigmoid(x[:, t]) * (h @ self.m) + x[:, t]
                outs.append(h)
            return torch.stack(outs, 1)

    torch.manual_seed(0)
    check(export(MatrixStep(torch.diag(torch.rand(6))), (torch.randn(2, 5, 6),)), ["LinearScan"])
    _, report = rewrite_model(export(MatrixStep(torch.rand(6, 6)), (torch.randn(2, 5, 6),)))
    assert any("MatMul" in d.reason and "node '" in d.reason for d in report.declined), report.declined
    assert report.remaining_total > 0


def test_state_reshaped_into_heads_and_back_is_affine():
    class Heads(nn.Module):
        """h [B, H·D] viewed as [B, H, D] for a per-head decay, then flattened back."""

        def __init__(self, heads: int = 2, dim: int = 3):
            super().__init__()
            self.decay = nn.Parameter(torch.rand(heads, 1))
            self.heads, self.dim = heads, dim

        def forward(self, x):
            bsz, steps, width = x.shape
            h = torch.zeros(bsz, width)
            outs = []
            for t in range(steps):
                per_head = h.reshape(bsz, self.heads, self.dim).transpose(1, 2)
                h = (torch.sigmoid(self.decay.T) * per_head).transpose(1, 2).reshape(bsz, width) + x[:, t]
                outs.append(h)
            return torch.stack(outs, 1)

    torch.manual_seed(0)
    for batch in (1, 2):
        check(export(Heads(), (torch.randn(batch, 5, 6),)), ["LinearScan"])
