"""Names read from files, turned into torch objects through allowlists: operators and dtypes.

A blob, a fallback segment, a rerun file or an archive may name an operator
("aten.add.Tensor", "mylib.scale.default") or a dtype ("float16"). Nothing
read from a file is resolved with ``getattr`` on ``torch`` or ``torch.ops``
(``torch.ops.import_module`` imports a module; ``torch.ops.load_library``
loads native code): `resolve_operator` accepts, in torch's own namespaces, only
the names of the explicit allowlist (``operators.txt``, `ALLOWED`), and, in
any other namespace (a custom operator the process registered), a registered
schema the rules admit; `dtype_named` reads a fixed table. docs/design-notes.md
("Operators named by files") gives the rules; `refusal_reason` is them in code.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

import torch

from .. import _compat
from ..errors import OperatorRefusedError
from ._operators import ALLOWED, CLOSED_NAMESPACES

if TYPE_CHECKING:
    from .._compat import JitType, OpOverload

#: ``namespace.op.overload``: identifiers, none of them a dunder name.
_OVERLOAD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
#: No registered overload name is this long; a longer one is refused before any lookup.
MAX_NAME = 200

#: Namespaces whose operators act outside the program: TorchScript's interpreter prims
#: (printing, raising, profiling), the profiler, process groups and shared memory.
REFUSED_NAMESPACES = frozenset(
    {
        "prim",
        "profiler",
        "c10d",
        "_c10d_functional",
        "_c10d_functional_autograd",
        "_dtensor",
        "symm_mem",
        "static_runtime",
        "debug_mode_ops",
    }
)

#: Operators of other namespaces refused by name, with why. Every overload of each is refused.
REFUSED_OPERATORS = {
    "aten::from_file": "it reads (and with shared=True maps for writing) a file named by its argument",
    "aten::save": "it writes a file named by its argument",
    "aten::_print": "it writes to the process's output",
    "aten::warn": "it writes to the process's output",
    "aten::set_": "it rebinds a tensor to another tensor's or a storage's memory",
    "aten::set": "it rebinds a tensor to another tensor's or a storage's memory",
    "aten::manual_seed": "it changes the process's random state",
    "aten::set_grad_enabled": "it changes the process's autograd state",
    "aten::backward": "it runs the autograd engine on tensors outside the program",
    "aten::_backward": "it runs the autograd engine on tensors outside the program",
    "aten::dist_backward": "it runs the distributed autograd engine",
    "aten::_cufft_clear_plan_cache": "it changes process-wide state",
    "aten::_cufft_set_plan_cache_max_size": "it changes process-wide state",
    # These write to an argument without saying so in their schema.
    "aten::_copy_from": "it writes to its argument 'dst' although its schema does not declare the write",
    "aten::_copy_from_and_resize": "it writes to its argument 'dst' although its schema does not declare the write",
    "inductor::resize_storage_bytes_": "it resizes its argument's storage although its schema does not declare the write",
}

#: Argument and return types an allowed operator may have: values a program passes around.
#: Storage, type variables (``t``), classes, futures, streams and varargs are refused.
_VALUE_KINDS = frozenset(
    {
        "TensorType",
        "IntType",
        "SymIntType",
        "FloatType",
        "SymFloatType",
        "BoolType",
        "SymBoolType",
        "ComplexType",
        "NumberType",
        "StringType",
        "DeviceObjType",
        "GeneratorType",
        "NoneType",
        "ScalarTypeType",
        "LayoutType",
        "MemoryFormatType",
    }
)

#: Ops whose result may be their input itself although the schema does not say so (eval-mode
#: dropout is the identity; _unsafe_view is a view by design): what writes-checks must know.
UNANNOTATED_ALIASES = frozenset({"aten.dropout.default", "aten._unsafe_view.default"})

_CACHE: dict[str, OpOverload] = {}
_CACHE_LOCK = threading.Lock()


def resolve_operator(name: object, *, where: str) -> OpOverload:
    """The registered ``OpOverload`` that ``name`` ("aten.add.Tensor") names.

    :param where: what named it, for the error ("fallback segment 'forward.fallback0', node 'mul'").
    :raises OperatorRefusedError: ``name`` is not ``namespace.op.overload``, names no registered
        operator schema, or names one `refusal_reason` refuses.
    """
    found = _CACHE.get(name) if type(name) is str else None
    if found is not None:
        return found
    if type(name) is not str or len(name) > MAX_NAME or not _OVERLOAD_NAME.fullmatch(name):
        raise OperatorRefusedError(
            name, where, "it is not an operator overload name such as 'aten.add.Tensor' (namespace.op.overload)"
        )
    namespace, op, overload = name.split(".")
    if any(part.startswith("__") for part in (namespace, op, overload)):
        raise OperatorRefusedError(name, where, "operator names do not start with '__'")
    if namespace in _compat.torch_ops_attributes():
        raise OperatorRefusedError(
            name,
            where,
            f"{namespace!r} is an attribute of torch.ops (a function of its own), not an operator namespace",
        )
    if namespace in CLOSED_NAMESPACES and name not in ALLOWED:
        raise OperatorRefusedError(
            name,
            where,
            f"it is not in the operator allowlist: in torch's own namespace {namespace!r} only the operators "
            "listed in pytest_backendconf/allowlist/operators.txt resolve (docs/security.md)",
        )
    qualified = f"{namespace}::{op}"
    schema = _registered_schema(qualified, "" if overload == "default" else overload)
    if schema is None:
        raise OperatorRefusedError(
            name,
            where,
            f"no operator schema {qualified}.{overload} is registered in this process; if it is a custom "
            "operator, import the module that defines it (its torch.library registration) first",
            unregistered=True,
        )
    reason = refusal_reason(schema)
    if reason is not None:
        raise OperatorRefusedError(name, where, reason)
    # The name is a registered schema's, so these lookups reach the dispatcher's operator
    # (never one of torch.ops' own attributes); the identity check below makes sure.
    overload_object = _compat.op_overload(namespace, op, overload)
    found_schema = _compat.op_schema(overload_object)
    if found_schema is None or (found_schema.name, found_schema.overload_name) != (schema.name, schema.overload_name):
        raise OperatorRefusedError(name, where, "torch.ops does not resolve it to the registered operator")
    with _CACHE_LOCK:
        _CACHE[name] = overload_object
    return overload_object


def refusal_reason(schema: torch.FunctionSchema) -> str | None:
    """Why an operator with this ``torch.FunctionSchema`` is refused, or None: the rules in one place."""
    namespace = schema.name.split("::")[0]
    if namespace in REFUSED_NAMESPACES:
        return f"operators of namespace {namespace!r} act outside the program (printing, profiling, communication)"
    reason = REFUSED_OPERATORS.get(schema.name)
    if reason is not None:
        return reason
    op = schema.name.split("::")[-1]
    if op.startswith("set_") or "_unsafe" in op:
        return "operators named set_* rebind tensors and *_unsafe* ones skip their checks: none is admitted"
    if "..." in str(schema):  # varargs or varrets: FunctionSchema has no accessor for them
        return "its schema takes or returns any number of values of any type"
    typed = [(f"argument {a.name!r}", a.type) for a in schema.arguments]
    typed += [("its result", r.type) for r in schema.returns]
    for what, jit_type in typed:
        kind = _kind_not_allowed(jit_type)
        if kind is not None:
            return (
                f"{what} is of type {jit_type} ({kind}); allowed operators pass tensors, numbers, strings and the like"
            )
    for argument in schema.arguments:
        if str(argument.type) == "str" and argument.name in ("filename", "file", "path", "filepath"):
            return f"its argument {argument.name!r} names a file"
    return None


def written_arguments(schema: torch.FunctionSchema) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of each argument the schema declares it writes to (``Tensor(a!)``)."""
    return tuple(
        (i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    )


def schema_named(name: str) -> torch.FunctionSchema | None:
    """The registered schema of an overload name ("aten.add_.Tensor"), or None (no lookup through torch.ops)."""
    parts = name.split(".")
    if len(parts) != 3:
        return None
    namespace, op, overload = parts
    return _registered_schema(f"{namespace}::{op}", "" if overload == "default" else overload)


def _registered_schema(qualified: str, overload: str) -> torch.FunctionSchema | None:
    for schema in _compat.registered_schemas(qualified):
        if schema.overload_name == overload:
            return schema
    return None


def _kind_not_allowed(jit_type: JitType) -> str | None:
    kind = jit_type.kind()
    if kind in ("OptionalType", "ListType"):
        return _kind_not_allowed(jit_type.getElementType())
    return None if kind in _VALUE_KINDS else kind


# --- dtypes ---------------------------------------------------------------------------

#: Every dtype a file may name, by torch's name ("float16", not "torch.float16" or "half").
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.complex128,
        torch.complex64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint64,
        torch.uint32,
        torch.uint16,
        torch.uint8,
        torch.bool,
    )
}
#: The memory formats and layouts a file may name (the ops data's ``$memory_format``/``$layout``).
MEMORY_FORMATS = {
    str(m).removeprefix("torch."): m
    for m in (torch.contiguous_format, torch.preserve_format, torch.channels_last, torch.channels_last_3d)
}
LAYOUTS = {str(k).removeprefix("torch."): k for k in (torch.strided,)}


def dtype_named(name: object, *, where: str) -> torch.dtype:
    """The dtype of `DTYPES` called ``name``; a `ValueError` naming ``where`` and the known names else."""
    found = DTYPES.get(name) if type(name) is str else None
    if found is None:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise ValueError(f"{where}: {shown} is not a dtype name; known: {', '.join(DTYPES)}")
    return found
