"""ONNX Runtime sessions of fused graphs must survive Python-op registrations made after them.

onnxruntime-extensions keeps Python ops in ``std::map<domain, std::vector<PyCustomOpFactory>>``
and gives ONNX Runtime raw pointers into the vectors; ORT calls through them on every run. The
bridge used to put every signature into the shared ``ai.onnx.contrib`` vector, so a session made
before a new signature was registered ran through freed memory (SIGSEGV). Each pattern below runs
in a child process, because the failure kills the interpreter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from framefuse.plugins.ort_bridge import CONTRIB_DOMAIN, OP_DOMAIN_PREFIX, _ortx, prepare_for_ort

ROOT = Path(__file__).resolve().parents[1]


def linear_scan_model(with_h0: bool, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    shape = [2, 5, 3]
    inputs = [helper.make_tensor_value_info(n, dtype, shape) for n in ("a", "b")]
    if with_h0:
        inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, [2, 3]))
    node = helper.make_node("LinearScan", [i.name for i in inputs], ["h", "h_last"], name="scan", domain="framefuse")
    outputs = [
        helper.make_tensor_value_info("h", dtype, shape),
        helper.make_tensor_value_info("h_last", TensorProto.FLOAT, [2, 3]),
    ]
    graph = helper.make_graph([node], "scan", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("framefuse", 1)])


def test_each_signature_gets_a_domain_of_its_own():
    ortx = _ortx()
    first = prepare_for_ort(linear_scan_model(False))
    second = prepare_for_ort(linear_scan_model(True))
    ops_before = len(ortx.Opdef._odlist)
    again = prepare_for_ort(linear_scan_model(False))
    assert len(ortx.Opdef._odlist) == ops_before, "a known signature must not be registered twice"
    (n1,), (n2,), (n3,) = first.graph.node, second.graph.node, again.graph.node
    assert n1.domain == OP_DOMAIN_PREFIX + n1.op_type and n2.domain == OP_DOMAIN_PREFIX + n2.op_type
    assert n1.domain != n2.domain and (n3.domain, n3.op_type) == (n1.domain, n1.op_type)
    assert {i.domain for i in first.opset_import} == {"", n1.domain}
    names = {od.op_type for od in ortx.Opdef._odlist.values()}
    assert f"{n1.domain}::{n1.op_type}" in names and f"{n2.domain}::{n2.op_type}" in names
    assert not any(name == n1.op_type or name.startswith(CONTRIB_DOMAIN) for name in names)


# The crash pattern: session A exists, new signatures get registered (growing the library's op
# container), freed heap is overwritten, then A runs and is destroyed. Exits non-zero / by a
# signal on failure; prints "PASSED <n>" after n patterns.
CHILD = textwrap.dedent(
    r"""
    import sys
    import numpy as np
    from onnx import TensorProto
    sys.path.insert(0, sys.argv[3])
    from tests.test_ort_bridge_stability import linear_scan_model
    from framefuse.plugins import ort_bridge
    from framefuse.engines.onnxruntime import OnnxRuntimeRunner

    mode, iterations = sys.argv[1], int(sys.argv[2])
    if mode == "shared-domain":
        # The scheme the bridge used before: every signature in ai.onnx.contrib.
        import hashlib

        def old_register(op_type, present, in_dtypes, out_dtypes, attrs):
            key = repr((op_type, present, in_dtypes, out_dtypes, sorted(attrs)))
            name = "OLD_" + op_type + "_" + hashlib.sha1(key.encode()).hexdigest()[:10]
            if name not in ort_bridge._REGISTERED:
                ort_bridge._REGISTERED[name] = ort_bridge._ortx().onnx_op(
                    op_type=name, inputs=[ort_bridge._pyop_type(d) for d in in_dtypes],
                    outputs=[ort_bridge._pyop_type(d) for d in out_dtypes],
                    attrs={k: ort_bridge._attr_type(v) for k, v in attrs.items()},
                )(ort_bridge._make_function(op_type, present, out_dtypes, len(out_dtypes)))
            return ort_bridge.CONTRIB_DOMAIN, name

        ort_bridge._register = old_register

    def expected(a, b, h0):
        h, hs = h0.astype(np.float64), []
        for t in range(a.shape[1]):
            h = a[:, t] * h + b[:, t]
            hs.append(h)
        return np.stack(hs, 1), h

    rng = np.random.default_rng(0)
    f32 = ["float32", "float32"]
    for it in range(iterations):
        with_h0 = bool(it % 2)
        model = linear_scan_model(with_h0, TensorProto.DOUBLE if it % 4 >= 2 else TensorProto.FLOAT)
        if it % 3 == 0:
            runner = OnnxRuntimeRunner(model, options={"fused": True})
            run = lambda feeds: [runner.run(feeds)[k] for k in ("h", "h_last")]
        else:
            session = ort_bridge.ort_session(model)
            run = lambda feeds: session.run(["h", "h_last"], feeds)
        # New signatures after A exists: a second model, then signatures told apart by attribute names.
        other = ort_bridge.ort_session(linear_scan_model(not with_h0))
        for j in range(5):
            ort_bridge._register("LinearScan", (True, True, False), f32, f32, {f"pad_{it}_{j}": 0})
        spray = [bytes([0x41]) * size for size in range(24, 6000, 8) for _ in range(2)]
        dtype = np.float64 if it % 4 >= 2 else np.float32
        a = rng.uniform(0.5, 1.0, (2, 5, 3)).astype(dtype)
        b = rng.standard_normal((2, 5, 3)).astype(dtype)
        feeds = {"a": a, "b": b}
        h0 = np.zeros((2, 3))
        if with_h0:
            feeds["h0"] = rng.standard_normal((2, 3)).astype(np.float32)
            h0 = feeds["h0"]
        for _ in range(2):
            h, h_last = run(feeds)
        want_h, want_last = expected(a, b, h0)
        np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(h_last, want_last, rtol=1e-5, atol=1e-5)
        del run, other, spray
        runner = session = None
    print("PASSED", iterations, flush=True)
    """
)


def run_child(mode: str, iterations: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(iterations), str(ROOT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sessions_survive_later_registrations():
    # 4 processes × 10 patterns; the unfixed bridge crashed in every process on its first pattern.
    for attempt in range(4):
        proc = run_child("per-signature-domain", 10)
        assert proc.returncode == 0, (
            f"child {attempt} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
        assert "PASSED 10" in proc.stdout


def test_the_pattern_crashes_the_shared_domain_scheme():
    """Control: the same child with the old registration scheme dies, so the test above would see the bug."""
    proc = run_child("shared-domain", 10)
    if proc.returncode == 0:
        pytest.skip("onnxruntime-extensions no longer crashes on the shared-domain pattern (library fixed?)")
    assert proc.returncode == -signal.SIGSEGV or "Segmentation fault" in proc.stderr, proc.stderr[-4000:]
    assert "PASSED" not in proc.stdout


def test_a_session_with_python_ops_does_not_spin_and_one_without_keeps_the_default():
    """ONNX Runtime's pool threads spin after each node; with framefuse's Python ops in the graph
    they take the cores from the op's torch threads (fused zoo step graphs ran 3-6x slower), so
    such a session turns spinning off. A plain graph keeps ORT's default (the ORT CPU peer)."""
    import numpy as np

    from framefuse.plugins.ort_bridge import ort_session

    key = "session.intra_op.allow_spinning"
    fused = ort_session(linear_scan_model(with_h0=False))
    assert fused.get_session_options().get_session_config_entry(key) == "0"
    a = np.full((2, 5, 3), 0.5, np.float32)
    h, h_last = fused.run(None, {"a": a, "b": np.ones((2, 5, 3), np.float32)})
    np.testing.assert_allclose(h_last, np.full((2, 3), 2 * (1 - 0.5**5)), rtol=1e-6)  # h = a h + b
    node = helper.make_node("Relu", ["x"], ["y"])
    plain = helper.make_model(
        helper.make_graph(
            [node],
            "plain",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(Exception, match="does not have configuration"):  # ORT: an entry never set
        ort_session(plain).get_session_options().get_session_config_entry(key)
