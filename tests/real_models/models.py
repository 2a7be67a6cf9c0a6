"""Models written by others, in small random configs (hidden 64, 2 layers, no downloads).

Each entry builds a module taking ``x [B, T, F]`` (float, used as ``inputs_embeds`` for
transformers models) and returning one tensor (``last_hidden_state``), with ``use_cache=False``.
Construction is seeded so the T=8 and T=16 exports carry the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

HIDDEN = 64
LAYERS = 2
BATCH = 1


@dataclass(frozen=True)
class RealModel:
    name: str
    build: Callable[[], nn.Module]
    #: framefuse ops the fused graph must contain (op_type -> at least this many nodes).
    expected_ops: dict
    features: int = HIDDEN


class HFWrapper(nn.Module):
    """``x [B, T, F]`` → ``last_hidden_state``; ``mask=True`` passes an all-ones attention mask
    built from x's shape, so the exporter sees the model's own mask code."""

    def __init__(self, model: nn.Module, *, mask: bool = False):
        super().__init__()
        self.model = model.eval()
        self.mask = mask

    def forward(self, x):
        kwargs = {"inputs_embeds": x, "use_cache": False}
        if self.mask:
            kwargs["attention_mask"] = torch.ones(x.shape[0], x.shape[1], dtype=torch.long)
        return self.model(**kwargs).last_hidden_state


class TorchAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(HIDDEN, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class TorchRNN(nn.Module):
    def __init__(self, cell: type[nn.Module]):
        super().__init__()
        self.rnn = cell(HIDDEN, 32, num_layers=LAYERS, batch_first=True, bidirectional=True)

    def forward(self, x):
        return self.rnn(x)[0]


class GRUCellPolicy(nn.Module):
    """A recurrent policy as game-AI code writes it: nn.GRUCell layers stepped in a Python loop
    from a zero state, the top layer's hidden state at every frame returned."""

    def __init__(self):
        super().__init__()
        self.cells = nn.ModuleList(nn.GRUCell(HIDDEN if i == 0 else 32, 32) for i in range(LAYERS))

    def forward(self, x):
        hs = [x.new_zeros(x.shape[0], 32) for _ in self.cells]
        ys = []
        for t in range(x.shape[1]):
            inp = x[:, t]
            for i, cell in enumerate(self.cells):
                hs[i] = cell(inp, hs[i])
                inp = hs[i]
            ys.append(inp)
        return torch.stack(ys, dim=1)


class BiGRUCellEncoder(nn.Module):
    """A bidirectional encoder as research code writes it by hand: one nn.GRUCell over the frames
    forwards, another over them backwards, the two hidden states concatenated per frame."""

    def __init__(self):
        super().__init__()
        self.fwd, self.bwd = nn.GRUCell(HIDDEN, 32), nn.GRUCell(HIDDEN, 32)

    def forward(self, x):
        steps = x.shape[1]
        h_f = x.new_zeros(x.shape[0], 32)
        h_b = x.new_zeros(x.shape[0], 32)
        fwd, bwd = [], [None] * steps
        for t in range(steps):
            h_f = self.fwd(x[:, t], h_f)
            fwd.append(h_f)
        for t in reversed(range(steps)):
            h_b = self.bwd(x[:, t], h_b)
            bwd[t] = h_b
        return torch.cat([torch.stack(fwd, dim=1), torch.stack(bwd, dim=1)], dim=-1)


class ChunkDeltaRuleLayer(nn.Module):
    """A DeltaNet layer whose scan is flash-linear-attention's chunked reference (WY form: a
    row-by-row solve inside each chunk of 4, a loop over the chunks), with its own projections,
    unit keys and sigmoid β."""

    def __init__(self, heads: int = 2, head_dim: int = 16, chunk: int = 4):
        super().__init__()
        self.heads, self.head_dim, self.chunk = heads, head_dim, chunk
        self.qkv = nn.Linear(HIDDEN, 3 * heads * head_dim, bias=False)
        self.beta = nn.Linear(HIDDEN, heads)
        self.out = nn.Linear(heads * head_dim, 32)

    def forward(self, x):
        b, length, _ = x.shape
        h, d, c = self.heads, self.head_dim, self.chunk
        q, k, v = (t.reshape(b, length, h, d).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        k = nn.functional.normalize(k, dim=-1)
        beta = torch.sigmoid(self.beta(x)).transpose(1, 2)
        q = q * d**-0.5
        v = v * beta[..., None]
        k_beta = k * beta[..., None]
        q, k, v, k_beta = (t.reshape(b, h, length // c, c, d) for t in (q, k, v, k_beta))
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=0)
        attn = -(k_beta @ k.transpose(-1, -2)).masked_fill(mask, 0)
        for i in range(1, c):
            attn[..., i, :i] = attn[..., i, :i] + (attn[..., i, :, None].clone() * attn[..., :, :i].clone()).sum(-2)
        attn = attn + torch.eye(c, dtype=torch.float)
        u, w = attn @ v, attn @ k_beta
        state = k.new_zeros(b, h, d, d)
        o = torch.zeros_like(v)
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=1)
        for i in range(length // c):
            q_i, k_i = q[:, :, i], k[:, :, i]
            u_i = u[:, :, i] - w[:, :, i] @ state
            o[:, :, i] = q_i @ state + (q_i @ k_i.transpose(-1, -2)).masked_fill(mask, 0) @ u_i
            state = state + k_i.transpose(-1, -2) @ u_i
        return self.out(o.reshape(b, h, length, d).transpose(1, 2).reshape(b, length, h * d))


class ChunkGatedDeltaRuleLayer(nn.Module):
    """A Gated DeltaNet layer (as Qwen3-Next and fla's GatedDeltaNet write it: unit q and k,
    sigmoid β, log-decay g = −exp(A)·softplus(a(x) + dt_bias)) whose scan is the chunked gated
    delta rule of fla's reference ``chunk_gated_delta_rule``: g summed inside each chunk of 4
    weights a row-by-row solve, then a loop over the chunks carries the decayed state."""

    def __init__(self, heads: int = 2, head_dim: int = 16, chunk: int = 4):
        super().__init__()
        self.heads, self.head_dim, self.chunk = heads, head_dim, chunk
        self.qkv = nn.Linear(HIDDEN, 3 * heads * head_dim, bias=False)
        self.beta = nn.Linear(HIDDEN, heads)
        self.a = nn.Linear(HIDDEN, heads, bias=False)
        self.a_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, heads)))
        self.dt_bias = nn.Parameter(torch.linspace(-1.0, 0.5, heads))
        self.out = nn.Linear(heads * head_dim, 32)

    def forward(self, x):
        b, length, _ = x.shape
        h, d, c = self.heads, self.head_dim, self.chunk
        q, k, v = (t.reshape(b, length, h, d).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = nn.functional.normalize(q, dim=-1), nn.functional.normalize(k, dim=-1)
        beta = torch.sigmoid(self.beta(x)).transpose(1, 2)
        g = (-self.a_log.exp() * nn.functional.softplus(self.a(x) + self.dt_bias)).transpose(1, 2)
        q = q * d**-0.5
        v = v * beta[..., None]
        k_beta = k * beta[..., None]
        q, k, v, k_beta = (t.reshape(b, h, length // c, c, d) for t in (q, k, v, k_beta))
        decay = g.reshape(b, h, length // c, c).cumsum(-1)
        decay_mask = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).tril().exp().tril()
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=0)
        attn = -((k_beta @ k.transpose(-1, -2)) * decay_mask).masked_fill(mask, 0)
        for i in range(1, c):
            attn[..., i, :i] = attn[..., i, :i] + (attn[..., i, :, None].clone() * attn[..., :, :i].clone()).sum(-2)
        attn = attn + torch.eye(c, dtype=torch.float)
        u, w = attn @ v, attn @ (k_beta * decay.exp().unsqueeze(-1))
        state = k.new_zeros(b, h, d, d)
        o = torch.zeros_like(v)
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=1)
        for i in range(length // c):
            q_i, k_i, g_i = q[:, :, i], k[:, :, i], decay[:, :, i]
            v_new = u[:, :, i] - w[:, :, i] @ state
            inner = (q_i @ k_i.transpose(-1, -2) * decay_mask[:, :, i]).masked_fill(mask, 0)
            o[:, :, i] = (q_i * g_i[..., None].exp()) @ state + inner @ v_new
            last = g_i[..., -1, None]
            state = state * last[..., None].exp() + (k_i * (last - g_i).exp()[..., None]).transpose(-1, -2) @ v_new
        return self.out(o.reshape(b, h, length, d).transpose(1, 2).reshape(b, length, h * d))


class ChunkGLALayer(nn.Module):
    """A gated linear attention layer as fla's GatedLinearAttention writes it (a low-rank key gate
    g = logsigmoid(W₂ W₁ x) / 16 a key dimension, a SiLU output gate) whose scan is the chunked
    form: cumulative log-gates inside each chunk of 4 weight the intra-chunk attention, a loop over
    the chunks carries the decayed state."""

    def __init__(self, heads: int = 2, key_dim: int = 8, value_dim: int = 16, chunk: int = 4):
        super().__init__()
        self.heads, self.key_dim, self.value_dim, self.chunk = heads, key_dim, value_dim, chunk
        self.q = nn.Linear(HIDDEN, heads * key_dim, bias=False)
        self.k = nn.Linear(HIDDEN, heads * key_dim, bias=False)
        self.v = nn.Linear(HIDDEN, heads * value_dim, bias=False)
        self.gate_low = nn.Linear(HIDDEN, 16, bias=False)
        self.gate = nn.Linear(16, heads * key_dim)
        self.out_gate = nn.Linear(HIDDEN, heads * value_dim, bias=False)
        self.out = nn.Linear(heads * value_dim, 32)

    def forward(self, x):
        b, length, _ = x.shape
        h, dk, dv, c = self.heads, self.key_dim, self.value_dim, self.chunk

        def heads_of(t, d):
            return t.reshape(b, length, h, d).transpose(1, 2)

        q, k, v = heads_of(self.q(x), dk), heads_of(self.k(x), dk), heads_of(self.v(x), dv)
        g = heads_of(nn.functional.logsigmoid(self.gate(self.gate_low(x))) / 16, dk)
        q = q * dk**-0.5
        q, k, v, g = (t.reshape(b, h, length // c, c, t.shape[-1]) for t in (q, k, v, g))
        g = g.cumsum(-2)
        state = k.new_zeros(b, h, dk, dv)
        o = torch.zeros_like(v)
        mask = torch.triu(torch.ones(c, c, dtype=torch.bool), diagonal=1)
        for i in range(length // c):
            g_i = g[:, :, i]
            last = g_i[:, :, -1:]
            q_i = q[:, :, i] * g_i.exp()
            attn = (q_i @ (k[:, :, i] * (-g_i).exp()).transpose(-1, -2)).masked_fill(mask, 0)
            o[:, :, i] = q_i @ state + attn @ v[:, :, i]
            state = (
                state * last.transpose(-1, -2).exp() + (k[:, :, i] * (last - g_i).exp()).transpose(-1, -2) @ v[:, :, i]
            )
        o = o.reshape(b, h, length, dv).transpose(1, 2).reshape(b, length, h * dv)
        return self.out(o * nn.functional.silu(self.out_gate(x)))


class RNNCellPolicy(GRUCellPolicy):
    """The same policy with nn.RNNCell layers (tanh, then relu): an Elman cell, for which framefuse
    has no fused op, so the export's T copies of each cell stay in the fused graph."""

    def __init__(self):
        nn.Module.__init__(self)
        self.cells = nn.ModuleList(
            nn.RNNCell(HIDDEN if i == 0 else 32, 32, nonlinearity="tanh" if i == 0 else "relu") for i in range(LAYERS)
        )


class MLPCellPolicy(nn.Module):
    """A recurrent policy whose cell no fused op or Recur cell is: an MLP over [x_t, h] with a
    LayerNorm, mixed into h by an update gate (h = z·h + (1 − z)·cand), stepped in a Python loop
    from a zero state. The export's copies of the cell stay in the fused graph; the step compiler's
    interpreter rolls them into one loop over the body (compiler/simplify.RollBodies)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(HIDDEN + 32, 64)
        self.out = nn.Linear(64, 32)
        self.gate = nn.Linear(HIDDEN + 32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 32)
        outs = []
        for t in range(x.shape[1]):
            xh = torch.cat([x[:, t], h], -1)
            z = torch.sigmoid(self.gate(xh))
            cand = torch.tanh(self.norm(self.out(torch.relu(self.inp(xh)))))
            h = z * h + (1 - z) * cand
            outs.append(h)
        return torch.stack(outs, 1)


class LayerNormLSTMPolicy(nn.Module):
    """A layer-normalised LSTM cell written by hand (as RL agents write it: a LayerNorm over the
    gates' pre-activations and one over c before its tanh), stepped in a Python loop from zeros.
    No fused op matches it; its copies carry two values, h and c, which the step compiler rolls into
    one loop carrying both (compiler/simplify.RollBodies)."""

    def __init__(self):
        super().__init__()
        self.ih = nn.Linear(HIDDEN, 4 * 32)
        self.hh = nn.Linear(32, 4 * 32, bias=False)
        self.norm_gates = nn.LayerNorm(4 * 32)
        self.norm_c = nn.LayerNorm(32)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 32)
        c = x.new_zeros(x.shape[0], 32)
        outs = []
        for t in range(x.shape[1]):
            i, f, g, o = self.norm_gates(self.ih(x[:, t]) + self.hh(h)).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(self.norm_c(c))
            outs.append(h)
        return torch.stack(outs, 1)


class LSTMCellPolicy(nn.Module):
    """The same policy with nn.LSTMCell layers: two states (h, c) a layer carried by the loop."""

    def __init__(self):
        super().__init__()
        self.cells = nn.ModuleList(nn.LSTMCell(HIDDEN if i == 0 else 32, 32) for i in range(LAYERS))

    def forward(self, x):
        hs = [x.new_zeros(x.shape[0], 32) for _ in self.cells]
        cs = [x.new_zeros(x.shape[0], 32) for _ in self.cells]
        ys = []
        for t in range(x.shape[1]):
            inp = x[:, t]
            for i, cell in enumerate(self.cells):
                hs[i], cs[i] = cell(inp, (hs[i], cs[i]))
                inp = hs[i]
            ys.append(inp)
        return torch.stack(ys, dim=1)


class MinGRULogSpace(nn.Module):
    """minGRU in its parallel (training) form as its paper's code writes it: the whole sequence
    at once from the logs of the coefficients, ``logcumsumexp`` of a cumulative sum (the "heinsen"
    scan), from h_0 = 0 or (``initial``) from a learned h_0 as the paper's code pads it in; a Linear
    head on top. The TorchScript exporter refuses logcumsumexp."""

    def __init__(self, initial: bool = False):
        super().__init__()
        self.gates = nn.Linear(HIDDEN, 2 * 32)
        self.head = nn.Linear(32, 32)
        self.h_0 = nn.Parameter(torch.randn(32)) if initial else None

    @staticmethod
    def _log_g(x):
        return torch.where(x >= 0, (torch.relu(x) + 0.5).log(), -nn.functional.softplus(-x))

    def forward(self, x):
        k, h_tilde = self.gates(x).chunk(2, dim=-1)
        log_coeffs = -nn.functional.softplus(k)  # log(1 - z)
        log_values = -nn.functional.softplus(-k) + self._log_g(h_tilde)  # log(z * g(h~))
        if self.h_0 is None:
            a_star = torch.cumsum(log_coeffs, dim=1)
            h = torch.exp(a_star + torch.logcumsumexp(log_values - a_star, dim=1))
            return self.head(h)
        log_h_0 = self._log_g(self.h_0).expand(x.shape[0], 1, -1)
        a_star = nn.functional.pad(torch.cumsum(log_coeffs, dim=1), (0, 0, 1, 0))
        log_h = a_star + torch.logcumsumexp(torch.cat([log_h_0, log_values], dim=1) - a_star, dim=1)
        return self.head(torch.exp(log_h)[:, 1:])


def _hf(model_cls: str, config_cls: str, *, attn: str | None = None, mask: bool = False, **config):
    def build() -> nn.Module:
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_cls)(**config)
        if attn is not None:
            cfg._attn_implementation = attn
        model = getattr(transformers, model_cls)(cfg)
        if attn is not None:
            model.config._attn_implementation = attn
        return HFWrapper(model, mask=mask)

    return build


def _seeded(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return factory().eval()

    return build


_COMMON = {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "vocab_size": 32}
_ATTN = {**_COMMON, "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 64}
_GQA = {**_ATTN, "num_key_value_heads": 2}
_GPT2 = {"n_embd": HIDDEN, "n_layer": LAYERS, "n_head": 4, "n_positions": 64, "vocab_size": 32}
_MAMBA = {**_COMMON, "state_size": 8, "expand": 2, "conv_kernel": 4}

MODELS: list[RealModel] = [
    RealModel("mamba", _hf("MambaModel", "MambaConfig", **_MAMBA), {"SelectiveScan": LAYERS}),
    RealModel("falcon_mamba", _hf("FalconMambaModel", "FalconMambaConfig", **_MAMBA), {"SelectiveScan": LAYERS}),
    RealModel(
        "mamba2",
        _hf(
            "Mamba2Model",
            "Mamba2Config",
            **_COMMON,
            state_size=8,
            expand=2,
            num_heads=8,
            head_dim=16,
            n_groups=1,
            chunk_size=8,
        ),
        {"SelectiveScan": LAYERS},
    ),
    # Mamba2 layers (the chunked SSD form) beside attention: Zamba2's shared attention blocks, Bamba
    RealModel(
        "zamba2",
        _hf(
            "Zamba2Model",
            "Zamba2Config",
            **_COMMON,
            layers_block_type=["linear_attention", "hybrid"],
            hybrid_layer_ids=[1],
            mamba_d_state=8,
            n_mamba_heads=8,
            mamba_ngroups=1,
            chunk_size=8,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=4,
            use_mamba_kernels=False,
            max_position_embeddings=64,
            use_mem_rope=False,
        ),
        {"SelectiveScan": 2, "Attention": 1},
    ),
    RealModel(
        "bamba",
        _hf(
            "BambaModel",
            "BambaConfig",
            **_COMMON,
            attn_layer_indices=[1],
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_n_groups=1,
            mamba_d_state=8,
            mamba_chunk_size=8,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
        {"SelectiveScan": 1, "Attention": 1},
    ),
    RealModel(
        "jamba",
        _hf(
            "JambaModel",
            "JambaConfig",
            **_GQA,
            num_experts=1,
            num_experts_per_tok=1,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=8,
            mamba_expand=2,
            mamba_dt_rank=8,
            use_mamba_kernels=False,
        ),
        {"SelectiveScan": 1, "Attention": 1},
    ),
    *[
        RealModel(
            f"gpt2_{attn}{'_mask' if mask else ''}",
            _hf("GPT2Model", "GPT2Config", attn=attn, mask=mask, **_GPT2),
            {"Attention": LAYERS},
        )
        for attn in ("sdpa", "eager")
        for mask in (False, True)
    ],
    *[
        RealModel(
            f"{family}_gqa_{attn}",
            _hf(f"{family.capitalize()}Model", f"{family.capitalize()}Config", attn=attn, **_GQA),
            {"Attention": LAYERS},
        )
        for family in ("llama", "qwen2")
        for attn in ("sdpa", "eager")
    ],
    RealModel(
        "xlstm",
        _hf(
            "xLSTMModel",
            "xLSTMConfig",
            hidden_size=HIDDEN,
            embedding_dim=HIDDEN,
            num_hidden_layers=LAYERS,
            num_blocks=LAYERS,
            num_heads=4,
            vocab_size=32,
            mode="inference",
            autocast_kernel_dtype="float32",
            inference_state_dtype="float32",
        ),
        {"MLSTMScan": LAYERS},
    ),
    RealModel(
        "rwkv",
        _hf(
            "RwkvModel", "RwkvConfig", **_COMMON, attention_hidden_size=HIDDEN, intermediate_size=128, context_length=64
        ),
        {"WKVScan": LAYERS},
    ),
    RealModel("torch_mha", _seeded(TorchAttention), {"Attention": 1}),
    RealModel("torch_lstm_bidir", _seeded(lambda: TorchRNN(nn.LSTM)), {"LSTMSeq": 2 * LAYERS}),
    RealModel("torch_gru_bidir", _seeded(lambda: TorchRNN(nn.GRU)), {"GRUSeq": 2 * LAYERS}),
    # nn.RNN (Elman): ONNX RNN nodes, no fused op (the engine and the step compiler run them as they are)
    RealModel("torch_rnn_bidir", _seeded(lambda: TorchRNN(nn.RNN)), {}),
    RealModel("torch_grucell_loop", _seeded(GRUCellPolicy), {"GRUSeq": LAYERS}),
    RealModel("torch_lstmcell_loop", _seeded(LSTMCellPolicy), {"LSTMSeq": LAYERS}),
    # nn.RNNCell (Elman) in a Python loop: no fused op; the step compiler rolls the copies back into loops
    RealModel("torch_rnncell_loop", _seeded(RNNCellPolicy), {}),
    # an MLP cell with a gate on h, in a Python loop: no fused op; its copies roll into one body loop
    RealModel("torch_mlpcell_loop", _seeded(MLPCellPolicy), {}),
    # a LayerNorm LSTM cell written by hand: no fused op; its copies (h and c carried) roll into one body loop
    RealModel("torch_lnlstm_loop", _seeded(LayerNormLSTMPolicy), {}),
    RealModel("torch_grucell_bidir_loop", _seeded(BiGRUCellEncoder), {"GRUSeq": 2}),
    RealModel("fla_chunk_delta_rule", _seeded(ChunkDeltaRuleLayer), {"DeltaRuleScan": 1}),
    RealModel("fla_chunk_gated_delta_rule", _seeded(ChunkGatedDeltaRuleLayer), {"GatedDeltaRuleScan": 1}),
    RealModel("fla_chunk_gla", _seeded(ChunkGLALayer), {"LinearScan": 1}),
    RealModel("mingru_log_space", _seeded(MinGRULogSpace), {"LinearScan": 1}),
    RealModel("mingru_log_space_h0", _seeded(lambda: MinGRULogSpace(initial=True)), {"LinearScan": 1}),
]

BY_NAME = {m.name: m for m in MODELS}
