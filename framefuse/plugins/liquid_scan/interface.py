"""LiquidScan on the GPU: the persistent recurrent kernel (lstm_seq/persistent_rnn.cuh) reading the
precomputed input part xg directly. Never synchronises."""

from __future__ import annotations

import math
import pathlib

from framefuse.plugins import checks
from framefuse.plugins.liquid_scan.schema import SCHEMA
from framefuse.plugins.lstm_seq import persistent

SOURCE = pathlib.Path(__file__).resolve().parent / "liquid_scan.cu"
OP = SCHEMA.name


def _check_attrs(attrs) -> None:
    if not math.isfinite(attrs["ts"]):
        raise checks.OpArgumentError(f"{OP}: attribute ts={attrs['ts']!r} must be finite")


def launch(inputs, attrs=None, outputs=None, stream=None):
    """LiquidScan on the GPU. inputs: (xg [B,T,4H], R [4H,H], h0 [B,H] f32 | None); attrs: ts.
    outputs (h [B,T,H], h_last [B,H] f32) are allocated unless given."""
    call = checks.prepare(SCHEMA, inputs, attrs, outputs, attr_rule=_check_attrs)
    ts = call.attrs["ts"]
    xg, R, h0 = call.inputs
    outputs = call.outputs
    B, T, H = (call.dims[n] for n in ("B", "T", "H"))
    if B < 1 or H < 1:
        raise checks.OpArgumentError(f"{OP}: B and H must be >= 1, got B={B} H={H}")
    persistent.launch_recurrence(
        OP,
        SOURCE,
        "liquid_scan",
        4,
        xg=xg,
        xg_sb=T * 4 * H,
        xg_st=4 * H,
        R=R,
        bias=None,
        h0=h0,
        c0=None,
        y=outputs[0],
        y_sb=T * H,
        y_st=H,
        h_last=outputs[1],
        c_last=None,
        T=T,
        B=B,
        H=H,
        ts=ts,
        stream=stream,
    )
    return outputs


def liquid_scan(xg, R, h0=None, *, ts=1.0, out=None, stream=None):
    """(h [B,T,H], h_last [B,H]) of the CfC liquid cell on CUDA tensors."""
    return tuple(launch([xg, R, h0], {"ts": ts}, out, stream))
