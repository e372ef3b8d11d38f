"""The private torch names this backend uses, in one place, with the torch versions they were checked on.

Mostly torch.onnx's exporter internals: the backend runs the exporter's
steps one by one (decompose, dispatch, translate) so that torchlib's
registry is built once per process and a failing node is known. Those steps
are internal to torch.onnx; where they are missing, `exporter_steps` returns
None and the exporter falls back on the public ``torch.onnx.export``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import torch


@dataclasses.dataclass(frozen=True)
class ExporterSteps:
    """torch.onnx's exporter in its steps (``torch.onnx._internal.exporter``, checked on torch 2.13 and 2.14)."""

    #: ``_core._prepare_exported_program_for_export(program, registry=...)``: decompose for torchlib.
    prepare: Callable[..., Any]
    #: ``_core._exported_program_to_onnx_program(program, registry=...)``: translate to ONNX.
    translate: Callable[..., Any]
    #: ``_dispatching.dispatch(node, registry) -> (function | None, message)``.
    dispatch: Callable[..., Any]
    _flags: Any

    @contextlib.contextmanager
    def exporting(self) -> Iterator[None]:
        """Set the exporter's ``_is_onnx_exporting`` flag, as ``torch.onnx.export`` does around its steps."""
        self._flags._is_onnx_exporting = True
        try:
            yield
        finally:
            self._flags._is_onnx_exporting = False


def exporter_steps() -> ExporterSteps | None:
    """The exporter's internal steps, or None on a torch without them (then use ``torch.onnx.export``)."""
    try:
        from torch.onnx._internal.exporter import _core, _dispatching, _flags

        _flags._is_onnx_exporting  # noqa: B018  (present on the versions above)
        return ExporterSteps(
            prepare=_core._prepare_exported_program_for_export,
            translate=_core._exported_program_to_onnx_program,
            dispatch=_dispatching.dispatch,
            _flags=_flags,
        )
    except (ImportError, AttributeError):
        return None


def torchlib_registry() -> Any:
    """torchlib's registry of ATen → ONNX functions
    (``torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib()``, torch 2.13 and 2.14)."""
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib()


def decomposed_targets(registry: Any) -> frozenset:
    """The ops the exporter's decomposition step rewrites: those with a decomposition and no torchlib function
    (``_decomp.create_onnx_friendly_decomposition_table``, ``_decomp.get_onnx_implemented_overloads``,
    torch.onnx internals on torch 2.13 and 2.14)."""
    from torch.onnx._internal.exporter import _decomp

    implemented = set(_decomp.get_onnx_implemented_overloads(registry))
    return frozenset(_decomp.create_onnx_friendly_decomposition_table(implemented))


def has_composite_kernel(target: Any) -> bool:
    """Whether an op overload has a CompositeImplicitAutograd kernel, which tracing may decompose whatever
    the table says (``torch._C._dispatch_has_kernel_for_dispatch_key``, private on torch 2.4-2.14)."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"))


def op_schema(target: Any) -> Any:
    """The ``torch.FunctionSchema`` of an op overload, or None for any other target
    (``torch._ops.OpOverload._schema``, private on torch 2.4-2.14)."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema
    return None


def is_higher_order_op(target: Any) -> bool:
    """Whether a call target is a higher-order op such as ``torch.cond``
    (``torch._ops.HigherOrderOperator`` on torch 2.4-2.14)."""
    return isinstance(target, torch._ops.HigherOrderOperator)
