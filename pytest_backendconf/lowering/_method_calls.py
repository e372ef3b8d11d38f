"""The checks between a call of a lowered method and the backend's ``execute``.

A call's arguments are bound to the method's signature, flattened and
checked against the input specs recorded at export; the backend's outputs
are checked against the output specs and rebuilt into the method's return
structure (`MethodRunner`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from ..allowlist import dtype_named
from ..archive import structure
from ..archive import MethodSpec
from ..errors import InputSpecError, LoweringError, OutputSpecError

if TYPE_CHECKING:
    from ..archive import Constant

_Tensor = torch.Tensor


class MethodRunner:
    """Turns a call into the flat input list and the flat outputs back into the structure.

    Everything that does not depend on the call is worked out here, once:
    the checks of each tensor are ``(dtype, torch.Size)`` pairs compared in
    C, and the output structure is rebuilt directly when it is a
    tensor, or a flat tuple, list or dict of them.
    """

    def __init__(self, spec: MethodSpec) -> None:
        self.spec = spec
        self.signature = spec.signature()
        n = len(spec.inputs)
        positional = all(
            p.kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD") and not p.has_default for p in spec.params
        )
        # The common call, all inputs positional tensors, skips binding and the structure walk.
        self.fast_arity = n if positional and len(spec.params) == n else -1
        self.tensor_checks = [
            (i, _torch_dtype(v.dtype), _expected_shape(v.shape), v)
            for i, v in enumerate(spec.inputs)
            if v.kind == "tensor"
        ]
        self.constants = [(i, v) for i, v in enumerate(spec.inputs) if v.kind != "tensor"]
        self.n_outputs = len(spec.outputs)
        self.output_checks: list[tuple[torch.dtype, torch.Size | tuple[int | None, ...]] | tuple[None, Constant]] = [
            (_torch_dtype(v.dtype), _expected_shape(v.shape)) if v.kind == "tensor" else (None, v.value)
            for v in spec.outputs
        ]
        self.rebuild = structure.rebuilder(spec.out_structure)
        # The common call, worked out here once: positional tensors in, tensors out. Its checks
        # run as one loop of identity and C comparisons over these pairs (`call_checks`).
        all_tensors = not self.constants and len(self.tensor_checks) == n
        self.fast_inputs = tuple((d, s) for _, d, s, _ in self.tensor_checks) if all_tensors else None
        self.fast_outputs = tuple(self.output_checks) if all(v.kind == "tensor" for v in spec.outputs) else None
        self.dynamic = spec.dynamic_shapes
        self.input_names = [v.name for v in spec.inputs]

    def flatten(self, args: tuple, kwargs: dict) -> list:
        checks = self.fast_inputs
        if checks is not None and not kwargs and len(args) == self.fast_arity and _tensors_match(args, checks):
            return list(args)
        if not kwargs and len(args) == self.fast_arity:
            flat = list(args)
        else:
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise InputSpecError(f"method {self.spec.name!r}: {exc}; its signature is {self.signature}") from None
            bound.apply_defaults()
            call = (bound.args, bound.kwargs)
            leaves = structure.flatten(self.spec.in_structure, call)
            if leaves is None:
                raise InputSpecError(
                    f"method {self.spec.name!r} was lowered for inputs shaped like "
                    f"{structure.describe(self.spec.in_structure)}, but was called with "
                    f"{structure.describe_value(call)}; lower it again for this call's structure"
                )
            flat = leaves
        for i, dtype, shape, spec in self.tensor_checks:
            value = flat[i]
            if (
                not isinstance(value, torch.Tensor)
                or value.dtype is not dtype  # dtypes are singletons: identity is the cheap test
                or (value.shape != shape and not _shape_matches(value.shape, shape))
            ):
                raise InputSpecError(
                    f"method {self.spec.name!r} input {i} ({spec.name!r}) must be {spec.describe()} as "
                    f"when it was exported, got {_describe_value(value)}; lower it again for these inputs"
                )
        if self.constants:
            self._check_constants(flat)
        return flat

    def check_sizes(self, inputs: list) -> list[int | None]:
        """The exported ranges and equalities of the symbolic sizes (dynamic shapes only)."""
        return self.dynamic.check_inputs(self.spec.name, self.input_names, inputs)  # type: ignore[union-attr]

    def _check_constants(self, flat: list) -> None:
        for i, spec in self.constants:
            value = flat[i]
            if type(value) is not type(spec.value) or value != spec.value:
                raise InputSpecError(
                    f"method {self.spec.name!r} was lowered with {spec.name}={spec.value!r} (a Python "
                    f"value is baked into the exported program) but called with {spec.name}={value!r}; "
                    "lower it again with that value, or pass it as a tensor"
                )

    def unflatten(self, outputs: object, backend_name: str) -> Any:
        """The method's return value (its structure, filled with ``outputs``), once they pass the checks."""
        checks = self.fast_outputs
        if (
            checks is not None
            and type(outputs) is list
            and len(outputs) == self.n_outputs
            and _tensors_match(outputs, checks)
        ):
            return self.rebuild(outputs)
        if not isinstance(outputs, (list, tuple)) or len(outputs) != self.n_outputs:
            got = _outputs(len(outputs)) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
            raise OutputSpecError(
                f"method {self.spec.name!r}: execute() of backend {backend_name!r} must return a list "
                f"of {_outputs(self.n_outputs)}, got {got}",
                differs=("count",),
            )
        for value, check in zip(outputs, self.output_checks):
            if check[0] is None:
                if value != check[1]:
                    self._bad_output(outputs, backend_name)
            elif (
                not isinstance(value, torch.Tensor)
                or value.dtype is not check[0]
                or (value.shape != check[1] and not _shape_matches(value.shape, check[1]))
            ):
                self._bad_output(outputs, backend_name)
        return self.rebuild(outputs)

    def _bad_output(self, outputs: Sequence[object], backend_name: str) -> None:
        """Raise the error for the first output that does not match its spec."""
        for i, (value, spec, check) in enumerate(zip(outputs, self.spec.outputs, self.output_checks)):
            if check[0] is None:
                if value != spec.value:
                    raise OutputSpecError(
                        f"method {self.spec.name!r} output {i}: expected {spec.describe()}, got {value!r} "
                        f"from backend {backend_name!r}",
                        output=i,
                        node=spec.name,
                        differs=("value",),
                    )
                continue
            differs = tensor_differences(value, check[0], check[1])
            if differs:
                raise OutputSpecError(
                    f"method {self.spec.name!r} output {i}: expected {spec.describe()}, got "
                    f"{_describe_value(value)} from backend {backend_name!r}",
                    output=i,
                    node=spec.name,
                    differs=differs,
                )


def _tensors_match(values: Iterable[object], checks: tuple) -> bool:
    """Whether each value is a tensor of its check's ``(dtype, shape)``: the common call's one loop
    (a mismatch goes on to the full checks, which name it)."""
    for value, (dtype, shape) in zip(values, checks):
        # type() first: a plain tensor passes in one identity test; a subclass goes on to isinstance.
        if (
            (type(value) is not _Tensor and not isinstance(value, _Tensor))
            or value.dtype is not dtype
            or (value.shape != shape and not _shape_matches(value.shape, shape))
        ):
            return False
    return True


def _expected_shape(shape: tuple[int | None, ...] | None) -> torch.Size | tuple[int | None, ...]:
    """A `torch.Size` for a static shape, else the tuple with ``None`` for each symbolic dimension.

    The checks compare ``value.shape != expected`` first (one comparison in
    C, false for a match of a static shape) and only then `_shape_matches`.
    """
    assert shape is not None  # a tensor's spec has a shape (ValueSpec)
    static = [d for d in shape if d is not None]
    return torch.Size(static) if len(static) == len(shape) else shape


def _torch_dtype(name: str | None) -> torch.dtype:
    """The torch dtype a tensor spec names (the archive reader checked the name)."""
    try:
        return dtype_named(name, where="a tensor spec")
    except ValueError as exc:
        raise LoweringError(str(exc)) from None


def tensor_differences(value: object, dtype: torch.dtype, shape: Sequence[int | None]) -> tuple[str, ...]:
    """What of an output differs from its spec: ``("type",)`` for a non-tensor, else ``"dtype"`` and/or ``"shape"``."""
    if not isinstance(value, torch.Tensor):
        return ("type",)
    return (("dtype",) if value.dtype != dtype else ()) + (("shape",) if not _shape_matches(value.shape, shape) else ())


def _shape_matches(actual: Sequence[object], expected: Sequence[int | None]) -> bool:
    if len(actual) != len(expected):
        return False
    return all(e is None or a == e for a, e in zip(actual, expected))


def _describe_value(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}] tensor"
    return f"{type(value).__name__} {value!r}"


def _outputs(count: int) -> str:
    """``1 output``, ``2 outputs``."""
    return f"{count} output" if count == 1 else f"{count} outputs"
