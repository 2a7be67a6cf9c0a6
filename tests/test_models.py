"""The model zoo: step form equals sequence form, shapes, state naming, config errors, and the
recurrence semantics that the rewrite passes and OPS.md rely on."""

from __future__ import annotations

import re

import pytest
import torch

from framefuse.errors import FrameFuseError
from framefuse.models import ARCHITECTURES, BASE_DEFAULTS, ModelConfigError, StepModule, build_model, default_config
from framefuse.models.delta_net import DeltaNetMixer
from framefuse.models.mamba import selective_scan_ref
from framefuse.models.xlstm import MLSTMMixer

EXPECTED_ARCHS = [
    "attention",
    "delta_net",
    "gated_ssm",
    "gru",
    "jamba",
    "liquid",
    "lstm",
    "mamba",
    "min_gru",
    "min_lstm",
    "xlstm",
]
CATEGORIES = {"rnn", "linear-rnn", "linear-attention", "ssm", "attention", "hybrid", "liquid"}
HEADED = [a for a in EXPECTED_ARCHS if "heads" in default_config(a)]


def small_model(arch: str, seed: int = 0, **overrides):
    """A small model of ``arch``; overrides for keys the arch does not have are dropped."""
    keys = default_config(arch)
    cfg = {"in_features": 10, "out_features": 7, **overrides}
    torch.manual_seed(seed)
    return build_model(arch, {k: v for k, v in cfg.items() if k in keys})


def run_steps(model, x: torch.Tensor, state=None):
    state = model.init_state(x.shape[0]) if state is None else state
    ys = []
    for t in range(x.shape[1]):
        y_t, state = model.step(x[:, t], state)
        ys.append(y_t)
    return torch.stack(ys, dim=1), state


def test_registry_lists_all_seed_architectures():
    assert ARCHITECTURES == EXPECTED_ARCHS


# (embed, T, batch, extra overrides): T = 33 > the default window 32; window 4 makes the KV cache wrap.
STEP_CASES = [
    (24, 1, 1, {}),
    (36, 5, 3, {}),  # embed 36, heads 4: head dim 9
    (48, 33, 3, {}),
    (32, 33, 1, {"window": 4, "kv_heads": 1, "d_conv": 2, "d_state": 8, "expand": 1}),
]


@pytest.mark.parametrize("arch", EXPECTED_ARCHS)
@pytest.mark.parametrize("embed,T,batch,extra", STEP_CASES, ids=lambda c: str(c) if not isinstance(c, dict) else "x")
def test_step_loop_matches_forward(arch, embed, T, batch, extra):
    model = small_model(arch, embed=embed, layers=2, **extra)
    x = torch.randn(batch, T, 10)
    with torch.no_grad():
        y_seq = model(x)
        y_step, _ = run_steps(model, x)
    assert y_seq.shape == (batch, T, 7)
    assert y_step.shape == (batch, T, 7)
    assert torch.isfinite(y_seq).all()
    torch.testing.assert_close(y_step, y_seq, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", EXPECTED_ARCHS)
def test_default_config_model_step_matches_forward(arch):
    torch.manual_seed(0)
    model = build_model(arch)
    assert (model.in_features, model.out_features) == (64, 32)
    x = torch.randn(1, 6, 64)
    with torch.no_grad():
        y_seq = model(x)
        y_step, _ = run_steps(model, x)
    assert y_seq.shape == (1, 6, 32)
    torch.testing.assert_close(y_step, y_seq, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", EXPECTED_ARCHS)
def test_state_from_split_run_continues_the_sequence(arch):
    """Running frames 0..k then k..T from the carried state equals one run over 0..T."""
    model = small_model(arch, embed=24, window=4)
    x = torch.randn(2, 9, 10)
    with torch.no_grad():
        y_all, state_all = run_steps(model, x)
        _, state_mid = run_steps(model, x[:, :4])
        y_rest, state_end = run_steps(model, x[:, 4:], state_mid)
    torch.testing.assert_close(y_rest, y_all[:, 4:], atol=1e-6, rtol=0)
    for a, b in zip(state_end, state_all):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", EXPECTED_ARCHS)
def test_state_names_and_shapes(arch):
    model = small_model(arch, embed=24, layers=3)
    state = model.init_state(3)
    names = model.state_names()
    assert isinstance(state, tuple)
    assert len(names) == len(state) == len(model.state_shapes(3))
    assert len(set(names)) == len(names), names
    for name, tensor, shape in zip(names, state, model.state_shapes(3)):
        assert re.fullmatch(r"l[0-9]+_[A-Za-z0-9_]+", name), name
        assert tensor.dtype == torch.float32
        assert tuple(tensor.shape) == tuple(shape)
        assert not tensor.any(), f"{name} is not zero"
        assert 3 in tensor.shape, f"{name} {tuple(tensor.shape)} has no batch dim"
    # Every layer contributes the same number of states in the non-hybrid models, in layer order.
    layers = [int(n.split("_")[0][1:]) for n in names]
    assert layers == sorted(layers) and set(layers) == {0, 1, 2}
    # A step returns the states with unchanged shapes and dtypes.
    with torch.no_grad():
        y_t, new_state = model.step(torch.randn(3, 10), state)
    assert y_t.shape == (3, 7)
    assert [tuple(s.shape) for s in new_state] == [tuple(s.shape) for s in state]
    assert all(s.dtype == torch.float32 for s in new_state)


def test_state_layouts_of_named_architectures():
    lstm = small_model("lstm", embed=24)
    assert lstm.state_names() == ["l0_h", "l0_c", "l1_h", "l1_c"]
    assert [tuple(s.shape) for s in lstm.init_state(3)] == [(1, 3, 24)] * 4
    mamba = small_model("mamba", embed=24)  # d_inner = 48, d_conv 4, N 16
    assert mamba.state_names() == ["l0_conv", "l0_ssm", "l1_conv", "l1_ssm"]
    assert [tuple(s.shape) for s in mamba.init_state(2)][:2] == [(2, 48, 3), (2, 48, 16)]
    attn = small_model("attention", embed=24)  # heads 4, kv_heads 2, window 32
    assert attn.state_names()[:3] == ["l0_k_cache", "l0_v_cache", "l0_valid"]
    assert [tuple(s.shape) for s in attn.init_state(2)][:3] == [(2, 2, 32, 6), (2, 2, 32, 6), (2, 32)]
    jamba = small_model("jamba", embed=24, layers=4)
    assert jamba.state_names() == [
        "l0_conv",
        "l0_ssm",
        "l1_k_cache",
        "l1_v_cache",
        "l1_valid",
        "l2_conv",
        "l2_ssm",
        "l3_k_cache",
        "l3_v_cache",
        "l3_valid",
    ]
    xl = small_model("xlstm", embed=24)
    assert [tuple(s.shape) for s in xl.init_state(2)][:3] == [(2, 4, 6, 6), (2, 4, 6), (2, 4)]


@pytest.mark.parametrize("arch", EXPECTED_ARCHS)
def test_causal(arch):
    """Changing frame k changes no output before k, and does change output k."""
    model = small_model(arch, embed=24)
    x = torch.randn(1, 8, 10)
    x2 = x.clone()
    x2[:, 5] += 1.0
    with torch.no_grad():
        y, y2 = model(x), model(x2)
    torch.testing.assert_close(y2[:, :5], y[:, :5], atol=0, rtol=0)
    assert (y2[:, 5] - y[:, 5]).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ["attention"])
def test_sliding_window_forgets_frames_older_than_window(arch):
    """One attention layer, window W: query i sees keys i−W < j ≤ i only."""
    window = 4
    model = small_model(arch, embed=24, layers=1, window=window)
    x = torch.randn(1, 12, 10)
    x2 = x.clone()
    x2[:, 2] += 1.0
    with torch.no_grad():
        diff = (model(x2) - model(x)).abs().amax(dim=(0, 2))
        step_diff = (run_steps(model, x2)[0] - run_steps(model, x)[0]).abs().amax(dim=(0, 2))
    for d in (diff, step_diff):
        assert (d[2 : 2 + window] > 1e-5).all()  # frames 2..5 see frame 2
        assert (d[2 + window :] == 0).all()  # frame 6 onwards does not
        assert (d[:2] == 0).all()


@pytest.mark.parametrize("arch", EXPECTED_ARCHS)
def test_deterministic_given_seed_and_eval_fp32(arch):
    a, b = small_model(arch, seed=3, embed=24), small_model(arch, seed=3, embed=24)
    c = small_model(arch, seed=4, embed=24)
    assert not a.training
    assert all(p.dtype == torch.float32 for p in a.parameters())
    x = torch.randn(2, 4, 10)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
        assert not torch.equal(a(x), c(x))
    assert type(a).category in CATEGORIES
    assert type(a).arch == arch


@pytest.mark.parametrize("arch", EXPECTED_ARCHS)
def test_default_config(arch):
    cfg = default_config(arch)
    for key, value in BASE_DEFAULTS.items():
        assert cfg[key] == value
    assert (cfg["embed"], cfg["layers"], cfg["in_features"], cfg["out_features"]) == (256, 2, 64, 32)
    cfg["embed"] = 999  # a copy: mutating it does not change the defaults
    assert default_config(arch)["embed"] == 256
    # config then overrides, both applied; the model records its full config.
    torch.manual_seed(0)
    model = build_model(arch, {"embed": 16, "layers": 3}, layers=1, in_features=5)
    assert model.config == {**default_config(arch), "embed": 16, "layers": 1, "in_features": 5}
    assert len(model.blocks) == 1
    # A config that names its own arch is accepted; another arch is an error.
    build_model(arch, {"arch": arch, "embed": 16})
    other = "gru" if arch != "gru" else "lstm"
    with pytest.raises(ModelConfigError, match="arch"):
        build_model(arch, {"arch": other})


def test_arch_specific_defaults():
    assert {k: default_config("mamba")[k] for k in ("d_state", "d_conv", "expand", "dt_rank")} == {
        "d_state": 16,
        "d_conv": 4,
        "expand": 2,
        "dt_rank": "auto",
    }
    assert {k: default_config("attention")[k] for k in ("heads", "kv_heads", "window")} == {
        "heads": 4,
        "kv_heads": 2,
        "window": 32,
    }
    assert default_config("delta_net")["heads"] == 4 and default_config("xlstm")["heads"] == 4
    assert set(default_config("jamba")) >= set(default_config("mamba")) | set(default_config("attention"))
    assert set(default_config("lstm")) == set(BASE_DEFAULTS)
    torch.manual_seed(0)
    m = build_model("mamba")
    mixer = m.blocks[0].mixer
    assert (mixer.d_inner, mixer.dt_rank, mixer.d_state, mixer.d_conv) == (512, 16, 16, 4)
    torch.testing.assert_close(-torch.exp(mixer.A_log.detach()), -torch.arange(1, 17).float().expand(512, 16))


def test_unknown_arch_error_lists_valid_names():
    with pytest.raises(FrameFuseError) as err:
        build_model("transformer_xl")
    msg = str(err.value)
    assert "transformer_xl" in msg
    for arch in EXPECTED_ARCHS:
        assert arch in msg
    with pytest.raises(FrameFuseError, match="min_gru"):
        default_config("nope")


def test_unknown_config_key_is_an_error():
    with pytest.raises(ModelConfigError, match=r"unknown config key\(s\) \['hidden'\]"):
        build_model("gru", hidden=8)
    with pytest.raises(ModelConfigError, match="window"):
        build_model("mamba", window=8)  # mamba has no window


@pytest.mark.parametrize("key,value", [("embed", 0), ("layers", -1), ("in_features", 2.5), ("out_features", True)])
def test_invalid_base_values(key, value):
    with pytest.raises(ModelConfigError, match=key):
        build_model("min_gru", **{key: value})


@pytest.mark.parametrize("arch", HEADED)
def test_embed_not_multiple_of_heads(arch):
    with pytest.raises(ModelConfigError, match=r"embed=30 is not a multiple of heads=4"):
        build_model(arch, embed=30)
    torch.manual_seed(0)
    model = build_model(arch, embed=36, heads=4)  # head dim 9 is fine
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64)).shape == (1, 3, 32)


def test_other_invalid_arch_values():
    with pytest.raises(ModelConfigError, match="kv_heads=3"):
        build_model("attention", heads=4, kv_heads=3)
    with pytest.raises(ModelConfigError, match="d_conv"):
        build_model("mamba", d_conv=1)
    with pytest.raises(ModelConfigError, match="dt_rank"):
        build_model("jamba", dt_rank=0)
    with pytest.raises(ModelConfigError, match="timespan"):
        build_model("liquid", timespan=-1.0)
    with pytest.raises(ModelConfigError, match="window"):
        build_model("attention", window=0)


def test_wrong_input_shapes_are_errors():
    model = small_model("min_gru", embed=8)
    with pytest.raises(ModelConfigError, match=r"\[B, T, 10\]"):
        model(torch.randn(1, 4, 9))
    with pytest.raises(ModelConfigError, match=r"\[B, 10\]"):
        model.step(torch.randn(1, 4, 10), model.init_state(1))
    with pytest.raises(ModelConfigError, match="2 state tensors"):
        model.step(torch.randn(1, 10), model.init_state(1)[:1])


def test_step_module_wraps_step_for_export():
    model = small_model("lstm", embed=8)
    state = model.init_state(2)
    x_t = torch.randn(2, 10)
    with torch.no_grad():
        out = StepModule(model)(x_t, *state)
        y_t, new_state = model.step(x_t, state)
    assert len(out) == 1 + len(state)
    torch.testing.assert_close(out[0], y_t)
    for a, b in zip(out[1:], new_state):
        torch.testing.assert_close(a, b)


# -- recurrence semantics (what OPS.md and the rewrite passes rely on) -----------------------------


def test_selective_scan_ref_matches_ops_md_formula():
    """h_t[d,n] = exp(Δ_t[d]A[d,n]) h_{t−1}[d,n] + Δ_t[d] B_t[n] x_t[d]; y = Σ_n C h + D x, ⊙ silu(z)."""
    g = torch.Generator().manual_seed(0)
    b, d, n, length = 2, 3, 4, 6
    u, delta, z = (torch.randn(b, d, length, generator=g, dtype=torch.float64) for _ in range(3))
    delta = torch.nn.functional.softplus(delta)
    A = -torch.rand(d, n, generator=g, dtype=torch.float64)
    B, C = (torch.randn(b, n, length, generator=g, dtype=torch.float64) for _ in range(2))
    D = torch.randn(d, generator=g, dtype=torch.float64)
    h0 = torch.randn(b, d, n, generator=g, dtype=torch.float64)
    y, h_last = selective_scan_ref(u, delta, A, B, C, D, z=z, h0=h0)
    for bi in range(b):
        for di in range(d):
            h = h0[bi, di].clone()
            for t in range(length):
                h = torch.exp(delta[bi, di, t] * A[di]) * h + delta[bi, di, t] * B[bi, :, t] * u[bi, di, t]
                expect = (C[bi, :, t] * h).sum() + D[di] * u[bi, di, t]
                expect = expect * torch.nn.functional.silu(z[bi, di, t])
                torch.testing.assert_close(y[bi, di, t], expect)
            torch.testing.assert_close(h_last[bi, di], h)


def test_delta_rule_is_the_ops_md_update():
    """S_t = S_{t−1}(I − β k kᵀ) + β v kᵀ, o_t = S_t q_t with S [Dv, Dk]."""
    g = torch.Generator().manual_seed(1)
    b, h, length, d = 2, 3, 5, 4
    q, k, v = (torch.randn(b, h, length, d, generator=g, dtype=torch.float64) for _ in range(3))
    beta = torch.rand(b, h, length, generator=g, dtype=torch.float64)
    S0 = torch.randn(b, h, d, d, generator=g, dtype=torch.float64)
    o, S_last = DeltaNetMixer.delta_rule(q, k, v, beta, S0)
    S = S0
    eye = torch.eye(d, dtype=torch.float64)
    for t in range(length):
        kt, vt, bt = k[:, :, t, :, None], v[:, :, t, :, None], beta[:, :, t, None, None]
        S = S @ (eye - bt * kt @ kt.transpose(-1, -2)) + bt * vt @ kt.transpose(-1, -2)
        torch.testing.assert_close(o[:, :, t], (S @ q[:, :, t, :, None]).squeeze(-1))
    torch.testing.assert_close(S_last, S)


def test_mlstm_stabilised_scan_equals_unstabilised_form():
    """With C̃ = C·exp(−m), the stabilised recurrence equals the plain exponential-gated one:
    C_t = σ(f) C + exp(i) v kᵀ, n_t = σ(f) n + exp(i) k, h = C q / max(|nᵀ q|, 1)."""
    g = torch.Generator().manual_seed(2)
    b, h, length, d = 2, 2, 7, 3
    q, k, v = (torch.randn(b, h, length, d, generator=g, dtype=torch.float64) for _ in range(3))
    i_pre = 2 * torch.randn(b, h, length, generator=g, dtype=torch.float64)
    f_pre = 2 * torch.randn(b, h, length, generator=g, dtype=torch.float64)
    zeros = torch.zeros
    hs, C_s, n_s, m_s = MLSTMMixer.mlstm_scan(
        q,
        k,
        v,
        i_pre,
        f_pre,
        zeros(b, h, d, d, dtype=torch.float64),
        zeros(b, h, d, dtype=torch.float64),
        zeros(b, h, dtype=torch.float64),
    )
    C = zeros(b, h, d, d, dtype=torch.float64)
    n = zeros(b, h, d, dtype=torch.float64)
    for t in range(length):
        f = torch.sigmoid(f_pre[:, :, t])[..., None]
        i = torch.exp(i_pre[:, :, t])[..., None]
        C = f[..., None] * C + i[..., None] * (v[:, :, t, :, None] @ k[:, :, t, None, :])
        n = f * n + i * k[:, :, t]
        qt = q[:, :, t]
        expect = (C @ qt[..., None]).squeeze(-1) / torch.clamp((n * qt).sum(-1).abs(), min=1.0)[..., None]
        torch.testing.assert_close(hs[:, :, t], expect)
    torch.testing.assert_close(C_s * torch.exp(m_s)[..., None, None], C)
    torch.testing.assert_close(n_s * torch.exp(m_s)[..., None], n)


@pytest.mark.parametrize("arch", ["min_gru", "min_lstm", "gated_ssm"])
def test_linear_rnn_mixers_are_affine_in_h(arch):
    """The LinearScan contract: one step is h ↦ a ⊙ h + b with a, b depending on x only."""
    model = small_model(arch, embed=8)
    mixer = model.blocks[0].mixer
    x_t = torch.randn(2, 8, dtype=torch.float64)
    mixer = mixer.double()
    h0 = torch.zeros(2, 8, dtype=torch.float64)
    h1, h2 = torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad():
        b = mixer.step(x_t, (h0,))[1][0]
        a_h1 = mixer.step(x_t, (h1,))[1][0] - b
        a_h2 = mixer.step(x_t, (h2,))[1][0] - b
    a1, a2 = a_h1 / h1, a_h2 / h2
    torch.testing.assert_close(a1, a2)  # the same elementwise decay for any h
    assert ((a1 > 0) & (a1 < 1)).all()
