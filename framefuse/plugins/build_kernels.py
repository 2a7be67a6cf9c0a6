"""Compile every fused-op kernel ahead of time with nvcc (`make kernels`).

    python -m framefuse.plugins.build_kernels [--arch 90 --arch 120 ...] [--check] [--jobs 2]

Each `framefuse/plugins/<op>/<op>.cu` becomes `framefuse/plugins/_kernels/<op>.fatbin` with SASS
for sm_75, 80, 86, 89, 90, 100, 120 and PTX for the newest (so newer GPUs can JIT it), next to a
sidecar `<op>.fatbin.json` recording the source digest (cuda.py skips a stale fatbin). One nvcc
call per file with every -gencode. `--check` compiles into a temporary folder and writes nothing
(CI runs it: a kernel that does not compile never lands). On failure it names the op, the arch
and prints nvcc's error, and exits non-zero. Needs nvcc, not a GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from framefuse.plugins.cuda import KERNELS_DIR, PLUGINS_DIR, source_digest

DEFAULT_ARCHS = (75, 80, 86, 89, 90, 100, 120)
NVCC_FLAGS = ("-std=c++17", "-O3", "-fatbin")


def find_nvcc() -> str | None:
    """$NVCC, nvcc on PATH, $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, /usr/local/cuda/bin/nvcc."""
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def kernel_sources() -> list[pathlib.Path]:
    """Every framefuse/plugins/*/*.cu, sorted."""
    return sorted(PLUGINS_DIR.glob("*/*.cu"))


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"release ([0-9.]+)", out)
    return match.group(1) if match else "unknown"


def supported_archs(nvcc: str) -> set[int] | None:
    """Real archs this nvcc can target (None if it cannot say)."""
    proc = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    return {int(m) for m in re.findall(r"^sm_(\d+)$", proc.stdout, re.MULTILINE)}


def gencode_flags(archs) -> list[str]:
    flags = []
    for arch in archs:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    newest = max(archs)
    flags += ["-gencode", f"arch=compute_{newest},code=compute_{newest}"]
    return flags


def _run_nvcc(nvcc: str, source: pathlib.Path, archs, output: pathlib.Path, quiet: bool):
    cmd = [nvcc, *NVCC_FLAGS, *gencode_flags(archs), "-o", str(output), str(source)]
    if quiet:
        cmd.insert(1, "-w")
    return subprocess.run(cmd, capture_output=True, text=True, check=False), cmd


def compile_one(nvcc: str, source: pathlib.Path, archs, out_dir: pathlib.Path, quiet: bool) -> dict:
    """Compile `source` into out_dir/<op>.fatbin (atomically). Returns a result record."""
    op = source.stem
    final = out_dir / f"{op}.fatbin"
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{op}.", suffix=".fatbin")
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    start = time.perf_counter()
    try:
        proc, cmd = _run_nvcc(nvcc, source, archs, tmp, quiet)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            failed = _failing_archs(nvcc, source, archs, out_dir)
            return {
                "op": op,
                "source": str(source),
                "ok": False,
                "seconds": seconds,
                "failed_archs": failed,
                "command": " ".join(cmd),
                "error": (proc.stderr or proc.stdout).strip(),
            }
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; installed fatbins must be world-readable
        os.replace(tmp, final)
        return {
            "op": op,
            "source": str(source),
            "ok": True,
            "seconds": seconds,
            "output": str(final),
            "warnings": proc.stderr.strip(),
        }
    finally:
        if tmp.exists():
            tmp.unlink()


def _failing_archs(nvcc: str, source: pathlib.Path, archs, out_dir: pathlib.Path) -> list[int]:
    """Which archs fail on their own (only run after a failure, to name the arch)."""
    failed = []
    for arch in archs:
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            cmd = [
                nvcc,
                "-w",
                *NVCC_FLAGS,
                "-gencode",
                f"arch=compute_{arch},code=sm_{arch}",
                "-o",
                os.path.join(tmp, "x.fatbin"),
                str(source),
            ]
            if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
                failed.append(arch)
    return failed


def build(
    archs=DEFAULT_ARCHS, *, check: bool = False, jobs: int = 2, sources=None, out_dir=None, log=print
) -> list[dict]:
    """Compile every kernel source. check=True: into a temporary folder, nothing kept.

    Returns one record per source (ok, seconds, error, failed_archs). Raises FileNotFoundError
    when nvcc is absent.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH)")
    sources = list(kernel_sources() if sources is None else sources)
    archs = sorted(set(int(a) for a in archs))
    known = supported_archs(nvcc)
    if known is not None:
        skipped = [a for a in archs if a not in known]
        for a in skipped:
            log(f"skipping sm_{a}: nvcc {nvcc_version(nvcc)} cannot target it")
        archs = [a for a in archs if a in known]
    if not archs:
        raise ValueError("no architecture left to compile for")
    version = nvcc_version(nvcc)

    tmp_ctx = tempfile.TemporaryDirectory(prefix="framefuse-kernels-") if check else None
    target = pathlib.Path(tmp_ctx.name) if tmp_ctx else pathlib.Path(out_dir or KERNELS_DIR)
    target.mkdir(parents=True, exist_ok=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(compile_one, nvcc, src, archs, target, check) for src in sources]
            results = [f.result() for f in futures]
        for rec in results:
            if rec["ok"] and not check:
                meta = {
                    "op": rec["op"],
                    "source_sha256": source_digest(pathlib.Path(rec["source"])),
                    "archs": [f"sm_{a}" for a in archs],
                    "ptx": f"compute_{max(archs)}",
                    "nvcc": version,
                    "flags": list(NVCC_FLAGS),
                }
                sidecar = target / f"{rec['op']}.fatbin.json"
                tmp_meta = sidecar.with_suffix(".json.tmp")
                tmp_meta.write_text(json.dumps(meta, indent=2) + "\n")
                os.replace(tmp_meta, sidecar)
    finally:
        if tmp_ctx:
            tmp_ctx.cleanup()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m framefuse.plugins.build_kernels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--arch",
        action="append",
        type=lambda s: int(s.removeprefix("sm_")),
        help="compute capability to build for, e.g. 90 or sm_90 (repeatable; default: "
        + ", ".join(map(str, DEFAULT_ARCHS))
        + ")",
    )
    parser.add_argument("--check", action="store_true", help="compile into a temporary folder only (CI)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes (default 2)")
    parser.add_argument("--op", action="append", help="only this op folder (repeatable)")
    args = parser.parse_args(argv)

    sources = kernel_sources()
    if args.op:
        sources = [s for s in sources if s.parent.name in args.op or s.stem in args.op]
        if not sources:
            print(f"error: no kernel source for {args.op}", file=sys.stderr)
            return 2
    start = time.perf_counter()
    try:
        results = build(args.arch or DEFAULT_ARCHS, check=args.check, jobs=args.jobs, sources=sources)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in results if not r["ok"]]
    for r in results:
        if r["ok"]:
            where = "checked" if args.check else f"-> {r['output']}"
            print(f"ok     {r['op']:<20} {r['seconds']:6.1f} s  {where}")
        else:
            archs = (
                ", ".join(f"sm_{a}" for a in r["failed_archs"])
                or "(every arch alone compiles; the combined call failed)"
            )
            print(
                f"FAILED {r['op']:<20} {r['seconds']:6.1f} s  arch {archs}\n  {r['command']}\n{r['error']}",
                file=sys.stderr,
            )
    print(f"{len(results) - len(failed)}/{len(results)} kernels compiled in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
