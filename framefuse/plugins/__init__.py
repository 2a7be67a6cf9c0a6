"""framefuse fused ops (domain `framefuse`): one package per op with its schema, plain-loop
reference, CUDA kernel and launcher. See OPS.md for the contract; `registry` finds the op folders
(`registry.OP_TYPES`, `registry.get_op`, `registry.add_op_package` for ops of your own package).

Importing this package is cheap and needs neither cuda-python nor a GPU.
"""

from framefuse.plugins.registry import DOMAIN, get_op, get_schema

__all__ = ["DOMAIN", "get_op", "get_schema"]
