"""Polygraphy runners besides ONNX Runtime.

``OnnxReferenceRunner`` runs a model with ``onnx.reference.ReferenceEvaluator`` (numpy of the ONNX
spec). It is the oracle for graphs ONNX Runtime cannot run, e.g. ``LSTM``/``GRU`` with
``layout=1`` (ORT: "Batchwise recurrent operations (layout == 1) are not supported") or ops newer
than the installed ORT. framefuse nodes are not supported by it (use ORT for the fused side).
"""

from __future__ import annotations

import numpy as np
import onnx
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType

from framefuse.plugins.ort_bridge import load_any


class OnnxReferenceRunner(BaseRunner):
    def __init__(self, model, name: str | None = None):
        super().__init__(name=name, prefix="onnx-reference-runner")
        self._proto, self.label = load_any(model)

    def activate_impl(self):
        from onnx.reference import ReferenceEvaluator

        self._evaluator = ReferenceEvaluator(self._proto)

    def get_input_metadata_impl(self):
        meta = TensorMetadata()
        initializers = {i.name for i in self._proto.graph.initializer}
        for vi in self._proto.graph.input:
            if vi.name in initializers:
                continue
            tt = vi.type.tensor_type
            np_dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
            meta.add(vi.name, dtype=DataType.from_dtype(np.dtype(np_dtype)), shape=shape)
        return meta

    def infer_impl(self, feed_dict):
        import time

        names = [o.name for o in self._proto.graph.output]
        start = time.perf_counter()
        outputs = self._evaluator.run(None, dict(feed_dict))
        self.inference_time = time.perf_counter() - start  # Polygraphy's Comparator reads it
        return dict(zip(names, (np.ascontiguousarray(o) for o in outputs)))

    def deactivate_impl(self):
        del self._evaluator
