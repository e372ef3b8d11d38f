"""`ModelCase`: one model of the conformance suite's zoo, built in or added by a vendor.

A vendor adds their own models to every parity, serialization and
availability check with the ``backendconf_register_cases`` hook::

    @bc.hookimpl
    def backendconf_register_cases(register):
        register(bc.ModelCase(
            name="my_block",
            build=lambda: MyBlock().eval(),
            inputs={"forward": (bc.TensorInput(shape=(1, 16, 8, 8)),)},
        ))

A dimension that may vary from call to call is a ``torch.export.Dim``; the
suite then also lowers the model with dynamic shapes and calls that one
lowered module with sizes drawn inside the bounds, both ends included::

    batch = torch.export.Dim("batch", min=1, max=16)
    bc.TensorInput(shape=(batch, 16, 8, 8))
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    import torch
    from torch.export import Dim
    from typing_extensions import TypeIs

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorInput:
    """How to generate one tensor input.

    ``dtype="float"`` means "each float dtype under test" (the case's
    ``float_dtypes`` that the backend declares); any other value is a fixed
    dtype name such as ``"int64"`` or ``"bool"``. ``low``/``high`` bound the
    generated values (integers: inclusive range; floats: the range edge
    values are drawn from). A ``shape`` entry may be a ``torch.export.Dim``:
    that dimension varies (the same `Dim` in two places: always equal).
    """

    shape: tuple[int | Dim, ...]
    dtype: str = "float"
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        for d in self.shape:
            if is_dim(d):
                if not (type(d.min) is int and type(d.max) is int and 0 <= d.min < d.max):
                    raise ValueError(
                        f"TensorInput shape {self.shape!r}: Dim {d.__name__!r} needs bounds, "
                        f"e.g. torch.export.Dim({d.__name__!r}, min=1, max=16)"
                    )
            elif not (type(d) is int and d >= 0):
                raise ValueError(
                    f"TensorInput shape {self.shape!r} must hold non-negative ints and torch.export.Dim objects"
                )

    @property
    def dims(self) -> dict[int, Dim]:
        """``{position: Dim}`` of the dimensions that vary."""
        return {i: d for i, d in enumerate(self.shape) if is_dim(d)}

    def concrete_shape(self, sizes: Mapping[str, int] | None = None) -> tuple[int, ...]:
        """The shape with each `Dim` replaced by its size in ``sizes`` (default ``max(2, min)``)."""
        sizes = sizes or {}
        return tuple(sizes.get(d.__name__, max(2, d.min)) if is_dim(d) else d for d in self.shape)


def is_dim(value: object) -> TypeIs[Dim]:
    """Whether ``value`` is a ``torch.export.Dim`` (checked without importing torch)."""
    return type(value).__name__ == "Dim" and hasattr(value, "min") and hasattr(value, "max")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelCase:
    """A model the suite lowers and checks.

    :param name: unique across the zoo and every plugin, ``[a-z][a-z0-9_]*``.
    :param build: returns a fresh module, in eval mode, on every call.
    :param inputs: per method, the positional inputs: `TensorInput` or a
        Python constant.
    :param kwargs: per method, constant keyword arguments passed on every call.
    :param float_dtypes: float dtypes this model is checked in.
    :param tags: free-form labels (``"cond"``, ``"multi_method"`` …) for ``-k``.
    :param ops: op overload names the model uses, for the coverage table.
    :param description: what the model is, in one line, for reports.
    :param origin: where its code comes from (a package and its entry point, a file), for reports.
    :param dim_examples: the size each `Dim` of the inputs takes in the
        example every static check uses (and the dynamic export starts
        from); a Dim not named here takes ``max(2, min)``.
    """

    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Mapping[str, tuple[TensorInput | object, ...]]
    kwargs: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    float_dtypes: tuple[str, ...] = FLOAT_DTYPES
    tags: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    description: str = ""
    origin: str = ""
    dim_examples: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"ModelCase name {self.name!r} must match [a-z][a-z0-9_]*")
        if not callable(self.build):
            raise ValueError(f"ModelCase {self.name!r}: build must be a callable returning a module")
        if not self.inputs:
            raise ValueError(f"ModelCase {self.name!r}: inputs must name at least one method")
        bad = [d for d in self.float_dtypes if d not in FLOAT_DTYPES]
        if bad:
            raise ValueError(f"ModelCase {self.name!r}: float_dtypes {bad} are not among {FLOAT_DTYPES}")
        object.__setattr__(self, "inputs", {m: tuple(v) for m, v in self.inputs.items()})
        object.__setattr__(self, "dim_examples", dict(self.dim_examples))
        dims = self.dims
        for name, size in self.dim_examples.items():
            dim = dims.get(name)
            if dim is None:
                raise ValueError(f"ModelCase {self.name!r}: dim_examples names {name!r}, which no input uses")
            if not (type(size) is int and dim.min <= size <= dim.max):
                raise ValueError(
                    f"ModelCase {self.name!r}: dim_examples[{name!r}] = {size!r} is outside [{dim.min}, {dim.max}]"
                )
        for name, dim in dims.items():
            if name not in self.dim_examples and max(2, dim.min) > dim.max:
                raise ValueError(
                    f"ModelCase {self.name!r}: Dim {name!r} with bounds [{dim.min}, {dim.max}] needs a size >= 2 "
                    "in dim_examples (torch.export specialises sizes 0 and 1)"
                )

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    @property
    def dims(self) -> dict[str, Dim]:
        """``{name: Dim}`` of every varying dimension, over all methods (empty: static shapes only)."""
        found: dict[str, Dim] = {}
        for args in self.inputs.values():
            for spec in args:
                for dim in spec.dims.values() if isinstance(spec, TensorInput) else ():
                    other = found.setdefault(dim.__name__, dim)
                    if (other.min, other.max) != (dim.min, dim.max):
                        raise ValueError(
                            f"ModelCase {self.name!r}: two Dims named {dim.__name__!r} have different bounds "
                            f"[{other.min}, {other.max}] and [{dim.min}, {dim.max}]; use one Dim object"
                        )
        return found

    def method_dims(self, method: str) -> dict[str, Dim]:
        """``{name: Dim}`` of the varying dimensions of one method's inputs."""
        return {
            d.__name__: d for spec in self.inputs[method] if isinstance(spec, TensorInput) for d in spec.dims.values()
        }

    def example_sizes(self) -> dict[str, int]:
        """The size of each Dim in the static example."""
        return {name: self.dim_examples.get(name, max(2, dim.min)) for name, dim in self.dims.items()}

    def dynamic_shapes(self, method: str) -> tuple[dict[int, Dim] | None, ...] | None:
        """``torch.export``'s ``dynamic_shapes`` for one method's positional inputs (None: all static)."""
        if not self.method_dims(method):
            return None
        return tuple((spec.dims or None) if isinstance(spec, TensorInput) else None for spec in self.inputs[method])

    @property
    def uses_float(self) -> bool:
        """Whether any tensor input follows the float dtype under test."""
        return any(isinstance(i, TensorInput) and i.dtype == "float" for args in self.inputs.values() for i in args)
