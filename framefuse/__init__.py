"""framefuse: compile sequence models (RNNs, SSMs, attention) into fused low-latency engines."""

__version__ = "0.1.0"

from framefuse.errors import FrameFuseError  # noqa: E402

__all__ = ["FrameFuseError", "__version__"]
