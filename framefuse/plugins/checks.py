"""Input checks shared by every op's Python entry: each error names the op, the argument, what was
expected and what was given."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from framefuse.errors import FrameFuseError


class OpArgumentError(FrameFuseError):
    """A fused op was called with a tensor of the wrong shape, dtype, device or layout."""


def _torch():
    import torch

    return torch


def as_tensor(op: str, arg: str, x: Any):
    """`x` as a torch tensor without copying: torch tensors pass through; objects with
    `__cuda_array_interface__` (CuPy, Numba, ...) or DLPack (`__dlpack__`) are wrapped zero-copy."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        try:
            return torch.as_tensor(x, device="cuda")
        except Exception as exc:  # noqa: BLE001 - rewrap with the op and argument named
            raise OpArgumentError(f"{op}: argument {arg}: cannot wrap __cuda_array_interface__ object: {exc}") from exc
    if hasattr(x, "__dlpack__"):
        try:
            return torch.from_dlpack(x)
        except Exception as exc:  # noqa: BLE001
            raise OpArgumentError(f"{op}: argument {arg}: cannot import via DLPack: {exc}") from exc
    raise OpArgumentError(
        f"{op}: argument {arg} must be a torch tensor or an object with __cuda_array_interface__ or "
        f"__dlpack__, got {type(x).__name__}"
    )


def _dtype_label(d) -> str:
    return str(d).removeprefix("torch.")


def check_tensor(
    op: str,
    arg: str,
    t: Any,
    *,
    shape: Sequence[int | None] | None = None,
    dtype: Any = None,
    cuda: bool = True,
    device: Any = None,
    contiguous: bool = True,
):
    """Check one op argument and return it as a torch tensor.

    shape: expected shape; None entries match any size. dtype: a torch dtype or an iterable of
    allowed ones. cuda: must live on a CUDA device. device: must live on exactly this device
    (a torch.device), e.g. the device of the op's first input. contiguous: row-major contiguous.
    Raises OpArgumentError ("<op>: argument <arg>: expected ..., got ...").
    """
    torch = _torch()
    if t is None:
        raise OpArgumentError(f"{op}: argument {arg} is required but was None")
    t = as_tensor(op, arg, t)
    if shape is not None:
        expected = tuple(shape)
        actual = tuple(t.shape)
        if len(expected) != len(actual) or any(e is not None and e != a for e, a in zip(expected, actual)):
            shown = "[" + ", ".join("?" if e is None else str(e) for e in expected) + "]"
            raise OpArgumentError(f"{op}: argument {arg}: expected shape {shown}, got {list(actual)}")
    if dtype is not None:
        allowed = tuple(dtype) if isinstance(dtype, Iterable) and not isinstance(dtype, torch.dtype) else (dtype,)
        if t.dtype not in allowed:
            names = " or ".join(_dtype_label(d) for d in allowed)
            raise OpArgumentError(f"{op}: argument {arg}: expected dtype {names}, got {_dtype_label(t.dtype)}")
    if cuda and t.device.type != "cuda":
        raise OpArgumentError(f"{op}: argument {arg}: expected a CUDA tensor, got one on {t.device}")
    if device is not None and t.device != torch.device(device):
        raise OpArgumentError(f"{op}: argument {arg}: expected a tensor on {device}, got one on {t.device}")
    if contiguous and not t.is_contiguous():
        raise OpArgumentError(
            f"{op}: argument {arg}: expected a contiguous (row-major) tensor, got strides {list(t.stride())} "
            f"for shape {list(t.shape)} (call .contiguous() first)"
        )
    return t


def storage_dtypes():
    """The torch storage dtypes every kernel supports (fp32, fp16, bf16)."""
    torch = _torch()
    return (torch.float32, torch.float16, torch.bfloat16)


def check_storage_dtype(op: str, arg: str, t) -> None:
    if t.dtype not in storage_dtypes():
        raise OpArgumentError(
            f"{op}: argument {arg}: storage dtype must be float32, float16 or bfloat16, got {_dtype_label(t.dtype)}"
        )


def check_attr_range(op: str, name: str, value, *, low=None, high=None, choices=None) -> None:
    """Attribute bounds check, e.g. check_attr_range("SelectiveScan", "N", n, low=1, high=256)."""
    if choices is not None and value not in choices:
        raise OpArgumentError(f"{op}: {name}={value!r} must be one of {list(choices)}")
    if low is not None and value < low:
        raise OpArgumentError(f"{op}: {name}={value!r} must be >= {low}")
    if high is not None and value > high:
        raise OpArgumentError(f"{op}: {name}={value!r} must be <= {high}")


def check_outputs(op: str, outputs, specs: Sequence[tuple[str, tuple, Any]], device) -> list:
    """Check preallocated outputs against (name, shape, dtype) specs; returns them as torch tensors."""
    if len(outputs) != len(specs):
        raise OpArgumentError(
            f"{op}: expected {len(specs)} preallocated outputs ({', '.join(s[0] for s in specs)}), got {len(outputs)}"
        )
    return [
        check_tensor(op, f"output {name}", out, shape=shape, dtype=dtype, device=device)
        for out, (name, shape, dtype) in zip(outputs, specs)
    ]
