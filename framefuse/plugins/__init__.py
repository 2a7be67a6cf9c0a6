"""framefuse fused ops (domain `framefuse`): one package per op with its schema, plain-loop
reference, CUDA kernel and launcher. See OPS.md for the contract and `registry.get_op`.

Importing this package is cheap and needs neither cuda-python nor a GPU.
"""

from framefuse.plugins.registry import DOMAIN, OP_TYPES, get_op, get_schema

__all__ = ["DOMAIN", "OP_TYPES", "get_op", "get_schema"]
