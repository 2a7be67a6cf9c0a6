"""Integer index expressions: how an element of one tensor finds the elements it reads.

Every data-movement op (Reshape, Transpose, Slice, Expand, Gather with constant indices ...)
becomes a function from output indices to input indices, built from these expressions. The same
expression is

- evaluated with numpy over whole index ranges (the reference interpreter gathers with it, and the
  scheduler counts which elements each block reads), and
- printed as C (the generated kernel indexes with it).

Expressions are kept in a simplified linear form: ``Σ coef·atom + const`` where an atom is a loop
variable or a floor division / remainder that could not be simplified. Division and remainder by
a constant are simplified with the bounds of each term (``(16·d + n) // 16`` is ``d`` when
``0 ≤ n < 16``), so a value that does not depend on an inner loop variable is recognised as such
and computed outside that loop. Every index is non-negative, so floor division and C's truncating
division agree; the simplifier only ever applies rules that hold for the whole range of each
variable, and :func:`check_same` verifies a simplified expression against the raw one numerically.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


class IExpr:
    """Base class: every expression knows its bounds (inclusive) and free variables."""

    lo: int
    hi: int

    def __add__(self, other):
        return add(self, as_iexpr(other))

    __radd__ = __add__

    def __mul__(self, other):
        return mul(self, int(other))

    __rmul__ = __mul__

    def __floordiv__(self, other):
        return floordiv(self, int(other))

    def __mod__(self, other):
        return mod(self, int(other))

    def __sub__(self, other):
        return add(self, mul(as_iexpr(other), -1))


@dataclass(frozen=True, eq=True)
class Var(IExpr):
    """A loop variable with values in [0, extent)."""

    name: str
    extent: int

    @property
    def lo(self) -> int:
        return 0

    @property
    def hi(self) -> int:
        return self.extent - 1

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=True)
class Lin(IExpr):
    """Σ coef·atom + const; atoms are Var, Div or Mod (sorted, coefficients non-zero)."""

    terms: tuple  # ((atom, coef), ...)
    const: int

    @cached_property
    def lo(self) -> int:
        return self.const + sum(c * (a.lo if c > 0 else a.hi) for a, c in self.terms)

    @cached_property
    def hi(self) -> int:
        return self.const + sum(c * (a.hi if c > 0 else a.lo) for a, c in self.terms)

    def __repr__(self) -> str:
        parts = [f"{c}*{a!r}" if c != 1 else repr(a) for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return "(" + " + ".join(parts) + ")"


@dataclass(frozen=True, eq=True)
class Div(IExpr):
    x: IExpr
    c: int

    @property
    def lo(self) -> int:
        return self.x.lo // self.c

    @property
    def hi(self) -> int:
        return self.x.hi // self.c

    def __repr__(self) -> str:
        return f"({self.x!r} / {self.c})"


@dataclass(frozen=True, eq=True)
class Mod(IExpr):
    x: IExpr
    c: int

    @property
    def lo(self) -> int:
        return 0 if self.x.hi >= self.c or self.x.lo < 0 else self.x.lo

    @property
    def hi(self) -> int:
        return min(self.c - 1, self.x.hi)

    def __repr__(self) -> str:
        return f"({self.x!r} % {self.c})"


@dataclass(frozen=True, eq=True)
class Known(IExpr):
    """``x``, known (by an enclosing guard, e.g. a Concat's branch test) to lie in [lo_, hi_]: the
    same value with narrower bounds, so the index arithmetic below it can be simplified."""

    x: IExpr
    lo_: int
    hi_: int

    @property
    def lo(self) -> int:
        return max(self.x.lo, self.lo_)

    @property
    def hi(self) -> int:
        return min(self.x.hi, self.hi_)

    def __repr__(self) -> str:
        return f"known({self.x!r} in {self.lo_}..{self.hi_})"


def _key(atom) -> str:
    return repr(atom)


def _lin(terms: dict, const: int) -> IExpr:
    items = tuple(sorted(((a, c) for a, c in terms.items() if c != 0), key=lambda t: _key(t[0])))
    if len(items) == 1 and const == 0 and items[0][1] == 1:
        return items[0][0]
    return Lin(items, int(const))


def const(value: int) -> IExpr:
    return Lin((), int(value))


def as_iexpr(value) -> IExpr:
    if isinstance(value, IExpr):
        return value
    return const(int(value))


def _terms(e: IExpr) -> tuple[dict, int]:
    if isinstance(e, Lin):
        return {a: c for a, c in e.terms}, e.const
    return {e: 1}, 0


def is_const(e: IExpr) -> bool:
    return isinstance(e, Lin) and not e.terms


def const_value(e: IExpr) -> int:
    assert is_const(e), e
    return e.const


def add(a: IExpr, b: IExpr) -> IExpr:
    ta, ca = _terms(a)
    tb, cb = _terms(b)
    for atom, coef in tb.items():
        ta[atom] = ta.get(atom, 0) + coef
    return _lin(ta, ca + cb)


def mul(a: IExpr, k: int) -> IExpr:
    if k == 0:
        return const(0)
    ta, ca = _terms(a)
    return _lin({atom: coef * k for atom, coef in ta.items()}, ca * k)


def floordiv(x: IExpr, c: int) -> IExpr:
    if c <= 0:
        raise ValueError(f"index division by {c}")
    if c == 1:
        return x
    if x.lo < 0:
        raise ValueError(f"index expression {x!r} may be negative")
    if x.hi < c:
        return const(0)
    terms, k = _terms(x)
    # x = c·Q + R with Q the terms whose coefficients c divides; when 0 ≤ R < c, x // c = Q.
    q_terms = {a: coef // c for a, coef in terms.items() if coef % c == 0}
    r_terms = {a: coef for a, coef in terms.items() if coef % c != 0}
    q_const, r_const = divmod(k, c)
    rest = _lin(r_terms, r_const)
    if rest.lo >= 0 and rest.hi < c:
        return _lin(q_terms, q_const)
    if q_terms or q_const:
        # x // c = Q + R // c when R ≥ 0
        if rest.lo >= 0:
            return add(_lin(q_terms, q_const), Div(rest, c) if rest.hi >= c else const(0))
    # nested division: (y // a) // b = y // (a·b)
    if isinstance(x, Div):
        return floordiv(x.x, x.c * c)
    return Div(x, c)


def mod(x: IExpr, c: int) -> IExpr:
    if c <= 0:
        raise ValueError(f"index remainder by {c}")
    if c == 1:
        return const(0)
    if x.lo < 0:
        raise ValueError(f"index expression {x!r} may be negative")
    if x.hi < c:
        return x
    terms, k = _terms(x)
    r_terms = {a: coef % c for a, coef in terms.items() if coef % c != 0}
    rest = _lin(r_terms, k % c)
    if rest.lo >= 0 and rest.hi < c:
        return rest
    if isinstance(x, Mod) and x.c % c == 0:
        return mod(x.x, c)
    return Mod(rest if rest.lo >= 0 else x, c)


# -- analysis -------------------------------------------------------------------------------------


def free_vars(e: IExpr) -> frozenset:
    if isinstance(e, Var):
        return frozenset((e,))
    if isinstance(e, Lin):
        out: frozenset = frozenset()
        for atom, _ in e.terms:
            out |= free_vars(atom)
        return out
    if isinstance(e, (Div, Mod, Known)):
        return free_vars(e.x)
    raise TypeError(e)


def evaluate(e: IExpr, env: dict) -> np.ndarray:
    """Numeric value with numpy; ``env`` maps Var -> int array (broadcastable)."""
    if isinstance(e, Var):
        return np.asarray(env[e], dtype=np.int64)
    if isinstance(e, Lin):
        total = np.int64(e.const)
        for atom, coef in e.terms:
            total = total + coef * evaluate(atom, env)
        return np.asarray(total, dtype=np.int64)
    if isinstance(e, Div):
        return evaluate(e.x, env) // e.c
    if isinstance(e, Mod):
        return evaluate(e.x, env) % e.c
    if isinstance(e, Known):
        return evaluate(e.x, env)
    raise TypeError(e)


def to_c(e: IExpr) -> str:
    """C text (int arithmetic; every operand is non-negative, so / and % are floor ones)."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Lin):
        parts = []
        for atom, coef in e.terms:
            text = to_c(atom)
            parts.append(text if coef == 1 else f"{coef} * {text}")
        if e.const or not parts:
            parts.append(str(e.const))
        return parts[0] if len(parts) == 1 else "(" + " + ".join(parts) + ")"
    if isinstance(e, Div):
        return f"({to_c(e.x)} / {e.c})"
    if isinstance(e, Mod):
        return f"({to_c(e.x)} % {e.c})"
    if isinstance(e, Known):
        return to_c(e.x)
    raise TypeError(e)


# -- multi-indices --------------------------------------------------------------------------------


def strides(shape) -> list[int]:
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * int(shape[i + 1])
    return out


def flatten(index, shape) -> IExpr:
    """Row-major flat index of a multi-index."""
    total = const(0)
    for ix, st, dim in zip(index, strides(shape), shape):
        if dim != 1:
            total = add(total, mul(ix, st))
    return total


def unflatten(flat: IExpr, shape) -> list[IExpr]:
    """Row-major multi-index of a flat index (size-1 dims are the constant 0)."""
    out = []
    for st, dim in zip(strides(shape), shape):
        out.append(const(0) if dim == 1 else mod(floordiv(flat, st), dim))
    return out


def bounded(e: IExpr, extent: int) -> IExpr:
    """``e`` after checking that its bounds lie in [0, extent)."""
    if e.lo < 0 or e.hi >= extent:
        raise ValueError(f"index {e!r} (range {e.lo}..{e.hi}) outside [0, {extent})")
    return e


def check_same(simplified: IExpr, raw_fn, variables: list[Var], limit: int = 1 << 22) -> None:
    """Evaluate ``simplified`` and ``raw_fn(env)`` over every combination of ``variables`` (when the
    product of extents is at most ``limit``) and raise if they differ anywhere."""
    total = 1
    for v in variables:
        total *= v.extent
    if total > limit or not variables:
        return
    grids = np.meshgrid(*[np.arange(v.extent) for v in variables], indexing="ij")
    env = {v: g.reshape(-1) for v, g in zip(variables, grids)}
    if not np.array_equal(np.broadcast_to(evaluate(simplified, env), (total,)), raw_fn(env)):
        raise AssertionError(f"index simplification changed {simplified!r}")


__all__ = [
    "Div",
    "IExpr",
    "Known",
    "Lin",
    "Mod",
    "Var",
    "add",
    "as_iexpr",
    "bounded",
    "check_same",
    "const",
    "const_value",
    "evaluate",
    "flatten",
    "floordiv",
    "free_vars",
    "is_const",
    "mod",
    "mul",
    "strides",
    "to_c",
    "unflatten",
]
