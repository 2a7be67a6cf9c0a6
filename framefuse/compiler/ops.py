"""The elementwise ops of the step IR: for each, its numpy meaning (the reference interpreter's)
and its C form (the generated kernel's), side by side.

Booleans are float 0/1 (a comparison yields 1.0f or 0.0f, Where tests ``!= 0``), so every value in
a program is a float. Math follows ONNX / torch, NaN included: Max/Min propagate NaN, Relu keeps
it. The C side calls the helpers of ``compiler/runtime.cuh`` (``ffk_*``) and, for the single-step
bodies of framefuse ops, the device functions in ``plugins/<op>/step.cuh`` — the same functions
the op's standalone kernel calls, so the math of a step lives in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"


@dataclass(frozen=True)
class EwSpec:
    arity: int
    numpy: Callable  # (*arrays, params) -> array (float64 in, float64 out)
    c: Callable  # (list of C operand texts, params) -> C expression text
    header: Path | None = None  # a step.cuh the C form needs
    cost: int = 1  # in simple float ops: what the scheduler weighs recomputing it by


def _f(x) -> str:
    """A float literal for C."""
    value = float(x)
    if np.isnan(value):
        return "__int_as_float(0x7fc00000)"
    if np.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    text = repr(float(np.float32(value)))
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"


def _call(name: str) -> Callable:
    return lambda a, p: f"{name}({', '.join(list(a) + [_f(v) for v in p])})"


def _infix(op: str) -> Callable:
    return lambda a, p: f"({a[0]} {op} {a[1]})"


def _np_max(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.maximum(a, b))


def _np_min(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.minimum(a, b))


def _softplus(x):
    with np.errstate(over="ignore"):
        return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(x)


def _gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _b(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _bool(x) -> np.ndarray:
    return _b(x)


_STEP = {
    "linear_scan": PLUGINS / "linear_scan" / "step.cuh",
    "selective_scan": PLUGINS / "selective_scan" / "step.cuh",
    "lstm_seq": PLUGINS / "lstm_seq" / "step.cuh",
    "gru_seq": PLUGINS / "gru_seq" / "step.cuh",
    "liquid_scan": PLUGINS / "liquid_scan" / "step.cuh",
    "wkv_scan": PLUGINS / "wkv_scan" / "step.cuh",
    "delta_rule_scan": PLUGINS / "delta_rule_scan" / "step.cuh",
    "gated_delta_rule_scan": PLUGINS / "gated_delta_rule_scan" / "step.cuh",
    "mlstm_scan": PLUGINS / "mlstm_scan" / "step.cuh",
    "attention": PLUGINS / "attention" / "step.cuh",
}


def _exp(x):
    with np.errstate(over="ignore"):
        return np.exp(x)


EW: dict[str, EwSpec] = {
    # arithmetic
    "add": EwSpec(2, lambda a, b, p: a + b, _infix("+")),
    "sub": EwSpec(2, lambda a, b, p: a - b, _infix("-")),
    "mul": EwSpec(2, lambda a, b, p: a * b, _infix("*")),
    "div": EwSpec(2, lambda a, b, p: np.divide(a, b), _infix("/")),
    "neg": EwSpec(1, lambda a, p: -a, lambda a, p: f"(-{a[0]})"),
    "abs": EwSpec(1, lambda a, p: np.abs(a), _call("fabsf")),
    "sqrt": EwSpec(1, lambda a, p: np.sqrt(a), _call("sqrtf")),
    "exp": EwSpec(1, lambda a, p: _exp(a), _call("expf")),
    "log": EwSpec(1, lambda a, p: np.log(a), _call("logf")),
    "reciprocal": EwSpec(1, lambda a, p: 1.0 / a, lambda a, p: f"(1.0f / {a[0]})"),
    "pow": EwSpec(2, lambda a, b, p: np.power(a, b), _call("ffk_pow")),
    "square": EwSpec(1, lambda a, p: a * a, lambda a, p: f"({a[0]} * {a[0]})"),
    "floor": EwSpec(1, lambda a, p: np.floor(a), _call("floorf")),
    "ceil": EwSpec(1, lambda a, p: np.ceil(a), _call("ceilf")),
    "round": EwSpec(1, lambda a, p: np.round(a), _call("rintf")),  # half to even, as ONNX
    "sign": EwSpec(1, lambda a, p: np.sign(a), _call("ffk_sign")),
    "sin": EwSpec(1, lambda a, p: np.sin(a), _call("sinf")),
    "cos": EwSpec(1, lambda a, p: np.cos(a), _call("cosf")),
    "erf": EwSpec(1, lambda a, p: _erf(a), _call("erff")),
    "max": EwSpec(2, lambda a, b, p: _np_max(a, b), _call("ffk_max")),
    "min": EwSpec(2, lambda a, b, p: _np_min(a, b), _call("ffk_min")),
    # activations
    "sigmoid": EwSpec(1, lambda a, p: _sigmoid(a), _call("ffk_sigmoid")),
    "tanh": EwSpec(1, lambda a, p: np.tanh(a), _call("tanhf")),
    "relu": EwSpec(1, lambda a, p: np.where(a > 0, a, np.where(np.isnan(a), a, 0.0)), _call("ffk_relu")),
    "softplus": EwSpec(1, lambda a, p: _softplus(a), _call("ffk_softplus")),
    "softsign": EwSpec(1, lambda a, p: a / (1.0 + np.abs(a)), _call("ffk_softsign")),
    "leaky_relu": EwSpec(1, lambda a, p: np.where(a >= 0, a, p[0] * a), _call("ffk_leaky_relu")),
    "elu": EwSpec(1, lambda a, p: np.where(a > 0, a, p[0] * (_exp(a) - 1.0)), _call("ffk_elu")),
    "gelu": EwSpec(1, lambda a, p: _gelu(a, p[0]), _call("ffk_gelu")),  # params: (approximate 0/1,)
    "hard_sigmoid": EwSpec(1, lambda a, p: np.clip(p[0] * a + p[1], 0.0, 1.0), _call("ffk_hard_sigmoid")),
    "clip": EwSpec(1, lambda a, p: np.where(np.isnan(a), a, np.clip(a, p[0], p[1])), _call("ffk_clip")),
    # comparisons and logic (float 0/1)
    "gt": EwSpec(2, lambda a, b, p: _bool(a > b), lambda a, p: f"(({a[0]} > {a[1]}) ? 1.0f : 0.0f)"),
    "ge": EwSpec(2, lambda a, b, p: _bool(a >= b), lambda a, p: f"(({a[0]} >= {a[1]}) ? 1.0f : 0.0f)"),
    "lt": EwSpec(2, lambda a, b, p: _bool(a < b), lambda a, p: f"(({a[0]} < {a[1]}) ? 1.0f : 0.0f)"),
    "le": EwSpec(2, lambda a, b, p: _bool(a <= b), lambda a, p: f"(({a[0]} <= {a[1]}) ? 1.0f : 0.0f)"),
    "eq": EwSpec(2, lambda a, b, p: _bool(a == b), lambda a, p: f"(({a[0]} == {a[1]}) ? 1.0f : 0.0f)"),
    "not": EwSpec(1, lambda a, p: _bool(a == 0), lambda a, p: f"(({a[0]} == 0.0f) ? 1.0f : 0.0f)"),
    "and": EwSpec(
        2,
        lambda a, b, p: _bool((a != 0) & (b != 0)),
        lambda a, p: f"(({a[0]} != 0.0f && {a[1]} != 0.0f) ? 1.0f : 0.0f)",
    ),
    "or": EwSpec(
        2,
        lambda a, b, p: _bool((a != 0) | (b != 0)),
        lambda a, p: f"(({a[0]} != 0.0f || {a[1]} != 0.0f) ? 1.0f : 0.0f)",
    ),
    "isnan": EwSpec(1, lambda a, p: _bool(np.isnan(a)), lambda a, p: f"(isnan({a[0]}) ? 1.0f : 0.0f)"),
    "isinf": EwSpec(1, lambda a, p: _bool(np.isinf(a)), lambda a, p: f"(isinf({a[0]}) ? 1.0f : 0.0f)"),
    "where": EwSpec(3, lambda c, a, b, p: np.where(c != 0, a, b), lambda a, p: f"(({a[0]} != 0.0f) ? {a[1]} : {a[2]})"),
    "tobool": EwSpec(1, lambda a, p: _bool(a != 0), lambda a, p: f"(({a[0]} != 0.0f) ? 1.0f : 0.0f)"),
    # single-step bodies of the framefuse ops (plugins/<op>/step.cuh; numpy twins here)
    "ssm_delta": EwSpec(
        2,
        lambda dt, bias, p: _softplus(dt + bias) if p[0] else dt + bias,
        lambda a, p: f"ff::ssm_delta({a[0]}, {a[1]}, {int(p[0])})",
        _STEP["selective_scan"],
    ),
    "ssm_state": EwSpec(
        5,
        lambda h, delta, A, dx, b, p: _exp(delta * A) * h + dx * b,
        lambda a, p: f"ff::ssm_state({', '.join(a)})",
        _STEP["selective_scan"],
    ),
    "ssm_gate": EwSpec(
        2, lambda y, z, p: y * (z * _sigmoid(z)), lambda a, p: f"ff::ssm_gate({a[0]}, {a[1]})", _STEP["selective_scan"]
    ),
    "linear_scan_step": EwSpec(
        3, lambda a, b, h, p: a * h + b, lambda a, p: f"ff::linear_scan_step({', '.join(a)})", _STEP["linear_scan"]
    ),
    "lstm_cell": EwSpec(
        4,
        lambda i, f, g, c, p: _sigmoid(f) * c + _sigmoid(i) * np.tanh(g),
        lambda a, p: f"ff::lstm_cell({', '.join(a)})",
        _STEP["lstm_seq"],
    ),
    "lstm_hidden": EwSpec(
        2, lambda o, c, p: _sigmoid(o) * np.tanh(c), lambda a, p: f"ff::lstm_hidden({a[0]}, {a[1]})", _STEP["lstm_seq"]
    ),
    "gru_hidden": EwSpec(
        7,
        lambda xz, hz, xr, hr, xh, hh, h, p: (
            (1.0 - _sigmoid(xz + hz)) * np.tanh(xh + _sigmoid(xr + hr) * hh) + _sigmoid(xz + hz) * h
        ),
        lambda a, p: f"ff::gru_hidden({', '.join(a)})",
        _STEP["gru_seq"],
    ),
    "liquid_hidden": EwSpec(
        4,
        lambda g1, g2, ga, gb, p: (
            np.tanh(g1) * (1.0 - _sigmoid(ga * p[0] + gb)) + _sigmoid(ga * p[0] + gb) * np.tanh(g2)
        ),
        lambda a, p: f"ff::liquid_hidden({', '.join(a)}, {_f(p[0])})",
        _STEP["liquid_scan"],
    ),
    "wkv_output": EwSpec(
        6,
        lambda num, den, pm, k, v, u, p: _wkv_output(num, den, pm, k, v, u),
        lambda a, p: f"ff::wkv_output({', '.join(a)})",
        _STEP["wkv_scan"],
    ),
    "wkv_max": EwSpec(
        3, lambda pm, w, k, p: _np_max(pm + w, k), lambda a, p: f"ff::wkv_max({', '.join(a)})", _STEP["wkv_scan"]
    ),
    "wkv_carry": EwSpec(
        6,
        lambda acc, pm, w, k, v, pn, p: _exp(pm + w - pn) * acc + _exp(k - pn) * v,
        lambda a, p: f"ff::wkv_carry({', '.join(a)})",
        _STEP["wkv_scan"],
    ),
    "delta_rule_state": EwSpec(
        5,
        lambda s, beta, kj, vv, sk, p: s + beta * kj * (vv - sk),
        lambda a, p: f"ff::delta_rule_state({', '.join(a)})",
        _STEP["delta_rule_scan"],
    ),
    "gated_delta_state": EwSpec(
        6,
        lambda s, g, beta, ki, vv, ks, p: _exp(g) * s + beta * ki * (vv - _exp(g) * ks),
        lambda a, p: f"ff::gated_delta_state({', '.join(a)})",
        _STEP["gated_delta_rule_scan"],
    ),
    "mlstm_m": EwSpec(
        3,
        lambda f_pre, m, i, p: _np_max(-_softplus(-f_pre) + m, i),
        lambda a, p: f"ff::mlstm_m({', '.join(a)})",
        _STEP["mlstm_scan"],
    ),
    "mlstm_fgate": EwSpec(
        3,
        lambda f_pre, m, m_new, p: _exp(-_softplus(-f_pre) + m - m_new),
        lambda a, p: f"ff::mlstm_fgate({', '.join(a)})",
        _STEP["mlstm_scan"],
    ),
    "mlstm_igate": EwSpec(
        2, lambda i, m_new, p: _exp(i - m_new), lambda a, p: f"ff::mlstm_igate({a[0]}, {a[1]})", _STEP["mlstm_scan"]
    ),
    "mlstm_denominator": EwSpec(
        2,
        lambda nq, m_new, p: _np_max(np.abs(nq), _exp(-m_new)) + p[0],
        lambda a, p: f"ff::mlstm_denominator({a[0]}, {a[1]}, {_f(p[0])})",
        _STEP["mlstm_scan"],
    ),
    "attention_weight": EwSpec(
        2,
        lambda s, row_max, p: _exp(s - np.where(row_max == -np.inf, 0.0, row_max)),
        lambda a, p: f"ff::attention_weight({a[0]}, {a[1]})",
        _STEP["attention"],
    ),
    "attention_finish": EwSpec(
        2,
        lambda acc, total, p: np.where(total == 0, 0.0, acc / np.where(total == 0, 1.0, total)),
        lambda a, p: f"ff::attention_finish({', '.join(a)})",
        _STEP["attention"],
    ),
}

# Roughly what an op costs in simple float ops (a special-function op and the IEEE fix-ups around
# it): the scheduler weighs recomputing a value by it, so a sigmoid that 64 elements of a block read
# is computed once into shared memory rather than 64 times in a loop.
_COSTS = {
    "sqrt": 8, "exp": 8, "log": 8, "reciprocal": 8, "div": 8, "pow": 16, "sin": 8, "cos": 8, "erf": 8,
    "sigmoid": 8, "tanh": 8, "softplus": 16, "elu": 8, "gelu": 16,
    "ssm_delta": 16, "ssm_state": 8, "ssm_gate": 8, "lstm_cell": 24, "lstm_hidden": 16, "gru_hidden": 32,
    "liquid_hidden": 32, "wkv_output": 16, "wkv_carry": 16,
    "attention_weight": 8, "attention_finish": 8, "softsign": 8, "gated_delta_state": 16, "delta_rule_state": 4,
    "linear_scan_step": 2,
    # mLSTM's gates stay recomputed by their readers: weighed as their exp and softplus (8-24),
    # they were cached as arrays, a phase each, and xlstm's step took 1.1 us longer (H100)
    "mlstm_igate": 1, "mlstm_denominator": 1, "mlstm_m": 1, "mlstm_fgate": 1,
}  # fmt: skip
EW = {name: replace(spec, cost=_COSTS.get(name, 1)) for name, spec in EW.items()}


def _wkv_output(num, den, pm, k, v, u):
    q = _np_max(pm, k + u)
    e1 = _exp(pm - q)
    e2 = _exp(k + u - q)
    return (e1 * num + e2 * v) / (e1 * den + e2)


def c_float(value) -> str:
    return _f(value)


__all__ = ["EW", "EwSpec", "c_float"]
