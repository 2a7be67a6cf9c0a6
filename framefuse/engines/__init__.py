"""Engines: turn ``model.fused.onnx`` into something that runs.

- :mod:`framefuse.engines.cuda_graph` — the cuda-graph engine (torch + framefuse kernels, one
  captured CUDA graph per input shape; eagerly on the CPU for tests): ``build_engine``.
- :mod:`framefuse.engines.artifact` — the ``engine.ffe`` artifact: ``save_engine`` / ``load_engine``.
- :mod:`framefuse.engines.ops` — the standard ONNX op table.

Names are loaded lazily so ``framefuse --help`` does not import torch.
"""

from __future__ import annotations

from framefuse._lazy import lazy_getattr

_EXPORTS = {
    "build_engine": "framefuse.engines.cuda_graph",
    "CudaGraphEngine": "framefuse.engines.cuda_graph",
    "Binding": "framefuse.engines.cuda_graph",
    "GraphExecutor": "framefuse.engines.executor",
    "EngineBuildError": "framefuse.engines.executor",
    "EngineRunError": "framefuse.engines.executor",
    "UnsupportedOpError": "framefuse.engines.ops",
    "save_engine": "framefuse.engines.artifact",
    "load_engine": "framefuse.engines.artifact",
    "ArtifactError": "framefuse.engines.artifact",
    "ForeignArtifactError": "framefuse.engines.artifact",
    "StaleArtifactError": "framefuse.engines.artifact",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
