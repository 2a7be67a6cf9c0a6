"""Every fused-op kernel compiles with nvcc for every target arch (CI runs this without a GPU).

One nvcc call per .cu with every -gencode (sm_75 … sm_120 + PTX), two files at a time, into a
temporary folder (`python -m framefuse.plugins.build_kernels --check`).
"""

from __future__ import annotations

import pytest

from framefuse.plugins import build_kernels

NVCC = build_kernels.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set NVCC or CUDA_HOME): kernels not compiled")


def test_every_op_folder_kernel_is_found():
    names = {p.stem for p in build_kernels.kernel_sources()}
    assert {"linear_scan", "selective_scan"} <= names
    for source in build_kernels.kernel_sources():
        assert source.parent.parent.name == "plugins" and source.stem == source.parent.name, source


def test_gencode_flags_cover_default_archs_and_ptx_for_newest():
    flags = build_kernels.gencode_flags(build_kernels.DEFAULT_ARCHS)
    joined = " ".join(flags)
    for arch in (75, 80, 86, 89, 90, 100, 120):
        assert f"arch=compute_{arch},code=sm_{arch}" in joined
    assert "arch=compute_120,code=compute_120" in joined


@needs_nvcc
def test_every_kernel_compiles_for_every_arch():
    records = build_kernels.build(check=True, jobs=2, log=lambda *_: None)
    failures = [f"{r['op']}: archs {r['failed_archs']}\n{r['command']}\n{r['error']}" for r in records if not r["ok"]]
    assert not failures, "kernels that do not compile:\n" + "\n\n".join(failures)
    assert len(records) == len(build_kernels.kernel_sources())


@needs_nvcc
def test_compile_failure_names_op_and_arch(tmp_path):
    (tmp_path / "broken").mkdir()
    source = tmp_path / "broken" / "broken.cu"
    source.write_text('extern "C" __global__ void broken_f32(float* x) { x[0] = undefined_name; }\n')
    records = build_kernels.build([90], check=True, sources=[source], log=lambda *_: None)
    assert not records[0]["ok"]
    assert records[0]["op"] == "broken" and records[0]["failed_archs"] == [90]
    assert "undefined_name" in records[0]["error"]


@needs_nvcc
def test_build_writes_fatbin_and_sidecar(tmp_path):
    import json

    from framefuse.plugins.cuda import source_digest

    source = tmp_path / "tiny" / "tiny.cu"
    source.parent.mkdir()
    source.write_text('extern "C" __global__ void tiny_f32(float* x) { x[threadIdx.x] = 1.0f; }\n')
    records = build_kernels.build([90], sources=[source], out_dir=tmp_path / "out", log=lambda *_: None)
    assert records[0]["ok"], records[0].get("error")
    fatbin = tmp_path / "out" / "tiny.fatbin"
    meta = json.loads((tmp_path / "out" / "tiny.fatbin.json").read_text())
    assert fatbin.stat().st_size > 0 and meta["source_sha256"] == source_digest(source)
    assert meta["archs"] == ["sm_90"] and meta["ptx"] == "compute_90"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tiny.fatbin", "tiny.fatbin.json"]


@needs_nvcc
def test_cli_check_exit_codes(tmp_path, capsys):
    assert build_kernels.main(["--check", "--arch", "sm_90", "--op", "linear_scan"]) == 0
    assert "1/1 kernels compiled" in capsys.readouterr().out
    assert build_kernels.main(["--check", "--op", "no_such_op"]) == 2
