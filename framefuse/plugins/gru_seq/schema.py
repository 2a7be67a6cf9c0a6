"""GRUSeq: ONNX GRU (forward direction, gate order z, r, h, linear_before_reset = 1 as in
torch.nn.GRU), without the num_directions axis. See plugins/OPS.md."""

from __future__ import annotations

from framefuse.plugins.lstm_seq.schema import hidden_size
from framefuse.plugins.schema import OpSchema, TensorSpec, require_equal, require_rank

NAME = "GRUSeq"
GATES = 3


def infer_shapes(shapes, attrs):
    X, W, R, bias, h0 = (list(shapes) + [None] * 5)[:5]
    T, B, I = require_rank(NAME, "X", X, 3)
    H = hidden_size(NAME, GATES, W, R)
    require_equal(NAME, "input size", ("X[2]", I), ("W[1]", require_rank(NAME, "W", W, 2)[1]))
    if bias is not None:
        require_equal(NAME, "bias length", ("bias", require_rank(NAME, "bias", bias, 1)[0]), ("6*H", 6 * H))
    if h0 is not None:
        b, h = require_rank(NAME, "h0", h0, 2)
        require_equal(NAME, "h0 batch", ("h0[0]", b), ("X[1]", B))
        require_equal(NAME, "h0 hidden", ("h0[1]", h), ("H", H))
    return [(T, B, H), (B, H)]


SCHEMA = OpSchema(
    name=NAME,
    inputs=(
        TensorSpec("X", 3, "T", dims=("T", "B", "I"), doc="input sequence"),
        TensorSpec("W", 2, "T", dims=("3H", "I"), doc="input weights, gates z, r, h"),
        TensorSpec("R", 2, "T", dims=("3H", "H"), doc="recurrent weights, gates z, r, h"),
        TensorSpec("bias", 1, "T", optional=True, dims=("6H",), doc="input bias Wb then recurrent bias Rb"),
        TensorSpec("h0", 2, "float32", optional=True, dims=("B", "H"), doc="initial hidden state"),
    ),
    outputs=(
        TensorSpec("Y", 3, "T", dims=("T", "B", "H"), doc="all hidden states"),
        TensorSpec("h_last", 2, "float32", dims=("B", "H"), doc="last hidden state"),
    ),
    attributes={},
    infer_shapes=infer_shapes,
    doc="ONNX GRU, linear_before_reset=1: n = tanh(Wx + Wb + r*(Rh + Rb)); h' = (1-z)*n + z*h.",
)
