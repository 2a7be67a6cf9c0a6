"""Reference LSTMSeq: a plain loop over time in torch, ONNX LSTM semantics (ground truth)."""

from __future__ import annotations

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 when given float64, else float32 (the reference always computes in full precision)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def reference(X, W, R, bias=None, h0=None, c0=None):
    """X [T,B,I], W [4H,I], R [4H,H], bias [8H] (Wb then Rb), h0/c0 [B,H] → (Y [T,B,H], h_last, c_last).

    Gate order i, o, f, c (ONNX). Y in X's dtype; states in float32 (float64 for float64 input).
    """
    cd = compute_dtype(X)
    T, B, _ = X.shape
    H = R.shape[1]
    x, w, r = X.to(cd), W.to(cd), R.to(cd)
    if bias is None:
        wb = rb = torch.zeros(4 * H, dtype=cd, device=X.device)
    else:
        wb, rb = bias.to(cd)[: 4 * H], bias.to(cd)[4 * H :]
    h = torch.zeros(B, H, dtype=cd, device=X.device) if h0 is None else h0.to(cd)
    c = torch.zeros(B, H, dtype=cd, device=X.device) if c0 is None else c0.to(cd)
    ys = []
    for t in range(T):
        gates = x[t] @ w.T + wb + h @ r.T + rb
        i, o, f, g = gates.split(H, dim=-1)
        i, o, f, g = torch.sigmoid(i), torch.sigmoid(o), torch.sigmoid(f), torch.tanh(g)
        c = f * c + i * g
        h = o * torch.tanh(c)
        ys.append(h)
    Y = torch.stack(ys) if ys else torch.zeros(0, B, H, dtype=cd, device=X.device)
    return Y.to(X.dtype), h.clone(), c.clone()
