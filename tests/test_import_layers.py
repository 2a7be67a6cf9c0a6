"""The package's import graph (issue 22): no import cycle between framefuse's subpackages.

Every import of a framefuse module is counted, function-level ones too (an import inside a function
only hides a cycle from the interpreter, not from the design). Since session 36 the graph has no
cycle at all, of two subpackages or longer (a → b → c → a): the last one, compiler <-> engines,
went when the step kernel's plan and bindings moved to engines/stepkernel.py, the ONNX Slice
clamping both follow to framefuse/onnx_spec.py, and the lowering stopped folding constants with
the engines' executor (it folds them itself)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "framefuse"


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


def import_cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one subpackage (Tarjan's algorithm): each
    is a set of subpackages that reach one another through imports."""
    nodes = sorted({n for edge in edges for n in edge})
    after = {n: sorted(b for (a, b) in edges if a == n) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in after[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for n in nodes:
        if n not in index:
            visit(n)
    return cycles


def test_import_cycles_are_found_long_ones_too():
    edges = {("a", "b"): ["a.py:1"], ("b", "c"): ["b.py:1"], ("c", "a"): ["c.py:1"], ("c", "d"): ["c.py:2"]}
    assert import_cycles(edges) == [["a", "b", "c"]]
    del edges[("c", "a")]
    assert import_cycles(edges) == []


def test_no_import_cycle_between_subpackages():
    edges = import_edges()
    cycles = import_cycles(edges)
    sites = {" <-> ".join(c): {f"{a} -> {b}": edges[(a, b)] for a in c for b in c if (a, b) in edges} for c in cycles}
    assert not cycles, f"import cycles between subpackages (the importing sites): {sites}"


def test_the_compiler_sits_below_the_engines():
    """The step compiler lowers, schedules, generates and compiles; the engines run its kernel
    (engines/stepkernel.py) and offer it to the build's selection (engines/fusion.py)."""
    edges = import_edges()
    for high in ("engines", "runtime", "build", "parity", "precision", "rewrite", "artifact_folder"):
        assert ("compiler", high) not in edges, f"the compiler imports {high}: {edges[('compiler', high)]}"
    assert ("engines", "compiler") in edges


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
