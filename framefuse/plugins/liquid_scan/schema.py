"""LiquidScan: the closed-form continuous-time (CfC) liquid cell over a sequence. See plugins/OPS.md."""

from __future__ import annotations

from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, require_equal, require_rank

NAME = "LiquidScan"
GATES = 4


def infer_shapes(shapes, attrs):
    xg, R, h0 = (list(shapes) + [None] * 3)[:3]
    B, T, G4 = require_rank(NAME, "xg", xg, 3)
    rows, H = require_rank(NAME, "R", R, 2)
    if not (isinstance(H, int) and H >= 0):
        if isinstance(rows, int) and rows >= 0:
            H = rows // GATES
        elif isinstance(G4, int) and G4 >= 0:
            H = G4 // GATES
        else:
            raise SchemaError(f"{NAME}: cannot tell the hidden size from R {list(R)} and xg {list(xg)}")
    require_equal(NAME, "gate rows (4*H)", ("xg[2]", G4), ("R[0]", rows), ("4*H", GATES * H))
    if h0 is not None:
        b, h = require_rank(NAME, "h0", h0, 2)
        require_equal(NAME, "h0 batch", ("h0[0]", b), ("xg[0]", B))
        require_equal(NAME, "h0 hidden", ("h0[1]", h), ("H", H))
    return [(B, T, H), (B, H)]


SCHEMA = OpSchema(
    name=NAME,
    inputs=(
        TensorSpec("xg", 3, "T", dims=("B", "T", "4H"), doc="input part of the gates (x-projection plus biases)"),
        TensorSpec("R", 2, "T", dims=("4H", "H"), doc="recurrent weights of (ff1, ff2, time_a, time_b)"),
        TensorSpec("h0", 2, "float32", optional=True, dims=("B", "H"), doc="initial hidden state"),
    ),
    outputs=(
        TensorSpec("h", 3, "T", dims=("B", "T", "H"), doc="all hidden states"),
        TensorSpec("h_last", 2, "float32", dims=("B", "H"), doc="last hidden state"),
    ),
    attributes={"ts": (float, 1.0)},
    infer_shapes=infer_shapes,
    doc="g = xg_t + h R^T = (g1, g2, ga, gb); h = tanh(g1)*(1-tau) + tau*tanh(g2), tau = sigmoid(ga*ts + gb).",
)
