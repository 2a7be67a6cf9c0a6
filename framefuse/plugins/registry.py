"""op_type → op package, shared by the rewrite passes, the ONNX Runtime custom-op bridge and the
engines.

An op is one folder: `framefuse/plugins/<folder>/` holding `schema.py` (its `OpSchema`), and a
package that exports SCHEMA, `reference` (naive.py) and `launch` (the CUDA entry). The folders are
found, not listed: every sub-folder of an op package root (this package, and any added with
`add_op_package`) that has a `schema.py` is an op, named by the `OpSchema(name=...)` in that file.
The name is read from the file's source (a string literal, or a module-level string constant), so
finding the ops imports nothing: `import framefuse.plugins.registry` costs nothing, and an op
whose package is broken only fails when someone asks for it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from framefuse.errors import FrameFuseError

DOMAIN = "framefuse"
VERSION = 1

# op_type (ONNX node op_type in domain `framefuse`) → its package's module name.
OP_MODULES: dict[str, str] = {}
OP_TYPES: tuple[str, ...] = ()
# folder → why its op name could not be read (reported by get_op's "unknown op" error).
UNREADABLE: dict[str, str] = {}


class UnknownOpError(FrameFuseError):
    """An op_type that is not part of the framefuse op set."""


class OpUnavailableError(FrameFuseError):
    """An op of the op set whose package cannot be imported."""


_cache: dict[str, ModuleType] = {}


def get_op(op_type: str) -> ModuleType:
    """The package of `op_type` (exports SCHEMA, reference, launch and a friendly entry)."""
    module = _cache.get(op_type)
    if module is not None:
        return module
    module_name = OP_MODULES.get(op_type)
    if module_name is None:
        unread = "".join(f"; not read: {where}: {why}" for where, why in UNREADABLE.items())
        raise UnknownOpError(f"unknown framefuse op {op_type!r} (known: {', '.join(OP_TYPES)}{unread})")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise OpUnavailableError(f"framefuse op {op_type}: package {module_name} does not exist") from exc
        raise
    schema = getattr(module, "SCHEMA", None)
    if schema is None or schema.name != op_type:
        raise OpUnavailableError(f"framefuse op {op_type}: {module_name} does not export SCHEMA for {op_type}")
    _cache[op_type] = module
    return module


def get_schema(op_type: str):
    """The OpSchema of `op_type`."""
    return get_op(op_type).SCHEMA


def is_framefuse_node(domain: str, op_type: str) -> bool:
    return domain == DOMAIN and op_type in OP_MODULES


def available_ops() -> dict[str, ModuleType | Exception]:
    """Every op type → its module, or the exception that importing it raised (for reports/benches)."""
    found: dict[str, ModuleType | Exception] = {}
    for op_type in OP_TYPES:
        try:
            found[op_type] = get_op(op_type)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, not hidden
            found[op_type] = exc
    return found


def has_kernel(op_type: str) -> bool:
    """Whether the op's package has a CUDA entry (`launch`)."""
    try:
        return callable(getattr(get_op(op_type), "launch", None))
    except FrameFuseError:
        return False


def schema_op_name(schema_file: Path) -> str:
    """The op_type a `schema.py` defines, read from its source: the `name=` of its `OpSchema(...)`
    call, a string literal or a module-level constant (`OP = "LinearScan"`). Raises ValueError
    with the reason when the file does not say it plainly."""
    tree = ast.parse(schema_file.read_text(), filename=str(schema_file))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "OpSchema":
            for keyword in node.keywords:
                if keyword.arg != "name":
                    continue
                value = keyword.value
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    names.append(value.value)
                elif isinstance(value, ast.Name) and value.id in constants:
                    names.append(constants[value.id])
                else:
                    raise ValueError("OpSchema(name=...) is neither a string nor a module-level string constant")
    if len(names) != 1:
        raise ValueError(f"expected one OpSchema(name=...) call, found {len(names)}")
    return names[0]


def add_op_package(package: str) -> tuple[str, ...]:
    """Find the op folders of `package` (an importable package whose sub-folders are op packages,
    laid out as framefuse/plugins/<folder>/) and register their ops; returns the op types found
    there. framefuse's own ops are found this way at import; call it for your own package before
    the rewrite or the build. An op type that is already registered from another folder is an
    error naming both."""
    global OP_TYPES
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise OpUnavailableError(f"op package {package!r} is not an importable package")
    found: dict[str, str] = {}
    for root in spec.submodule_search_locations:
        for schema_file in sorted(Path(root).glob("*/schema.py")):
            folder = schema_file.parent
            where = f"{package}.{folder.name}"
            try:
                op_type = schema_op_name(schema_file)
            except (OSError, SyntaxError, ValueError) as exc:
                UNREADABLE[str(schema_file)] = str(exc)
                continue
            other = found.get(op_type) or OP_MODULES.get(op_type)
            if other is not None and other != where:
                raise OpUnavailableError(f"framefuse op {op_type} is defined twice: {other} and {where}")
            found[op_type] = where
    OP_MODULES.update(found)
    OP_TYPES = tuple(OP_MODULES)
    return tuple(found)


def remove_op_package(package: str) -> None:
    """Forget the ops `add_op_package(package)` registered (tests; a plugin being unloaded)."""
    global OP_TYPES
    prefix = package + "."
    for op_type in [op for op, module in OP_MODULES.items() if module.startswith(prefix)]:
        del OP_MODULES[op_type]
        _cache.pop(op_type, None)
    OP_TYPES = tuple(OP_MODULES)


add_op_package(__package__)
