"""The package's import graph (issue 22): no new two-way import between framefuse's subpackages.

Every import of a framefuse module is counted, function-level ones too (an import inside a function
only hides a cycle from the interpreter, not from the design). The cycles that exist today are
listed below with what closes them; each is to go with the build stage that issue 22 describes,
and this test fails on any cycle that is not in the list, and on a listed one that is gone (so
the list shrinks with the code). Only cycles of two subpackages are checked; longer ones (a → b →
c → a) are not yet."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "framefuse"

# (a, b): a imports b and b imports a, at the sites named, today
KNOWN_CYCLES = {
    ("compiler", "engines"): "compiler/engine.py implements the engines' binding contract (engines/base.py) and "
    "compiler/lower.py folds constants with engines' executor; engines/fusion.py offers the step kernel to the "
    "cuda-graph engine's selection",
}


def _subpackage(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) subpackages of framefuse -> the import sites."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _subpackage(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                # ``from framefuse import x`` imports the subpackage x
                names = [f"framefuse.{a.name}" for a in node.names] if node.module == "framefuse" else [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "framefuse" or len(parts) < 2:
                    continue
                target = parts[1]
                if target != source:
                    edges.setdefault((source, target), []).append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return edges


def test_no_import_cycle_between_subpackages_but_the_known_ones():
    edges = import_edges()
    cycles = {tuple(sorted((a, b))) for (a, b) in edges if (b, a) in edges}
    new = {c: (edges[c], edges[c[::-1]]) for c in cycles - set(KNOWN_CYCLES)}
    assert not new, f"a new import cycle between subpackages (importer sites both ways): {new}"
    gone = set(KNOWN_CYCLES) - cycles
    assert not gone, f"these cycles are gone: take them off KNOWN_CYCLES: {sorted(gone)}"


def test_the_layers_that_hold_today_stay():
    """Removed on 2026-11-26: the ONNX Runtime custom-op bridge moved from parity/ to plugins/, the
    atomic writes come from framefuse.files, so plugins, the rewrite passes and precision do not
    reach up into parity."""
    edges = import_edges()
    for low, high in [("plugins", "parity"), ("plugins", "engines"), ("precision", "parity"), ("compiler", "parity")]:
        assert (low, high) not in edges, f"{low} imports {high}: {edges[(low, high)]}"
    rewrite_to_parity = [site for site in edges.get(("rewrite", "parity"), []) if not site.startswith("rewrite/cli.py")]
    assert not rewrite_to_parity, f"rewrite passes import parity: {rewrite_to_parity}"


def test_the_build_stage_sits_above_the_engines():
    """Session 35: ``framefuse build``'s orchestration left engines/cli.py for framefuse/build/
    (source, precision and its gate, the backend's build, the parity gate), the artifact folder's
    layout is read in one module (framefuse/artifact_folder.py) and the default engine lives in the
    registry, which closed the engines <-> runtime / parity / precision and parity <-> rewrite cycles.
    The engines never reach up to the stages that use them; the build never reaches the runtime
    (Session.load builds through it); the folder layout depends on nothing but the registry."""
    edges = import_edges()
    for high in ("runtime", "parity", "precision", "build", "rewrite", "artifact_folder"):
        assert ("engines", high) not in edges, f"engines import {high}: {edges[('engines', high)]}"
    assert ("build", "runtime") not in edges, f"the build imports the runtime: {edges[('build', 'runtime')]}"
    assert ("parity", "rewrite") not in edges, f"parity imports rewrite: {edges[('parity', 'rewrite')]}"
    allowed = {"engines", "errors"}
    reached = {b for (a, b) in edges if a == "artifact_folder"}
    assert reached <= allowed, f"artifact_folder imports {sorted(reached - allowed)}"
    assert ("runtime", "build") in edges, "Session.load builds through the build stage"
    assert (PACKAGE / "engines" / "cli.py").exists() is False
