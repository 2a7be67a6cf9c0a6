"""The build stage: an ONNX graph (or an artifact folder) → an engine, one place for everything a
build does above the backends, so ``framefuse build``, ``Session.load`` and the benchmark build the
same way:

- the source: which file of an artifact folder (:mod:`framefuse.artifact_folder`);
- the precision: the graph converted by :mod:`framefuse.precision` and its accuracy gate
  (:func:`convert_precision`, with the int8 weight-only fallback);
- the backend's build (:func:`framefuse.engines.registry.get_backend`), which runs the build-time
  selection of the cuda-graph engine, and writes the artifact atomically;
- the parity gate: the built engine against ONNX Runtime on the original graph (:func:`parity_gate`).

The engines below only build and run one backend; they never import this stage.
"""

from __future__ import annotations

from framefuse._lazy import lazy_getattr

# ``framefuse build --help`` imports framefuse.build.cli: the stage (torch, onnx) loads on first use
_EXPORTS = {
    name: "framefuse.build.stage"
    for name in ("Built", "build_engine", "convert_precision", "int8_fallback", "parity_gate", "resolve_source")
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
