#!/usr/bin/env python
"""Every build tactic's step kernel for the zoo, as hashes: what a refactor of the compiler must
leave byte for byte (no GPU; the step compiler's generation only).

For each zoo architecture (step form and T = 32 window at ``--embed``, 2 layers) and each build
tactic (engines/fusion.stepkernel_tactics, fp32 and, for step forms, the fp16 build's), the kernel
generated for ``--grid`` blocks of the H100 (engine.prepare_tactics without NVRTC): its source and
range table hash (``Kernel.identity``) and ``describe()``; the plain and fewer-phases kernels'
resident twins; and the one-block recurrence variants (ring, together, helpers, lanes, views,
paced / skewed / pieces) of small lstm / gru / liquid windows, launched and resident.

    python bench/kernel_identities.py --out /tmp/before.json            # before the change
    python bench/kernel_identities.py --out /tmp/after.json             # after it
    python bench/kernel_identities.py --compare /tmp/before.json /tmp/after.json

Session 56 checked the CodeSettings refactor this way: 934 kernels, identical (10 minutes a run on
a 2-core CPU). ``--archs`` narrows the zoo; the comparison exits 1 and names what differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

H100 = {"cc": (9, 0), "sm_count": 132, "max_shared_per_block_optin": 227 * 1024, "name": "NVIDIA H100 80GB HBM3"}
RESIDENT_TWINS = ("stepkernel", "stepkernel-384-threads-fewer-phases")
RECURRENCE_VARIANTS = {
    "plain": {"take_together": False, "input_helpers": False},  # the ring, each word taken alone
    "together": {"take_together": True, "input_helpers": False},
    "helpers": {"input_helpers": True},
    "helpers-ahead4": {"input_helpers": True, "inputs_ahead": 4},
    "ahead4": {"inputs_ahead": 4},
    "lanes": {"lane_cells": True},
    "lanes-ahead4-together": {"lane_cells": True, "inputs_ahead": 4, "take_together": True},
    "views-one-pass": {"alias_views": True, "one_pass": True},
    "paced-skewed-pieces": {"paced_copies": True, "skewed_sums": True, "copy_pieces": 1024},
}


def _entry(kernel) -> dict:
    return {"identity": kernel.identity, "describe": kernel.describe()}


def identities(archs, *, embed: int = 256, grid: int = 132, log=print) -> dict:
    from framefuse.compiler import lower_program
    from framefuse.compiler.codegen import generate
    from framefuse.compiler.engine import STATIC_SMEM_RESERVE, prepare_tactics
    from framefuse.compiler.schedule import schedule
    from framefuse.engines.fusion import stepkernel_tactics
    from framefuse.runtime.pipeline import prepare_cached

    props = dict(H100, sm_count=grid)
    smem = props["max_shared_per_block_optin"] - STATIC_SMEM_RESERVE
    found: dict[str, object] = {}
    for arch in archs:
        for form in ("step", "sequence"):
            prepared = prepare_cached(arch, {"model": {"embed": embed, "layers": 2}, "seq": 32, "seed": 0})[form]
            if prepared.fused is None:
                found[f"{arch}/{form}"] = f"not fused: {prepared.fused_error}"
                continue
            for precision in ("fp32", "fp16") if form == "step" else ("fp32",):
                start = time.perf_counter()
                sources = prepare_tactics(
                    str(prepared.fused), props, stepkernel_tactics(precision), compile_image=lambda s: 0.0
                )
                for name, source in sources.items():
                    key = f"{arch}/{form}/{precision}/{name}"
                    if isinstance(source, Exception):
                        found[key] = f"declined: {type(source).__name__}: {str(source)[:200]}"
                        continue
                    found[key] = _entry(source.kernel)
                    if name in RESIDENT_TWINS and precision == "fp32":
                        twin = generate(
                            source.schedule,
                            smem_limit_bytes=smem,
                            prefetch=source.prefetch,
                            resident=True,
                            settings=source.kernel.settings,
                        )
                        found[f"{key}/resident"] = _entry(twin)
                log(f"{arch} {form} {precision}: {len(sources)} tactics ({time.perf_counter() - start:.1f} s)")
    for arch in [a for a in ("lstm", "gru", "liquid") if a in archs]:
        prepared = prepare_cached(arch, {"model": {"embed": 64, "layers": 2}, "seq": 16, "seed": 0})["sequence"]
        sched = schedule(lower_program(prepared.fused), grid=grid, threads=256, smem_floats=smem // 8)
        for variant, fields in RECURRENCE_VARIANTS.items():
            for resident in (False, True):
                kernel = generate(sched, smem_limit_bytes=smem, resident=resident, **fields)
                found[f"{arch}/window64/{variant}/{'resident' if resident else 'launched'}"] = _entry(kernel)
        log(f"{arch} window at embed 64: {len(RECURRENCE_VARIANTS)} variants, launched and resident")
    return found


def compare(before: dict, after: dict) -> list[str]:
    """What differs between two runs' JSON: a kernel only one has, or another identity or describe()."""
    problems = [f"only in the first: {k}" for k in sorted(set(before) - set(after))]
    problems += [f"only in the second: {k}" for k in sorted(set(after) - set(before))]
    for key in sorted(set(before) & set(after)):
        a, b = before[key], after[key]
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            what = ["source or range table"] if a["identity"] != b["identity"] else []
            keys = sorted(set(a["describe"]) | set(b["describe"]))
            what += [
                f"describe[{k}] {a['describe'].get(k)!r} -> {b['describe'].get(k)!r}"
                for k in keys
                if a["describe"].get(k) != b["describe"].get(k)
            ]
            problems.append(f"{key}: {'; '.join(what)}")
        else:
            problems.append(f"{key}: {str(a)[:120]!r} -> {str(b)[:120]!r}")
    return problems


def main(argv=None) -> int:
    from framefuse.models import ARCHITECTURES

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="write the identities here (JSON)")
    parser.add_argument("--archs", default=",".join(ARCHITECTURES), help="zoo architectures, comma-separated")
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--grid", type=int, default=132, help="blocks (the H100's SMs by default)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        problems = compare(before, after)
        for line in problems:
            print(line)
        print(f"{len(before)} / {len(after)} kernels, {len(problems)} difference(s)")
        return 1 if problems else 0
    if args.out is None:
        parser.error("give --out FILE (or --compare BEFORE AFTER)")
    archs = [a for a in args.archs.split(",") if a]
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown:
        parser.error(f"unknown architecture(s) {', '.join(unknown)}: expected some of {', '.join(ARCHITECTURES)}")
    found = identities(archs, embed=args.embed, grid=args.grid, log=lambda line: print(line, flush=True))
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(found, indent=1, sort_keys=True, default=str))
    partial.replace(args.out)
    print(f"wrote {len(found)} kernels' identities to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
