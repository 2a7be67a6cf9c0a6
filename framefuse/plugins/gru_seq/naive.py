"""Reference GRUSeq: a plain loop over time in torch, ONNX GRU semantics with
linear_before_reset = 1 (ground truth)."""

from __future__ import annotations

import torch

from framefuse.plugins.lstm_seq.naive import compute_dtype


def reference(X, W, R, bias=None, h0=None):
    """X [T,B,I], W [3H,I], R [3H,H], bias [6H] (Wb then Rb), h0 [B,H] → (Y [T,B,H], h_last).

    Gate order z, r, h (ONNX); n = tanh(W_h x + Wb_h + r * (R_h h + Rb_h)); h' = (1-z) n + z h.
    """
    cd = compute_dtype(X)
    T, B, _ = X.shape
    H = R.shape[1]
    x, w, r = X.to(cd), W.to(cd), R.to(cd)
    if bias is None:
        wb = rb = torch.zeros(3 * H, dtype=cd, device=X.device)
    else:
        wb, rb = bias.to(cd)[: 3 * H], bias.to(cd)[3 * H :]
    h = torch.zeros(B, H, dtype=cd, device=X.device) if h0 is None else h0.to(cd)
    ys = []
    for t in range(T):
        xz, xr, xh = (x[t] @ w.T + wb).split(H, dim=-1)
        hz, hr, hh = (h @ r.T + rb).split(H, dim=-1)
        z = torch.sigmoid(xz + hz)
        rg = torch.sigmoid(xr + hr)
        n = torch.tanh(xh + rg * hh)
        h = (1 - z) * n + z * h
        ys.append(h)
    Y = torch.stack(ys) if ys else torch.zeros(0, B, H, dtype=cd, device=X.device)
    return Y.to(X.dtype), h.clone()
