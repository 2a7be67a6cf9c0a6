"""Reference LiquidScan: the CfC (closed-form continuous-time) cell as a plain loop over time
(ground truth)."""

from __future__ import annotations

import torch

from framefuse.plugins.lstm_seq.naive import compute_dtype


def reference(xg, R, h0=None, ts=1.0):
    """xg [B,T,4H] (input part of the gates, biases included), R [4H,H], h0 [B,H] → (h [B,T,H], h_last).

    g = xg_t + h R^T split into (g1, g2, ga, gb); ff1 = tanh(g1), ff2 = tanh(g2),
    tau = sigmoid(ga*ts + gb); h_t = ff1*(1 - tau) + tau*ff2.
    """
    cd = compute_dtype(xg)
    B, T, _ = xg.shape
    H = R.shape[1]
    x, r = xg.to(cd), R.to(cd)
    h = torch.zeros(B, H, dtype=cd, device=xg.device) if h0 is None else h0.to(cd)
    hs = []
    for t in range(T):
        g1, g2, ga, gb = (x[:, t] + h @ r.T).split(H, dim=-1)
        ff1, ff2 = torch.tanh(g1), torch.tanh(g2)
        tau = torch.sigmoid(ga * float(ts) + gb)
        h = ff1 * (1 - tau) + tau * ff2
        hs.append(h)
    out = torch.stack(hs, dim=1) if hs else torch.zeros(B, 0, H, dtype=cd, device=xg.device)
    return out.to(xg.dtype), h.clone()
