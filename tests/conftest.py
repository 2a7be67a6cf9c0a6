import importlib.util

import pytest


def _has_cuda_gpu() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
    except Exception:
        return False
    return importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None


HAS_GPU = _has_cuda_gpu()
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU with cuda-python (not present here)")
    skip_trt = pytest.mark.skip(reason="needs TensorRT (not importable here)")
    for item in items:
        # get_closest_marker, not item.keywords: keywords also hold folder names (tests/gpu/).
        if item.get_closest_marker("gpu") and not HAS_GPU:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("tensorrt") and not HAS_TENSORRT:
            item.add_marker(skip_trt)


@pytest.fixture(scope="session")
def control_flow_graphs():
    """tests/control_flow_graphs.py (loaded by path: tests/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name("control_flow_graphs.py")
    spec = importlib.util.spec_from_file_location("framefuse_tests_control_flow_graphs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
