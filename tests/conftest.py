import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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


def load_by_path(module_name: str, path: Path):
    """A module from its file: tests/ is not a package, and bench/'s scripts are run as scripts."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def control_flow_graphs():
    """tests/control_flow_graphs.py."""
    return load_by_path("framefuse_tests_control_flow_graphs", Path(__file__).with_name("control_flow_graphs.py"))


@pytest.fixture(scope="session")
def bench_script():
    """bench_script("rnn_sizes"): bench/rnn_sizes.py as a module, loaded once a session."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            loaded[name] = load_by_path(f"framefuse_bench_{name}", REPO / "bench" / f"{name}.py")
        return loaded[name]

    return load
