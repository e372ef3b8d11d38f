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
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorInput:
    """How to generate one tensor input.

    ``dtype="float"`` means "each float dtype under test" (the case's
    ``float_dtypes`` that the backend declares); any other value is a fixed
    dtype name such as ``"int64"`` or ``"bool"``. ``low``/``high`` bound the
    generated values (integers: inclusive range; floats: the range edge
    values are drawn from).
    """

    shape: tuple[int, ...]
    dtype: str = "float"
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if not all(isinstance(d, int) and d >= 0 for d in self.shape):
            raise ValueError(f"TensorInput shape {self.shape!r} must be a tuple of non-negative ints")


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
    """

    name: str
    build: Callable[[], Any]
    inputs: Mapping[str, tuple[Any, ...]]
    kwargs: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    float_dtypes: tuple[str, ...] = FLOAT_DTYPES
    tags: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    description: str = ""
    origin: str = ""

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

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    @property
    def uses_float(self) -> bool:
        """Whether any tensor input follows the float dtype under test."""
        return any(
            isinstance(i, TensorInput) and i.dtype == "float" for args in self.inputs.values() for i in args
        )
