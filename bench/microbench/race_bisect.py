#!/usr/bin/env python
"""Run a few chained steps of one zoo architecture's step kernel with compiler settings changed,
for bisecting a sanitizer report between code generation choices (run it under
compute-sanitizer). Settings are MODULE.CONSTANT=VALUE of framefuse.compiler modules.

    compute-sanitizer --tool racecheck python bench/microbench/race_bisect.py xlstm codegen.PROLOGUE_GROUPS=1000
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> int:
    arch, settings = argv[0], argv[1:]
    for setting in settings:
        name, value = setting.split("=")
        module_name, constant = name.split(".")
        module = importlib.import_module(f"framefuse.compiler.{module_name}")
        setattr(module, constant, ast.literal_eval(value))
    from framefuse.engines import cuda_graph
    from framefuse.runtime.pipeline import prepare_cached
    from framefuse.runtime.session import Session

    prepared = prepare_cached(arch, {"model": {"embed": 64, "layers": 2}, "seq": 4, "seed": 0})["step"]
    engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
    session = Session(engine, budget_ms=None)
    frames = np.random.default_rng(0).standard_normal((3, *prepared.input_shapes()["x"])).astype(np.float32)
    for frame in frames:
        session.step(frame)
    session.get_state()
    print(arch, settings, "ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
