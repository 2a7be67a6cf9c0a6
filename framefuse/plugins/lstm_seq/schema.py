"""LSTMSeq: ONNX LSTM (forward direction, gate order i, o, f, c, no peepholes, default
activations), without the num_directions axis. See plugins/OPS.md."""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

NAME = "LSTMSeq"
GATES = 4


def hidden_size(op: str, gates: int, W, R) -> int:
    """H from R [G*H, H] (or W [G*H, I] when R's dims are unknown), checked against both."""
    R = require_rank(op, "R", R, 2)
    W = require_rank(op, "W", W, 2)
    H = R[1] if isinstance(R[1], int) and R[1] >= 0 else None
    if H is None:
        for rows in (R[0], W[0]):
            if isinstance(rows, int) and rows >= 0:
                if rows % gates:
                    raise SchemaError(f"{op}: W/R have {rows} rows, not a multiple of {gates} gates")
                H = rows // gates
                break
    if H is None:
        raise SchemaError(f"{op}: cannot tell the hidden size from R {list(R)} and W {list(W)}")
    require_equal(op, f"gate rows ({gates}*H)", ("W rows", W[0]), ("R rows", R[0]), (f"{gates}*H", gates * H))
    return H


def infer_shapes(shapes, attrs):
    X, W, R, bias, h0, c0 = (list(shapes) + [None] * 6)[:6]
    T, B, I = require_rank(NAME, "X", X, 3)
    H = hidden_size(NAME, GATES, W, R)
    require_equal(NAME, "input size", ("X[2]", I), ("W[1]", require_rank(NAME, "W", W, 2)[1]))
    if bias is not None:
        require_equal(NAME, "bias length", ("bias", require_rank(NAME, "bias", bias, 1)[0]), ("8*H", 8 * H))
    for arg, s in (("h0", h0), ("c0", c0)):
        if s is not None:
            b, h = require_rank(NAME, arg, s, 2)
            require_equal(NAME, f"{arg} batch", (f"{arg}[0]", b), ("X[1]", B))
            require_equal(NAME, f"{arg} hidden", (f"{arg}[1]", h), ("H", H))
    return [(T, B, H), (B, H), (B, H)]


SCHEMA = OpSchema(
    name=NAME,
    inputs=(
        TensorSpec("X", 3, "T", dims=("T", "B", "I"), doc="input sequence"),
        TensorSpec("W", 2, "T", dims=("4H", "I"), doc="input weights, gates i, o, f, c"),
        TensorSpec("R", 2, "T", dims=("4H", "H"), doc="recurrent weights, gates i, o, f, c"),
        TensorSpec("bias", 1, "T", optional=True, dims=("8H",), doc="input bias Wb then recurrent bias Rb"),
        TensorSpec("h0", 2, "float32", optional=True, dims=("B", "H"), doc="initial hidden state"),
        TensorSpec("c0", 2, "float32", optional=True, dims=("B", "H"), doc="initial cell state"),
    ),
    outputs=(
        TensorSpec("Y", 3, "T", dims=("T", "B", "H"), doc="all hidden states"),
        TensorSpec("h_last", 2, "float32", dims=("B", "H"), doc="last hidden state"),
        TensorSpec("c_last", 2, "float32", dims=("B", "H"), doc="last cell state"),
    ),
    attributes={},
    infer_shapes=infer_shapes,
    doc="ONNX LSTM, forward direction: i, o, f = sigmoid, g = tanh; c' = f*c + i*g; h' = o*tanh(c').",
)
