"""What a lowered method expects and returns: its signature, input and output specs.

A `MethodSpec` is everything the lowered module needs besides the backend to
call a method: how to turn ``(args, kwargs)`` into the flat input list, what
to check on the way in and out, and how to rebuild the output structure. It
round-trips through JSON (`to_json` / `from_json`) for the archive, as plain
data, and the input and output structures are the project's own
structure JSON (`_structure`), never a name to import.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import TYPE_CHECKING, Any, Callable, cast

from . import _structure as structure
from ._shapes import DynamicShapes

if TYPE_CHECKING:
    import torch

_KIND_BY_NAME = {
    "POSITIONAL_ONLY": inspect.Parameter.POSITIONAL_ONLY,
    "POSITIONAL_OR_KEYWORD": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "VAR_POSITIONAL": inspect.Parameter.VAR_POSITIONAL,
    "KEYWORD_ONLY": inspect.Parameter.KEYWORD_ONLY,
    "VAR_KEYWORD": inspect.Parameter.VAR_KEYWORD,
}
#: The dtypes an archive may name; anything else is refused rather than looked up.
DTYPE_NAMES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "complex64",
    "complex128",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)
_SCALAR_KINDS = {bool: "bool", int: "int", float: "float", str: "str", type(None): "none"}
#: A Python constant of a program: a scalar input or output baked into it, or a parameter's default.
Constant = bool | int | float | str | None


@dataclasses.dataclass(frozen=True)
class ValueSpec:
    """One flat input or output: a tensor of a dtype and shape, or a Python constant."""

    name: str
    kind: str  # "tensor", or the scalar kinds "int", "float", "bool", "str", "none"
    dtype: str | None = None  # tensors: a name from DTYPE_NAMES
    shape: tuple[int | None, ...] | None = None  # None for a dimension that is symbolic
    value: Constant = None  # constants baked into the program (scalar inputs)

    def describe(self) -> str:
        if self.kind == "tensor":
            dims = ", ".join("?" if d is None else str(d) for d in self.shape or ())
            return f"a {self.dtype}[{dims}] tensor"
        return f"{self.kind} {self.value!r}" if self.kind != "none" else "None"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "tensor":
            out["dtype"] = self.dtype
            out["shape"] = list(self.shape or ())
        else:
            out["value"] = self.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ValueSpec":
        kind = data["kind"]
        if kind == "tensor":
            dtype = data["dtype"]
            if dtype not in DTYPE_NAMES:
                raise ValueError(f"unknown dtype {dtype!r}")
            shape = data["shape"]
            if not isinstance(shape, list) or not all(
                d is None or (isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63) for d in shape
            ):
                raise ValueError(f"shape {shape!r} is not a list of sizes")
            return cls(name=str(data["name"]), kind=kind, dtype=dtype, shape=tuple(shape))
        if kind not in _SCALAR_KINDS.values():
            raise ValueError(f"unknown value kind {kind!r}")
        return cls(name=str(data["name"]), kind=kind, value=data.get("value"))


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter of the original method's signature (``self`` excluded)."""

    name: str
    kind: str  # an inspect.Parameter kind name
    has_default: bool = False
    default: Constant = None  # only JSON-compatible defaults are kept

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.has_default:
            out["default"] = self.default
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ParamSpec":
        if data["kind"] not in _KIND_BY_NAME:
            raise ValueError(f"unknown parameter kind {data['kind']!r}")
        return cls(
            name=str(data["name"]),
            kind=data["kind"],
            has_default="default" in data,
            default=data.get("default"),
        )


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One buffer a lowered method keeps as state (docs/backend-contract.md, "State").

    The program ``preprocess`` receives takes the buffer's current value as
    the user input at position ``input`` and, when the method writes it,
    returns its new value as the output at position ``output``: the same
    positions ``execute`` receives and returns it at. The lowered module owns
    the value between calls.
    """

    #: The buffer's fully qualified name in the module (``"blocks.0.k_cache"``).
    fqn: str
    dtype: str  # a name from DTYPE_NAMES
    shape: tuple[int, ...]
    #: Its position among ``execute``'s inputs (a method's state inputs come first, before the user's).
    #: None only for a partition that computes the state's new value without reading the old one.
    input: int | None
    #: Its position among ``execute``'s outputs (the new states come first), or None when the method
    #: only reads it (another method of the module writes it).
    output: int | None = None

    def describe(self) -> str:
        return f"state {self.fqn!r} (a {self.dtype}[{', '.join(map(str, self.shape))}] tensor)"

    def to_json(self) -> dict[str, Any]:
        return {
            "fqn": self.fqn,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "input": self.input,
            "output": self.output,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StateSpec":
        if not isinstance(data, dict):
            raise ValueError(f"a state spec is an object, got {type(data).__name__}")
        fqn, dtype, shape = data.get("fqn"), data.get("dtype"), data.get("shape")
        if not isinstance(fqn, str) or not fqn:
            raise ValueError(f"state fqn {fqn!r} is not a name")
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"state {fqn!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_index(d) for d in shape):
            raise ValueError(f"state {fqn!r}: shape {shape!r} is not a list of sizes")
        position, output = data.get("input"), data.get("output")
        if not (position is None or _is_index(position)) or not (output is None or _is_index(output)):
            raise ValueError(f"state {fqn!r}: input {position!r} / output {output!r} are not positions")
        return cls(fqn=fqn, dtype=dtype, shape=tuple(shape), input=position, output=output)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def check_state_specs(state: tuple[StateSpec, ...], where: str) -> None:
    """State inputs are the first inputs and new states the first outputs, each position once."""
    if sorted(-1 if s.input is None else s.input for s in state) != list(range(len(state))):
        raise ValueError(f"{where}: the state inputs must be inputs 0 to {len(state) - 1}, once each")
    written = sorted(s.output for s in state if s.output is not None)
    if written != list(range(len(written))):
        raise ValueError(f"{where}: the new states must be the first outputs, once each")
    if len({s.fqn for s in state}) != len(state):
        raise ValueError(f"{where}: a state buffer is named twice")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A lowered method: its name, compile spec, calling convention and value specs."""

    name: str
    compile_spec: dict[str, Any]
    params: tuple[ParamSpec, ...]
    in_structure: Any  # the (args, kwargs) structure, in _structure's JSON
    out_structure: Any  # likewise for the outputs
    inputs: tuple[ValueSpec, ...]
    outputs: tuple[ValueSpec, ...]
    #: The exported ranges and equalities of symbolic dimensions (None: every shape is static).
    dynamic_shapes: DynamicShapes | None = None
    #: The buffers the method reads or writes as state (`StateSpec`); ``inputs`` and ``outputs``
    #: are the caller's values only, which ``execute`` receives and returns after the states.
    state: tuple[StateSpec, ...] = ()
    #: The backend keeps this method's state itself (it declares ``keeps_state``): ``execute`` gets the
    #: caller's values only, and the lowered module compiles the blobs again to return to the initial state.
    state_kept_by_backend: bool = False

    def signature(self) -> inspect.Signature:
        """The original method's signature, for ``inspect`` and for binding calls."""
        params = []
        for p in self.params:
            default = p.default if p.has_default else inspect.Parameter.empty
            params.append(inspect.Parameter(p.name, _KIND_BY_NAME[p.kind], default=default))
        return inspect.Signature(params)

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "compile_spec": self.compile_spec,
            "params": [p.to_json() for p in self.params],
            "in_structure": self.in_structure,
            "out_structure": self.out_structure,
            "inputs": [v.to_json() for v in self.inputs],
            "outputs": [v.to_json() for v in self.outputs],
        }
        if self.dynamic_shapes is not None:
            out["dynamic_shapes"] = self.dynamic_shapes.to_json()
        if self.state:
            out["state"] = [s.to_json() for s in self.state]
        if self.state_kept_by_backend:
            out["state_kept_by_backend"] = True
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MethodSpec":
        if not isinstance(data.get("compile_spec"), dict):
            raise ValueError("compile_spec is not an object")
        inputs = tuple(ValueSpec.from_json(v) for v in data["inputs"])
        outputs = tuple(ValueSpec.from_json(v) for v in data["outputs"])
        for key, values, what in (("in_structure", inputs, "inputs"), ("out_structure", outputs, "outputs")):
            if key not in data:
                raise ValueError(f"{key} is missing")
            try:
                leaves = structure.check(data[key])
            except structure.StructureError as exc:
                raise ValueError(f"{key}: {exc}") from None
            if leaves != len(values):
                raise ValueError(f"{key} has {leaves} leaves but the method has {len(values)} flat {what}")
        dynamic = data.get("dynamic_shapes")
        state_data = data.get("state", [])
        if not isinstance(state_data, list):
            raise ValueError("state is not a list")
        state = tuple(StateSpec.from_json(s) for s in state_data)
        check_state_specs(state, f"method {data['name']!r}")
        kept = data.get("state_kept_by_backend", False)
        if not isinstance(kept, bool):
            raise ValueError(f"state_kept_by_backend is {kept!r}, not true or false")
        if kept and state:
            raise ValueError("a method whose backend keeps its state has no state specs of its own")
        return cls(
            name=str(data["name"]),
            compile_spec=data["compile_spec"],
            params=tuple(ParamSpec.from_json(p) for p in data["params"]),
            in_structure=data["in_structure"],
            out_structure=data["out_structure"],
            inputs=inputs,
            outputs=outputs,
            dynamic_shapes=None if dynamic is None else DynamicShapes.from_json(dynamic, inputs, outputs),
            state=state,
            state_kept_by_backend=kept,
        )


def params_of(function: Callable[..., object]) -> tuple[ParamSpec, ...]:
    """The parameters of a method (``self`` dropped), keeping JSON-compatible defaults."""
    params = list(inspect.signature(function).parameters.values())[1:]
    specs = []
    for p in params:
        keep = p.default is not inspect.Parameter.empty and is_json_scalar(p.default)
        specs.append(ParamSpec(p.name, p.kind.name, keep, p.default if keep else None))
    return tuple(specs)


def is_json_scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def value_spec(name: str, value: object) -> ValueSpec:
    """The spec of an example value (a real or fake tensor, or a Python constant)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(value, "shape"):
        shape = tuple(int(d) if _is_static(d) else None for d in value.shape)
        return ValueSpec(name=name, kind="tensor", dtype=str(dtype).removeprefix("torch."), shape=shape)
    kind = _SCALAR_KINDS.get(type(value))
    if kind is None:
        raise TypeError(f"{name} is a {type(value).__name__}; only tensors and Python scalars are supported")
    return ValueSpec(name=name, kind=kind, value=cast(Constant, value))  # its type is one of _SCALAR_KINDS


def _is_static(dim: int | torch.SymInt) -> bool:
    node = getattr(dim, "node", None)
    if node is not None:
        # Never int() a SymInt: that guards on its example value and
        # specialises the symbol in the program's shape environment.
        return node.maybe_as_int() is not None
    try:
        int(dim)
    except (TypeError, ValueError):
        return False
    return type(dim) is int or not hasattr(dim, "node")
