"""CPU checks of the LSTMSeq / GRUSeq / LiquidScan definitions: the references against ONNX Runtime
running real ONNX LSTM/GRU nodes, against torch nn.LSTM/nn.GRU with converted weights, and against
the zoo's CfC cell; shape rules; the kernel launch planning (no GPU needed)."""

from __future__ import annotations

import pathlib
import re

import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from framefuse.plugins import registry
from framefuse.plugins.gru_seq import reference as gru_reference
from framefuse.plugins.liquid_scan import reference as liquid_reference
from framefuse.plugins.lstm_seq import persistent
from framefuse.plugins.lstm_seq import reference as lstm_reference
from framefuse.plugins.schema import SchemaError

PLUGINS = pathlib.Path(__file__).resolve().parents[1] / "framefuse" / "plugins"


def _run_onnx_rnn(op_type: str, gates: int, X, W, R, bias, h0, c0=None, **attrs):
    """Run one ONNX LSTM/GRU node (forward, num_directions=1) in ONNX Runtime."""
    T, B, I = X.shape
    H = R.shape[1]
    names = ["X", "W", "R", "B", "", "initial_h"] + (["initial_c"] if op_type == "LSTM" else [])
    node = helper.make_node(
        op_type, names, ["Y", "Y_h"] + (["Y_c"] if op_type == "LSTM" else []), hidden_size=H, **attrs
    )
    inputs = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, B, I]),
        helper.make_tensor_value_info("W", TensorProto.FLOAT, [1, gates * H, I]),
        helper.make_tensor_value_info("R", TensorProto.FLOAT, [1, gates * H, H]),
        helper.make_tensor_value_info("B", TensorProto.FLOAT, [1, 2 * gates * H]),
        helper.make_tensor_value_info("initial_h", TensorProto.FLOAT, [1, B, H]),
    ]
    if op_type == "LSTM":
        inputs.append(helper.make_tensor_value_info("initial_c", TensorProto.FLOAT, [1, B, H]))
    outputs = [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [T, 1, B, H]),
        helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, B, H]),
    ]
    if op_type == "LSTM":
        outputs.append(helper.make_tensor_value_info("Y_c", TensorProto.FLOAT, [1, B, H]))
    graph = helper.make_graph([node], f"{op_type.lower()}_check", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8  # ONNX Runtime reads IR <= 13; onnx writes newer by default
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {
        "X": X.numpy(),
        "W": W[None].numpy(),
        "R": R[None].numpy(),
        "B": bias[None].numpy(),
        "initial_h": h0[None].numpy(),
    }
    if op_type == "LSTM":
        feeds["initial_c"] = c0[None].numpy()
    return [torch.from_numpy(a) for a in sess.run(None, feeds)]


def _rand(*shape, scale=0.5, gen):
    return (torch.rand(*shape, generator=gen) * 2 - 1) * scale


# ---------------------------------------------------------------------------------------------
# LSTMSeq


@pytest.mark.parametrize("T,B,I,H", [(1, 1, 3, 4), (7, 3, 5, 6), (16, 2, 8, 33)])
def test_lstm_reference_matches_onnxruntime_lstm(T, B, I, H):
    gen = torch.Generator().manual_seed(T * 100 + H)
    X, W, R = _rand(T, B, I, scale=1.0, gen=gen), _rand(4 * H, I, gen=gen), _rand(4 * H, H, gen=gen)
    bias, h0, c0 = _rand(8 * H, gen=gen), _rand(B, H, gen=gen), _rand(B, H, gen=gen)
    Y_ort, h_ort, c_ort = _run_onnx_rnn("LSTM", 4, X, W, R, bias, h0, c0)
    Y, h_last, c_last = lstm_reference(X, W, R, bias, h0, c0)
    assert Y.shape == (T, B, H) and Y.dtype == torch.float32
    torch.testing.assert_close(Y, Y_ort[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_last, h_ort[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c_last, c_ort[0], atol=1e-5, rtol=1e-5)
    # the ONNX node's Y_h is also the last row of Y
    torch.testing.assert_close(Y[-1], h_last)


def _torch_lstm_to_onnx(lstm: torch.nn.LSTM):
    """nn.LSTM (gates i, f, g, o) → ONNX layout (gates i, o, f, c)."""
    H = lstm.hidden_size

    def reorder(t):
        i, f, g, o = t.split(H, dim=0)
        return torch.cat([i, o, f, g])

    W = reorder(lstm.weight_ih_l0.detach())
    R = reorder(lstm.weight_hh_l0.detach())
    bias = torch.cat([reorder(lstm.bias_ih_l0.detach()), reorder(lstm.bias_hh_l0.detach())])
    return W, R, bias


def test_lstm_reference_matches_torch_lstm():
    torch.manual_seed(0)
    T, B, I, H = 9, 4, 5, 7
    lstm = torch.nn.LSTM(I, H)
    X = torch.randn(T, B, I)
    h0, c0 = torch.randn(1, B, H), torch.randn(1, B, H)
    with torch.no_grad():
        Y_t, (h_t, c_t) = lstm(X, (h0, c0))
    W, R, bias = _torch_lstm_to_onnx(lstm)
    Y, h_last, c_last = lstm_reference(X, W, R, bias, h0[0], c0[0])
    torch.testing.assert_close(Y, Y_t, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_last, h_t[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c_last, c_t[0], atol=1e-5, rtol=1e-5)


def test_lstm_reference_optional_inputs_are_zeros():
    gen = torch.Generator().manual_seed(1)
    T, B, I, H = 4, 2, 3, 5
    X, W, R = _rand(T, B, I, gen=gen), _rand(4 * H, I, gen=gen), _rand(4 * H, H, gen=gen)
    Y, h, c = lstm_reference(X, W, R)
    zeros = torch.zeros(B, H)
    Y2, h2, c2 = lstm_reference(X, W, R, torch.zeros(8 * H), zeros, zeros)
    torch.testing.assert_close(Y, Y2, atol=0, rtol=0)
    torch.testing.assert_close(c, c2, atol=0, rtol=0)
    assert not torch.equal(Y[0], torch.zeros(B, H))


def test_lstm_reference_dtypes_and_empty_sequence():
    gen = torch.Generator().manual_seed(2)
    T, B, I, H = 3, 2, 3, 4
    X, W, R = _rand(T, B, I, gen=gen), _rand(4 * H, I, gen=gen), _rand(4 * H, H, gen=gen)
    Y, h, c = lstm_reference(X.half(), W.half(), R.half())
    assert Y.dtype == torch.float16 and h.dtype == torch.float32 and c.dtype == torch.float32
    # fp16 storage: the reference computes in fp32 from the rounded inputs
    Y32, _, _ = lstm_reference(X.half().float(), W.half().float(), R.half().float())
    torch.testing.assert_close(Y, Y32.half(), atol=0, rtol=0)
    Y64, h64, _ = lstm_reference(X.double(), W.double(), R.double())
    assert Y64.dtype == torch.float64 and h64.dtype == torch.float64
    h0 = _rand(B, H, gen=gen)
    Y0, h_last, c_last = lstm_reference(X[:0], W, R, None, h0, None)
    assert Y0.shape == (0, B, H)
    torch.testing.assert_close(h_last, h0, atol=0, rtol=0)
    torch.testing.assert_close(c_last, torch.zeros(B, H), atol=0, rtol=0)


def test_lstm_reference_propagates_nan_from_that_step_on():
    gen = torch.Generator().manual_seed(3)
    T, B, I, H = 6, 2, 3, 4
    X, W, R = _rand(T, B, I, gen=gen), _rand(4 * H, I, gen=gen), _rand(4 * H, H, gen=gen)
    X[2, 1, 0] = float("nan")
    Y, h, c = lstm_reference(X, W, R)
    assert torch.isfinite(Y[:2]).all() and torch.isfinite(Y[:, 0]).all()
    assert torch.isnan(Y[2:, 1]).all() and torch.isnan(h[1]).all()


# ---------------------------------------------------------------------------------------------
# GRUSeq


@pytest.mark.parametrize("T,B,I,H", [(1, 1, 3, 4), (7, 3, 5, 6), (16, 2, 8, 33)])
def test_gru_reference_matches_onnxruntime_gru(T, B, I, H):
    gen = torch.Generator().manual_seed(T * 10 + H)
    X, W, R = _rand(T, B, I, scale=1.0, gen=gen), _rand(3 * H, I, gen=gen), _rand(3 * H, H, gen=gen)
    bias, h0 = _rand(6 * H, gen=gen), _rand(B, H, gen=gen)
    Y_ort, h_ort = _run_onnx_rnn("GRU", 3, X, W, R, bias, h0, linear_before_reset=1)
    Y, h_last = gru_reference(X, W, R, bias, h0)
    torch.testing.assert_close(Y, Y_ort[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_last, h_ort[0], atol=1e-5, rtol=1e-5)


def test_gru_reference_differs_from_linear_before_reset_0():
    """Guards the semantics: ONNX's default (linear_before_reset=0) is a different function."""
    gen = torch.Generator().manual_seed(5)
    T, B, I, H = 5, 2, 3, 4
    X, W, R = _rand(T, B, I, scale=1.0, gen=gen), _rand(3 * H, I, gen=gen), _rand(3 * H, H, gen=gen)
    bias, h0 = _rand(6 * H, scale=1.0, gen=gen), _rand(B, H, gen=gen)
    Y_ort0, _ = _run_onnx_rnn("GRU", 3, X, W, R, bias, h0, linear_before_reset=0)
    Y, _ = gru_reference(X, W, R, bias, h0)
    assert (Y - Y_ort0[:, 0]).abs().max() > 1e-4


def test_gru_reference_matches_torch_gru():
    torch.manual_seed(1)
    T, B, I, H = 9, 4, 5, 7
    gru = torch.nn.GRU(I, H)
    X, h0 = torch.randn(T, B, I), torch.randn(1, B, H)
    with torch.no_grad():
        Y_t, h_t = gru(X, h0)

    def reorder(t):  # torch r, z, n → ONNX z, r, h
        r, z, n = t.split(H, dim=0)
        return torch.cat([z, r, n])

    W, R = reorder(gru.weight_ih_l0.detach()), reorder(gru.weight_hh_l0.detach())
    bias = torch.cat([reorder(gru.bias_ih_l0.detach()), reorder(gru.bias_hh_l0.detach())])
    Y, h_last = gru_reference(X, W, R, bias, h0[0])
    torch.testing.assert_close(Y, Y_t, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_last, h_t[0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# LiquidScan


@pytest.mark.parametrize("ts", [1.0, 0.37])
def test_liquid_reference_matches_cfc_cell_loop(ts):
    from framefuse.models.liquid import CfCMixer

    torch.manual_seed(2)
    B, T, H = 3, 8, 6  # the zoo's CfC has hidden == embed
    cell = CfCMixer(H, ts)
    x = torch.randn(B, T, H)
    h0 = torch.randn(B, H)
    heads = (cell.ff1, cell.ff2, cell.time_a, cell.time_b)
    with torch.no_grad():
        h = h0
        expected = []
        for t in range(T):
            h = cell.cell(x[:, t], h)
            expected.append(h)
        expected = torch.stack(expected, dim=1)
        # split every head's Linear over cat([x, h]) into its x part (precomputed: xg) and h part (R)
        W_x = torch.cat([lin.weight[:, :H] for lin in heads])
        R = torch.cat([lin.weight[:, H:] for lin in heads])
        b = torch.cat([lin.bias for lin in heads])
        xg = x @ W_x.T + b
    out, h_last = liquid_reference(xg, R, h0, ts=ts)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_last, expected[:, -1], atol=1e-5, rtol=1e-5)


def test_liquid_reference_ts_matters_and_zero_state_default():
    gen = torch.Generator().manual_seed(7)
    B, T, H = 2, 4, 5
    xg, R = _rand(B, T, 4 * H, scale=1.0, gen=gen), _rand(4 * H, H, gen=gen)
    a, _ = liquid_reference(xg, R, None, ts=1.0)
    b, _ = liquid_reference(xg, R, torch.zeros(B, H), ts=1.0)
    c, _ = liquid_reference(xg, R, None, ts=2.0)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert (a - c).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------
# schemas


def test_schemas_are_registered_and_infer_shapes():
    lstm = registry.get_schema("LSTMSeq")
    assert lstm.input_names == ("X", "W", "R", "bias", "h0", "c0")
    assert lstm.infer_shapes([(5, 2, 3), (28, 3), (28, 7), (56,), (2, 7), None], {}) == [(5, 2, 7), (2, 7), (2, 7)]
    gru = registry.get_schema("GRUSeq")
    assert gru.infer_shapes([(5, 2, 3), (21, 3), (21, 7), None, None], {}) == [(5, 2, 7), (2, 7)]
    liquid = registry.get_schema("LiquidScan")
    assert liquid.infer_shapes([(2, 5, 28), (28, 7), None], {}) == [(2, 5, 7), (2, 7)]
    assert liquid.attrs_with_defaults({}) == {"ts": 1.0}
    import torch as _t

    assert lstm.output_dtypes(_t.float16) == [_t.float16, _t.float32, _t.float32]


@pytest.mark.parametrize(
    "op,shapes,match",
    [
        ("LSTMSeq", [(5, 2, 3), (28, 4), (28, 7)], "input size"),
        ("LSTMSeq", [(5, 2, 3), (24, 3), (28, 7)], "gate rows"),
        ("LSTMSeq", [(5, 2, 3), (28, 3), (28, 7), (28,)], "bias length"),
        ("LSTMSeq", [(5, 2, 3), (28, 3), (28, 7), None, (3, 7)], "h0 batch"),
        ("GRUSeq", [(5, 2, 3), (21, 3), (21, 7), None, (2, 6)], "h0 hidden"),
        ("LiquidScan", [(2, 5, 27), (28, 7)], "gate rows"),
        ("LiquidScan", [(2, 5), (28, 7)], "rank 3"),
    ],
)
def test_schema_shape_errors_name_the_problem(op, shapes, match):
    with pytest.raises(SchemaError, match=match):
        registry.get_schema(op).infer_shapes(shapes, {})


# ---------------------------------------------------------------------------------------------
# launch planning (pure Python; the kernels themselves are tested in tests/gpu)

H100 = {"cc": (9, 0), "sm_count": 132, "max_shared_per_block_optin": 227 * 1024, "name": "H100"}
A100 = {"cc": (8, 0), "sm_count": 108, "max_shared_per_block_optin": 163 * 1024, "name": "A100"}


def _entries_in(source: pathlib.Path) -> set[str]:
    text = source.read_text()
    names = set()
    for _kind, name in re.findall(r"FFRNN_(SINGLE|CLUSTER)_ENTRIES\((\w+),", text):
        names |= {name, name + "_rg"}
    return names


@pytest.mark.parametrize("props", [H100, A100], ids=["H100", "A100"])
@pytest.mark.parametrize(
    "op,prefix,G", [("LSTMSeq", "lstm_seq", 4), ("GRUSeq", "gru_seq", 3), ("LiquidScan", "liquid_scan", 4)]
)
def test_plans_name_existing_entries_and_fit_shared_memory(props, op, prefix, G):
    entries = _entries_in(PLUGINS / prefix / f"{prefix}.cu")
    for H in (1, 33, 64, 256, 257, 330, 1024):
        for B in (1, 7, 64):
            for suffix, elem in (("f32", 4), ("f16", 2), ("bf16", 2)):
                p = persistent.plan(op, prefix, G, B, H, suffix, elem, props)
                assert p.entry in entries
                assert p.shared_mem <= props["max_shared_per_block_optin"]
                assert p.grid[0] == (persistent.CLUSTER_BLOCKS if p.cluster else 1)
                assert p.grid[1] * p.BB >= B > (p.grid[1] - 1) * p.BB  # every batch row, no empty group
                assert p.HB * p.grid[0] >= H
                # the K splits cover every (padded) column exactly once, in multiples of 4
                HP = (H + 3) // 4 * 4
                assert p.KC % 4 == 0 and (p.KS - 1) * p.KC < HP <= p.KS * p.KC
                assert p.KS * min((G * p.HB + 3) // 4, persistent.KERNEL_THREADS) <= persistent.KERNEL_THREADS


def test_seed_size_uses_the_cluster_path_with_r_in_shared_memory():
    p = persistent.plan("LSTMSeq", "lstm_seq", 4, 1, 256, "f32", 4, H100)
    assert p.entry == "lstm_seq_cluster_f32" and p.r_in_smem and p.grid == (8, 1, 1)
    # too large for shared memory: the R-from-global entry, still the cluster path
    p = persistent.plan("LSTMSeq", "lstm_seq", 4, 1, 512, "f32", 4, H100)
    assert p.entry == "lstm_seq_cluster_f32_rg"
    # before sm_90 there are no clusters
    p = persistent.plan("GRUSeq", "gru_seq", 3, 1, 256, "f16", 2, A100)
    assert p.entry.startswith("gru_seq_f16") and p.grid[0] == 1


def test_plan_refuses_hidden_sizes_beyond_shared_memory():
    from framefuse.plugins.checks import OpArgumentError

    with pytest.raises(OpArgumentError, match="H=8192"):
        persistent.plan("LSTMSeq", "lstm_seq", 4, 1, 8192, "f32", 4, A100)


def test_workspace_size_covers_projection_and_fp32_copies():
    from framefuse.plugins.gru_seq import workspace_size as gru_ws
    from framefuse.plugins.lstm_seq import workspace_size as lstm_ws

    assert lstm_ws(32, 1, 64, 256, torch.float32) == 32 * 4 * 256
    assert lstm_ws(32, 2, 64, 256, torch.float16) == 32 * 2 * 4 * 256 + 32 * 2 * 64 + 4 * 256 * 64
    assert gru_ws(5, 3, 7, 9, torch.float32) == 5 * 3 * 3 * 9


def test_launch_rejects_cpu_tensors_naming_op_and_argument():
    from framefuse.plugins.checks import OpArgumentError
    from framefuse.plugins.liquid_scan import launch as liquid_launch
    from framefuse.plugins.lstm_seq import launch as lstm_launch

    with pytest.raises(OpArgumentError, match=r"LSTMSeq: argument X: expected a CUDA tensor"):
        lstm_launch([torch.zeros(2, 1, 3), torch.zeros(8, 3), torch.zeros(8, 2)], {})
    with pytest.raises(OpArgumentError, match=r"LiquidScan: argument xg"):
        liquid_launch([torch.zeros(1, 2, 8), torch.zeros(8, 2)], {})
