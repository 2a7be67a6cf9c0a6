"""Engines: turn an ONNX graph into something that runs. One module per backend, one registry.

- :mod:`framefuse.engines.registry` — the backends (``ENGINES``: cuda-graph, onnxruntime,
  tensorrt), ``get_backend(name)``, ``unavailable_reason(name)``, ``backend_for_artifact(path)``.
- :mod:`framefuse.engines.base` — what they share: ``EngineRunner`` (a Polygraphy runner),
  ``IOSpec``, ``EngineBuildError`` / ``EngineRunError``.
- :mod:`framefuse.engines.cuda_graph` — torch + framefuse kernels, one captured CUDA graph per
  input shape (eagerly on the CPU for tests): ``build_engine``, artifact ``engine.ffe``.
- :mod:`framefuse.engines.onnxruntime` — ONNX Runtime with I/O binding: artifact ``engine.ort``.
- :mod:`framefuse.engines.artifact` — metadata, atomic writes, foreign/stale refusal.
- :mod:`framefuse.engines.ops` — the standard ONNX op table of the cuda-graph executor.

Names are loaded lazily so ``framefuse --help`` does not import torch.
"""

from __future__ import annotations

from framefuse._lazy import lazy_getattr

_EXPORTS = {
    "ENGINES": "framefuse.engines.registry",
    "EngineKind": "framefuse.engines.registry",
    "get_backend": "framefuse.engines.registry",
    "unavailable_reason": "framefuse.engines.registry",
    "backend_for_artifact": "framefuse.engines.registry",
    "EngineRunner": "framefuse.engines.base",
    "IOSpec": "framefuse.engines.base",
    "EngineBuildError": "framefuse.engines.base",
    "EngineRunError": "framefuse.engines.base",
    "build_engine": "framefuse.engines.cuda_graph",
    "CudaGraphEngine": "framefuse.engines.cuda_graph",
    "Binding": "framefuse.engines.cuda_graph",
    "save_engine": "framefuse.engines.cuda_graph",
    "load_engine": "framefuse.engines.cuda_graph",
    "OnnxRuntimeRunner": "framefuse.engines.onnxruntime",
    "GraphExecutor": "framefuse.engines.executor",
    "UnsupportedOpError": "framefuse.engines.ops",
    "ArtifactError": "framefuse.engines.artifact",
    "ForeignArtifactError": "framefuse.engines.artifact",
    "StaleArtifactError": "framefuse.engines.artifact",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
