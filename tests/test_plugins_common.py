"""CPU tests of the shared op infrastructure (schema, checks, registry, cuda.py helpers) and of
the LinearScan / SelectiveScan references, shape rules and input validation."""

from __future__ import annotations

import ctypes
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from framefuse.errors import FrameFuseError
from framefuse.plugins import cuda, registry
from framefuse.plugins.checks import OpArgumentError, check_tensor
from framefuse.plugins.schema import OpSchema, SchemaError, TensorSpec, dtype_name

REPO = pathlib.Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------- schema


def _toy_schema():
    return OpSchema(
        name="Toy",
        inputs=(TensorSpec("x", 2, "T"), TensorSpec("s", 1, "float32", optional=True)),
        outputs=(TensorSpec("y", 2, "T"), TensorSpec("s_last", 1, "float32")),
        attributes={"alpha": (float, 1.0), "mode": (int, 0)},
        infer_shapes=lambda shapes, attrs: [shapes[0], (shapes[0][1],)],
    )


def test_dtype_names_from_every_family():
    assert dtype_name(torch.bfloat16) == "bfloat16"
    assert dtype_name(torch.half) == "float16"
    assert dtype_name("fp16") == "float16"
    assert dtype_name("bf16") == "bfloat16"
    assert dtype_name(1) == "float32"  # onnx.TensorProto.FLOAT
    assert dtype_name(16) == "bfloat16"  # onnx.TensorProto.BFLOAT16
    import numpy as np

    assert dtype_name(np.float16) == "float16"
    with pytest.raises(SchemaError):
        dtype_name(7)  # INT64: not a float type


def test_output_dtypes_follow_the_family_of_the_storage_dtype():
    schema = _toy_schema()
    assert schema.output_dtypes(torch.float16) == [torch.float16, torch.float32]
    assert schema.output_dtypes("bfloat16") == ["bfloat16", "float32"]
    assert schema.output_dtypes(10) == [10, 1]  # ONNX FLOAT16 → [FLOAT16, FLOAT]
    with pytest.raises(SchemaError, match="Toy: storage dtype int32"):
        schema.output_dtypes(torch.int32)


def test_attrs_with_defaults_casts_and_rejects_unknown():
    schema = _toy_schema()
    assert schema.attrs_with_defaults({"mode": 1.0}) == {"alpha": 1.0, "mode": 1}
    assert schema.attrs_with_defaults(None) == {"alpha": 1.0, "mode": 0}
    with pytest.raises(SchemaError, match="Toy: unknown attribute.*beta"):
        schema.attrs_with_defaults({"beta": 2})
    with pytest.raises(SchemaError, match="Toy: attribute alpha='x' is not a float"):
        schema.attrs_with_defaults({"alpha": "x"})
    schema.check_arity(1)
    with pytest.raises(SchemaError, match="Toy: got 3 inputs, expected 1 to 2"):
        schema.check_arity(3)
    assert schema.input_names == ("x", "s") and schema.required_inputs == ("x",)


# -------------------------------------------------------------------------------------- registry


def test_registry_lists_every_plugin_op_and_loads_each():
    """The registry's op types are exactly the plugin packages that define an op schema (found in
    the plugins folder, not restated here), and every one loads with its schema in the framefuse
    domain, a reference, a launch entry and a CUDA kernel source."""
    import importlib

    assert registry.DOMAIN == "framefuse"
    folders = sorted(p.parent.name for p in (REPO / "framefuse" / "plugins").glob("*/schema.py"))
    defined = {importlib.import_module(f"framefuse.plugins.{f}.schema").SCHEMA.name for f in folders}
    assert len(folders) >= 10 and set(registry.OP_TYPES) == defined
    for op_type in registry.OP_TYPES:
        module = registry.get_op(op_type)
        assert module.SCHEMA.name == op_type and module.SCHEMA.domain == "framefuse"
        assert callable(module.reference) and callable(module.launch)
        assert registry.has_kernel(op_type)
        assert registry.is_framefuse_node("framefuse", op_type)
    assert not registry.is_framefuse_node("", "LSTM")


def test_registry_unknown_op_is_a_clear_error():
    with pytest.raises(registry.UnknownOpError, match="unknown framefuse op 'Foo'"):
        registry.get_op("Foo")
    assert issubclass(registry.UnknownOpError, FrameFuseError)


# ---------------------------------------------------------------------------------------- checks


def test_check_tensor_messages_name_op_argument_and_mismatch():
    t = torch.zeros(2, 3)
    assert check_tensor("Op", "x", t, shape=(2, None), dtype=torch.float32, cuda=False) is t
    with pytest.raises(OpArgumentError, match=r"Op: argument x: expected shape \[2, 4\], got \[2, 3\]"):
        check_tensor("Op", "x", t, shape=(2, 4), cuda=False)
    with pytest.raises(OpArgumentError, match=r"Op: argument x: expected dtype float16 or bfloat16, got float32"):
        check_tensor("Op", "x", t, dtype=(torch.float16, torch.bfloat16), cuda=False)
    with pytest.raises(OpArgumentError, match=r"Op: argument x: expected a CUDA tensor, got one on cpu"):
        check_tensor("Op", "x", t)
    with pytest.raises(OpArgumentError, match=r"Op: argument x: expected a contiguous"):
        check_tensor("Op", "x", t.t(), cuda=False)
    with pytest.raises(OpArgumentError, match=r"Op: argument x is required but was None"):
        check_tensor("Op", "x", None)
    with pytest.raises(OpArgumentError, match=r"Op: argument x must be a torch tensor"):
        check_tensor("Op", "x", [1, 2], cuda=False)


def test_check_tensor_accepts_dlpack_producers():
    import numpy as np

    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = check_tensor("Op", "x", arr, shape=(2, 3), cuda=False)  # numpy exports __dlpack__
    assert isinstance(t, torch.Tensor) and t.data_ptr() == arr.ctypes.data  # zero-copy


# ------------------------------------------------------------------------------ cuda.py (no GPU)


def test_op_packages_import_without_cuda_python():
    """cuda-python is imported lazily: with it unavailable, the packages import and a kernel
    call fails with a clear CudaUnavailableError (torch imports cuda.bindings itself, so the
    binding modules are hidden after torch is loaded)."""
    code = """
import sys, torch
import cuda.bindings
for name in ("driver", "nvrtc"):
    sys.modules["cuda.bindings." + name] = None
    if hasattr(cuda.bindings, name):
        delattr(cuda.bindings, name)
import framefuse.plugins, framefuse.plugins.linear_scan, framefuse.plugins.selective_scan
from framefuse.plugins import cuda as ffcuda
try:
    ffcuda._driver()
except ffcuda.CudaUnavailableError as exc:
    print("unavailable:", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.startswith("unavailable: cuda-python is not installed"), out.stdout + out.stderr


def test_device_pointer_and_stream_handle_without_gpu():
    class CudaArray:
        __cuda_array_interface__ = {"data": (0xDEAD000, False), "shape": (4,), "typestr": "<f4", "version": 3}

    assert cuda.device_pointer(CudaArray()) == 0xDEAD000
    t = torch.zeros(3)
    assert cuda.device_pointer(t) == t.data_ptr()
    assert cuda.device_pointer(None) == 0
    assert cuda.stream_handle(1234) == 1234

    class CoreStream:
        def __cuda_stream__(self):
            return (0, 5678)

    assert cuda.stream_handle(CoreStream()) == 5678
    assert cuda.ptr(t).value == t.data_ptr() and isinstance(cuda.i32(3), ctypes.c_int)
    assert cuda.dtype_suffix(torch.bfloat16) == "bf16"
    with pytest.raises(cuda.CudaError, match="no kernel for storage dtype int8"):
        cuda.dtype_suffix(torch.int8)


def test_source_digest_covers_included_headers(tmp_path):
    (tmp_path / "op").mkdir()
    header = tmp_path / "common.cuh"
    header.write_text("#define X 1\n")
    src = tmp_path / "op" / "op.cu"
    src.write_text('#include "../common.cuh"\nextern "C" __global__ void k() {}\n')
    assert cuda.local_includes(src) == [header.resolve()]
    before = cuda.source_digest(src)
    assert cuda.source_digest(src, ["sm_90"]) != before
    header.write_text("#define X 2\n")
    assert cuda.source_digest(src) != before


def test_real_kernels_include_common_header():
    from framefuse.plugins.linear_scan import interface as ls
    from framefuse.plugins.selective_scan import interface as ss

    common = (REPO / "framefuse" / "plugins" / "common.cuh").resolve()
    assert common in cuda.local_includes(ls.SOURCE)
    assert common in cuda.local_includes(ss.SOURCE)


def test_stale_fatbin_is_detected_by_its_sidecar(tmp_path, monkeypatch):
    from framefuse.plugins.linear_scan import interface as ls

    monkeypatch.setattr(cuda, "KERNELS_DIR", tmp_path)
    assert cuda.fatbin_path(ls.SOURCE) == tmp_path / "linear_scan.fatbin"
    sidecar = tmp_path / "linear_scan.fatbin.json"
    assert cuda.fatbin_is_current(ls.SOURCE)  # no sidecar: trusted (installed wheels)
    sidecar.write_text(json.dumps({"source_sha256": cuda.source_digest(ls.SOURCE)}))
    assert cuda.fatbin_is_current(ls.SOURCE)
    sidecar.write_text(json.dumps({"source_sha256": "0" * 64}))
    assert not cuda.fatbin_is_current(ls.SOURCE)


def test_atomic_write_and_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEFUSE_CACHE", str(tmp_path / "c"))
    assert cuda.cache_dir() == tmp_path / "c"
    target = cuda.cache_dir() / "x.bin"
    cuda._atomic_write(target, b"abc")
    assert target.read_bytes() == b"abc" and [p.name for p in target.parent.iterdir()] == ["x.bin"]


def _nvrtc_available() -> bool:
    try:
        cuda.nvrtc_version()
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _nvrtc_available(), reason="libnvrtc is not installed here (pip install nvidia-cuda-nvrtc)")
def test_nvrtc_compiles_every_kernel_source():
    """NVRTC (the runtime path on GPUs without a matching fatbin) accepts every .cu, for a real
    arch (cubin) and as PTX; no GPU needed."""
    from framefuse.plugins.build_kernels import kernel_sources

    for source in kernel_sources():
        assert len(cuda.compile_source(source, "sm_90")) > 0, source
    assert len(cuda.compile_source(kernel_sources()[0], "compute_75")) > 0


# ------------------------------------------------------------------------------------ LinearScan


def _linear_closed_form(a, b, h0):
    """h_t = Π_{r≤t} a_r · h0 + Σ_{s≤t} Π_{s<r≤t} a_r · b_s, in float64 (independent of the loop)."""
    a, b, h0 = a.double(), b.double(), h0.double()
    steps = a.shape[1]
    out = torch.empty_like(a)
    for t in range(steps):
        total = torch.prod(a[:, : t + 1], dim=1) * h0
        for s in range(t + 1):
            total = total + torch.prod(a[:, s + 1 : t + 1], dim=1) * b[:, s]
        out[:, t] = total
    return out


def test_linear_scan_reference_matches_closed_form():
    from framefuse.plugins.linear_scan import reference

    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 9, 5, generator=g, dtype=torch.float64)
    b = torch.randn(2, 9, 5, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 5, generator=g, dtype=torch.float64)
    h, h_last = reference(a, b, h0)
    expected = _linear_closed_form(a, b, h0)
    torch.testing.assert_close(h, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_last, expected[:, -1])


def test_linear_scan_reference_dtypes_zero_state_and_nan():
    from framefuse.plugins.linear_scan import reference

    a = torch.full((1, 4, 3), 0.5, dtype=torch.bfloat16)
    b = torch.ones(1, 4, 3, dtype=torch.bfloat16)
    b[0, 1, 2] = float("nan")
    h, h_last = reference(a, b)
    assert h.dtype == torch.bfloat16 and h_last.dtype == torch.float32
    assert h[0, :, 0].float().tolist() == [1.0, 1.5, 1.75, 1.875]
    assert torch.isnan(h[0, 1:, 2]).all() and not torch.isnan(h[0, 0, 2])
    assert h_last.shape == (1, 3) and not torch.isnan(h_last[0, :2]).any()


def test_linear_scan_shape_rule():
    from framefuse.plugins.linear_scan import SCHEMA

    assert SCHEMA.infer_shapes([(2, 5, 7), (2, 5, 7), (2, 7)], {}) == [(2, 5, 7), (2, 7)]
    assert SCHEMA.infer_shapes([("B", 5, 7), (2, 5, 7), None], {}) == [(2, 5, 7), (2, 7)]
    with pytest.raises(SchemaError, match=r"LinearScan: channel counts .*a=7, b=8"):
        SCHEMA.infer_shapes([(2, 5, 7), (2, 5, 8)], {})
    with pytest.raises(SchemaError, match=r"LinearScan: input h0 must have rank 2"):
        SCHEMA.infer_shapes([(2, 5, 7), (2, 5, 7), (2, 7, 1)], {})


def test_linear_scan_validation_errors():
    from framefuse.plugins.checks import prepare
    from framefuse.plugins.linear_scan import SCHEMA, interface

    def check(inputs):
        return prepare(SCHEMA, inputs, cuda=False)

    a = torch.rand(2, 5, 7)
    b = torch.rand(2, 5, 7)
    with pytest.raises(OpArgumentError, match="LinearScan: argument a: expected a CUDA tensor"):
        interface.launch([a, b], {})
    with pytest.raises(OpArgumentError, match=r"LinearScan: argument b: expected shape \[2, 5, 7\], got \[2, 5, 6\]"):
        check([a, torch.rand(2, 5, 6)])
    with pytest.raises(OpArgumentError, match="LinearScan: argument b: expected dtype float32, got float16"):
        check([a, b.half()])
    with pytest.raises(OpArgumentError, match=r"LinearScan: argument h0: expected shape \[2, 7\]"):
        check([a, b, torch.zeros(7)])
    with pytest.raises(OpArgumentError, match="LinearScan: argument h0: expected dtype float32, got float16"):
        check([a.half(), b.half(), torch.zeros(2, 7, dtype=torch.float16)])
    with pytest.raises(OpArgumentError, match="LinearScan: argument a: storage dtype must be"):
        check([a.double(), b.double()])
    with pytest.raises(SchemaError, match="LinearScan: unknown attribute"):
        interface.launch([a, b], {"alpha": 1})


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "batch,steps,channels", [(1, 1, 1), (1, 32, 256), (1, 4096, 256), (64, 4096, 257), (7, 1000, 33), (1, 64, 1)]
)
def test_linear_scan_plan_invariants(dtype, batch, steps, channels):
    from framefuse.plugins.linear_scan import interface

    for sm_count in (8, 132):
        p = interface.plan(batch, steps, channels, dtype, sm_count)
        itemsize = 4 if dtype == "float32" else 2
        if p["algorithm"] == "sequential":
            vec = p["vec"]
            assert channels % vec == 0 and vec * itemsize <= 16
            assert p["grid"][0] * p["block"][0] * vec >= batch * channels
        else:
            ch, nc = p["block"][:2]
            assert ch * nc <= interface.MAX_CHUNK_THREADS and nc >= 2
            assert (nc - 1) * p["chunk_len"] < steps <= nc * p["chunk_len"]  # no empty chunk
            assert p["grid"][0] * ch >= batch * channels
        if steps < interface.MIN_CHUNKED_STEPS:
            assert p["algorithm"] == "sequential"
    assert interface.plan(1, 4096, 256, dtype, 132)["algorithm"] == "chunked"
    assert interface.plan(1, 32, 256, dtype, 132, algorithm="chunked")["algorithm"] == "chunked"
    assert interface.plan(1, 4096, 256, dtype, 132, algorithm="sequential")["algorithm"] == "sequential"


def test_linear_scan_plan_respects_alignment():
    from framefuse.plugins.linear_scan import interface

    assert interface.plan(1, 8, 256, "float32", 132, alignment=16)["vec"] == 4
    assert interface.plan(1, 8, 256, "float32", 132, alignment=4)["vec"] == 1
    assert interface.plan(1, 8, 256, "float16", 132, alignment=4)["vec"] == 2
    assert interface.plan(1, 8, 6, "float16", 132)["vec"] == 2
    with pytest.raises(OpArgumentError, match="algorithm='fast'"):
        interface.plan(1, 8, 6, "float16", 132, algorithm="fast")


# --------------------------------------------------------------------------------- SelectiveScan


def _selective_vectorised(x, dt, A, B, C, D, z, dt_bias, h0, softplus):
    """Mamba's selective_scan_ref formulation (einsum discretisation, then a scan), float64."""
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    delta = dt + (dt_bias.double() if dt_bias is not None else 0)
    if softplus:
        delta = torch.nn.functional.softplus(delta)
    delta_a = torch.exp(torch.einsum("btd,dn->btdn", delta, A))
    delta_bx = torch.einsum("btd,btn,btd->btdn", delta, B, x)
    h = h0.double() if h0 is not None else torch.zeros(x.shape[0], x.shape[2], A.shape[1], dtype=torch.float64)
    ys = []
    for t in range(x.shape[1]):
        h = delta_a[:, t] * h + delta_bx[:, t]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + x * D.double()
    if z is not None:
        y = y * torch.nn.functional.silu(z.double())
    return y, h


def _ss_inputs(batch=2, steps=6, channels=5, nstate=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, steps, channels, generator=g, dtype=dtype),
        torch.randn(batch, steps, channels, generator=g, dtype=dtype) * 0.5 - 1,
        -torch.exp(torch.randn(channels, nstate, generator=g, dtype=dtype)),
        torch.randn(batch, steps, nstate, generator=g, dtype=dtype),
        torch.randn(batch, steps, nstate, generator=g, dtype=dtype),
        torch.randn(channels, generator=g, dtype=dtype),
        torch.randn(batch, steps, channels, generator=g, dtype=dtype),
        torch.randn(channels, generator=g, dtype=dtype) * 0.1,
        torch.randn(batch, channels, nstate, generator=g, dtype=dtype),
    ]


@pytest.mark.parametrize("softplus", [1, 0])
@pytest.mark.parametrize("drop", [(), (5, 6, 7, 8)])
def test_selective_scan_reference_matches_vectorised_form(softplus, drop):
    from framefuse.plugins.selective_scan import reference

    inputs = _ss_inputs()
    if not softplus:
        inputs[1] = inputs[1].abs() * 0.1
    inputs = [None if i in drop else t for i, t in enumerate(inputs)]
    y, h_last = reference(*inputs, delta_softplus=softplus)
    y_vec, h_vec = _selective_vectorised(*inputs, softplus)
    torch.testing.assert_close(y, y_vec, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h_last, h_vec, rtol=1e-10, atol=1e-10)


def test_selective_scan_reference_dtypes_and_nan():
    from framefuse.plugins.selective_scan import reference

    inputs = _ss_inputs(dtype=torch.float32)
    for i in (0, 1, 3, 4, 6):
        inputs[i] = inputs[i].to(torch.float16)
    inputs[0][0, 2, 1] = float("nan")
    y, h_last = reference(*inputs)
    assert y.dtype == torch.float16 and h_last.dtype == torch.float32
    assert torch.isnan(y[0, 2:, 1]).all() and not torch.isnan(y[0, :2, 1]).any()
    assert not torch.isnan(y[1]).any() and not torch.isnan(y[0, :, 0]).any()


def test_selective_scan_shape_rule():
    from framefuse.plugins.selective_scan import SCHEMA

    shapes = [(2, 6, 5), (2, 6, 5), (5, 3), (2, 6, 3), (2, 6, 3), (5,), None, (5,), (2, 5, 3)]
    assert SCHEMA.infer_shapes(shapes, {}) == [(2, 6, 5), (2, 5, 3)]
    assert SCHEMA.attrs_with_defaults({}) == {"delta_softplus": 1}
    with pytest.raises(SchemaError, match=r"SelectiveScan: state sizes .*A=3, B=4"):
        SCHEMA.infer_shapes([(2, 6, 5), (2, 6, 5), (5, 3), (2, 6, 4), (2, 6, 3)], {})
    with pytest.raises(SchemaError, match="N=300 exceeds the maximum 256"):
        SCHEMA.infer_shapes([(2, 6, 5), (2, 6, 5), (5, 300), (2, 6, 300), (2, 6, 300)], {})


def test_selective_scan_validation_errors():
    from framefuse.plugins.selective_scan import interface

    inputs = [t.float() for t in _ss_inputs()]
    with pytest.raises(OpArgumentError, match="SelectiveScan: argument x: expected a CUDA tensor"):
        interface.launch(inputs, {})
    interface.checked(inputs, cuda=False)  # the good case passes

    def with_(index, value):
        bad = list(inputs)
        bad[index] = value
        return bad

    cases = [
        (with_(2, torch.zeros(4, 3)), r"argument A: expected shape \[5, 3\], got \[4, 3\]"),
        (with_(2, torch.zeros(5, 300)), r"argument A: N=300 must be between 1 and 256"),
        (with_(2, torch.zeros(5, 0)), r"argument A: N=0 must be between 1 and 256"),
        (with_(2, torch.zeros(15)), r"argument A: expected rank 2 \[D, N\], got shape \[15\]"),
        (with_(3, None), r"argument B is required but was None"),
        (with_(2, inputs[2].half()), r"argument A: expected dtype float32, got float16"),
        (with_(1, inputs[1][:, :5].contiguous()), r"argument dt: expected shape \[2, 6, 5\]"),
        (with_(3, torch.zeros(2, 6, 4)), r"argument B: expected shape \[2, 6, 3\], got \[2, 6, 4\]"),
        (with_(5, torch.zeros(5, dtype=torch.float16)), r"argument D: expected dtype float32"),
        (with_(6, inputs[6].half()), r"argument z: expected dtype float32, got float16"),
        (with_(7, torch.zeros(4)), r"argument dt_bias: expected shape \[5\]"),
        (with_(8, torch.zeros(2, 5, 4)), r"argument h0: expected shape \[2, 5, 3\]"),
    ]
    for bad, message in cases:
        with pytest.raises(OpArgumentError, match="SelectiveScan: " + message):
            interface.checked(bad, cuda=False)
    with pytest.raises(OpArgumentError, match="delta_softplus=2 must be 0 or 1"):
        interface.launch(inputs, {"delta_softplus": 2})


def test_selective_scan_plan_covers_state():
    from framefuse.plugins.selective_scan import interface

    for nstate in (1, 3, 4, 5, 16, 33, 64, 128, 129, 200, 256):
        p = interface.plan(2, 10, 77, nstate, "float16")
        assert p["group"] * p["per_thread"] >= nstate and p["group"] <= 32
        assert p["grid"][0] * (interface.THREADS // p["group"]) >= 77
        assert p["shared_mem"] <= 48 * 1024
        assert p["kernel"].endswith("_f16")
    with pytest.raises(OpArgumentError, match="N=257"):
        interface.plan(1, 1, 1, 257, "float32")


class _FakeDriver:
    """Records cuLaunchKernel calls; answers like cuda.bindings.driver (tuples of (err, ...))."""

    class CUresult(int):
        pass

    def __init__(self, launch_error=0):
        self.launch_error = launch_error
        self.launches = []

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        # read the kernel parameters back through the void** array, as the driver would
        n = 3
        addresses = (ctypes.c_void_p * n).from_address(params)
        values = (
            ctypes.c_void_p.from_address(addresses[0]).value,
            ctypes.c_int.from_address(addresses[1]).value,
            ctypes.c_float.from_address(addresses[2]).value,
        )
        self.launches.append(((gx, gy, gz), (bx, by, bz), smem, stream, values, extra))
        return (self.CUresult(self.launch_error),)

    def cuGetErrorName(self, err):
        return (0, b"CUDA_ERROR_INVALID_VALUE")

    def cuGetErrorString(self, err):
        return (0, b"invalid argument")


def test_kernel_launch_packs_ctypes_params_and_reports_errors(monkeypatch):
    fake = _FakeDriver()
    monkeypatch.setattr(cuda, "_driver", lambda: fake)
    monkeypatch.setattr(cuda, "ensure_context", lambda device=None: None)
    kernel = cuda.Kernel("toy_f32", function="F", module="M", device=0, origin="test")
    kernel.launch((3, 2), 128, [cuda.ptr(None), cuda.i32(-7), cuda.f32(0.5)], stream=99)
    grid, block, smem, stream, values, extra = fake.launches[0]
    assert grid == (3, 2, 1) and block == (128, 1, 1) and smem == 0 and stream == 99 and extra == 0
    assert values == (None, -7, 0.5)  # a null pointer reads back as None

    fake.launch_error = 1
    with pytest.raises(cuda.KernelLaunchError) as info:
        kernel.launch(
            1, 32, [cuda.ptr(None), cuda.i32(1), cuda.f32(1.0)], stream=5, op="LinearScan", detail="a=[1, 2, 3]"
        )
    message = str(info.value)
    assert "LinearScan kernel toy_f32 launch failed [a=[1, 2, 3]]" in message
    assert "CUDA_ERROR_INVALID_VALUE: invalid argument" in message
