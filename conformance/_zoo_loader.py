"""Read ``models.toml`` into the zoo's `ModelCase`s, checking every entry.

`load_zoo` reads the file that ships with the package; `parse_models` reads
any text or file, so that a bad entry can be shown to give a clear error.
Importing this module does not import torch: the zoo's code is imported when
a file is parsed.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import sys
from importlib import resources
from typing import TYPE_CHECKING, Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from pathlib import Path

    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

from pytest_backendconf.cases import FLOAT_DTYPES, ModelCase, TensorInput
from pytest_backendconf.errors import BackendConfError

MODELS_FILE = "models.toml"
#: The seeds' own models, added to the zoo of the suite's TorchScript form only.
TORCHSCRIPT_MODELS_FILE = "torchscript_models.toml"

_REQUIRED = ("name", "class", "inputs")
_OPTIONAL = ("description", "tags", "float_dtypes", "ops", "kwargs", "dims")
_DIM_KEYS = ("min", "max", "example")
_TENSOR_KEYS = ("shape", "dtype", "low", "high")
#: "float" is the float dtype under test; the others are fixed.
INPUT_DTYPES = ("float", *FLOAT_DTYPES, "int64", "bool")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_OP = re.compile(r"[A-Za-z_]\w*(\.\w+){1,2}\Z")


class ZooSpecError(BackendConfError, ValueError):
    """An entry of ``models.toml`` is malformed; the message names the model and the field."""


def load_zoo() -> list[ModelCase]:
    """The zoo's cases, from the ``models.toml`` shipped with the package (read once)."""
    return list(_load_shipped())


def load_torchscript_zoo() -> list[ModelCase]:
    """The seeds' own models (``torchscript_models.toml``), which the TorchScript form adds to the zoo."""
    return list(_load_torchscript_seeds())


@functools.cache
def _load_shipped() -> tuple[ModelCase, ...]:
    return tuple(parse_models(resources.files(__package__).joinpath(MODELS_FILE)))


@functools.cache
def _load_torchscript_seeds() -> tuple[ModelCase, ...]:
    return tuple(parse_models(resources.files(__package__).joinpath(TORCHSCRIPT_MODELS_FILE)))


def parse_models(source: str | Path | Traversable) -> list[ModelCase]:
    """Cases from TOML: ``source`` is the TOML text (a `str`) or a file (a path or a `Traversable`).

    :raises ZooSpecError: for invalid TOML or an entry that breaks the schema
        described at the top of ``models.toml``.
    """
    if isinstance(source, str):
        text, where = source, "<models TOML text>"
    else:
        where = os.fspath(source) if isinstance(source, os.PathLike) else str(source)
        text = source.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ZooSpecError(f"{where}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"model"})
    if extra:
        raise ZooSpecError(f"{where}: unknown top-level key(s) {extra}; write each model as a [[model]] table")
    entries = data.get("model", [])
    if not isinstance(entries, list):
        raise ZooSpecError(f"{where}: 'model' must be an array of tables; write each model as a [[model]] table")

    from . import zoo

    cases: list[ModelCase] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries, start=1):
        case = _Entry(where, index, entry, zoo).case()
        if case.name in seen:
            raise ZooSpecError(
                f"{where}: model #{index} {case.name!r}: field 'name': duplicate of model #{seen[case.name]}; "
                "names must be unique"
            )
        seen[case.name] = index
        cases.append(case)
    return cases


class _Entry:
    """One ``[[model]]`` table being checked; errors name the file, the entry and the field."""

    def __init__(self, where: str, index: int, data: Any, zoo: Any) -> None:
        self.where = where
        self.index = index
        self.data = data
        self.zoo = zoo
        self.label = f"model #{index}"

    def error(self, field: str, text: str) -> ZooSpecError:
        return ZooSpecError(f"{self.where}: {self.label}: field {field!r}: {text}")

    def case(self) -> ModelCase:
        data = self.data
        if not isinstance(data, dict):
            raise ZooSpecError(f"{self.where}: {self.label}: must be a table, got {data!r}")
        name = data.get("name")
        if isinstance(name, str):
            self.label = f"model #{self.index} {name!r}"
        for key in data:
            if key not in _REQUIRED + _OPTIONAL:
                keys = _REQUIRED + _OPTIONAL
                raise self.error(key, f"unknown key{_suggest(key, keys)}; the keys are {', '.join(keys)}")
        for key in _REQUIRED:
            if key not in data:
                raise self.error(key, "missing; every model needs name, class and inputs")
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.error("name", f"{name!r} must be lower snake case, matching [a-z][a-z0-9_]*")
        cls = self.model_class(data["class"])
        self.declared_dims, examples = self.dims(data.get("dims", {}))
        inputs = self.inputs(data["inputs"], cls)
        unused = sorted(set(self.declared_dims) - self.used_dims)
        if unused:
            raise self.error(f"dims.{unused[0]}", "is declared but no input shape names it")
        kwargs = self.kwargs(data.get("kwargs", {}), inputs)
        self.check_call(cls, inputs, kwargs)
        optional: dict[str, Any] = {}
        if "float_dtypes" in data:
            optional["float_dtypes"] = self.float_dtypes(data["float_dtypes"])
        return ModelCase(
            name=name,
            build=functools.partial(self.zoo.build, cls),
            inputs=inputs,
            kwargs=kwargs,
            tags=self.strings("tags", data.get("tags", [])),
            ops=self.ops(data.get("ops", [])),
            description=self.text("description", data.get("description", "")),
            dim_examples=examples,
            **optional,
        )

    def dims(self, value: Any) -> tuple[dict[str, Any], dict[str, int]]:
        """``[model.dims]``: ``name = {min = ..., max = ..., example = ...}`` per varying dimension."""
        self.used_dims: set[str] = set()
        if not isinstance(value, dict):
            raise self.error("dims", "must be a table {name = {min = ..., max = ..., example = ...}}")
        if not value:
            return {}, {}
        from torch.export import Dim

        dims, examples = {}, {}
        for name, bounds in value.items():
            field = f"dims.{name}"
            if not name.isidentifier():
                raise self.error(field, "a dimension's name must be an identifier, such as batch or seq")
            if not isinstance(bounds, dict) or not {"min", "max"} <= set(bounds) <= set(_DIM_KEYS):
                raise self.error(field, f"must be a table {{min = ..., max = ...}} (example optional), got {bounds!r}")
            low, high, example = bounds["min"], bounds["max"], bounds.get("example", max(2, bounds["min"]))
            if not all(type(v) is int for v in (low, high, example)) or not 0 <= low < high:
                raise self.error(field, f"min {low!r} and max {high!r} must be integers with 0 <= min < max")
            if not (max(2, low) <= example <= high):
                raise self.error(
                    f"{field}.example",
                    f"{example!r} must lie in [max(2, min), max] = [{max(2, low)}, {high}] "
                    "(torch.export specialises sizes 0 and 1)",
                )
            dims[name] = Dim(name, min=low, max=high)
            examples[name] = example
        return dims, examples

    def model_class(self, value: Any) -> type:
        import torch

        classes = {
            k: v
            for k, v in vars(self.zoo).items()
            if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == self.zoo.__name__
        }
        if not isinstance(value, str) or value not in classes:
            raise self.error(
                "class",
                f"{value!r} is not a Module class of {self.zoo.__name__}{_suggest(value, classes)}; "
                "define it in conformance/zoo.py",
            )
        return classes[value]

    def inputs(self, value: Any, cls: type) -> dict[str, tuple[Any, ...]]:
        if not isinstance(value, dict) or not value:
            raise self.error("inputs", "must be a table {method = [input, ...]} naming at least one method")
        inputs = {}
        for method, entries in value.items():
            field = f"inputs.{method}"
            if not inspect.isfunction(getattr(cls, method, None)):
                raise self.error(field, f"{cls.__name__} has no method {method!r}")
            if not isinstance(entries, list):
                raise self.error(field, f"must be an array of inputs, got {entries!r}")
            inputs[method] = tuple(self.input(f"{field}[{i}]", e) for i, e in enumerate(entries))
        return inputs

    def input(self, field: str, value: Any) -> Any:
        if not isinstance(value, dict):
            raise self.error(field, f"must be a table {{shape = [...], dtype = ...}} or {{value = ...}}, got {value!r}")
        if "value" in value:
            if len(value) != 1:
                raise self.error(field, f"a constant input is {{value = ...}} alone, got keys {sorted(value)}")
            return value["value"]
        unknown = [k for k in value if k not in _TENSOR_KEYS]
        if unknown:
            raise self.error(
                field,
                f"unknown key {unknown[0]!r}{_suggest(unknown[0], _TENSOR_KEYS)}; "
                f"a tensor input has {', '.join(_TENSOR_KEYS)}",
            )
        shape = value.get("shape")
        if not isinstance(shape, list) or not all((type(d) is int and d >= 0) or isinstance(d, str) for d in shape):
            raise self.error(
                f"{field}.shape", f"{shape!r} must be an array of non-negative integers and names of [model.dims]"
            )
        for d in shape:
            if isinstance(d, str) and d not in self.declared_dims:
                declared = ", ".join(self.declared_dims) or "none"
                raise self.error(
                    f"{field}.shape",
                    f"names dimension {d!r}{_suggest(d, self.declared_dims)}, which [model.dims] "
                    f"does not declare (declared: {declared})",
                )
        self.used_dims.update(d for d in shape if isinstance(d, str))
        shape = [self.declared_dims[d] if isinstance(d, str) else d for d in shape]
        dtype = value.get("dtype", "float")
        if dtype not in INPUT_DTYPES:
            raise self.error(
                f"{field}.dtype", f"{dtype!r}{_suggest(dtype, INPUT_DTYPES)} is not one of {', '.join(INPUT_DTYPES)}"
            )
        low, high = value.get("low"), value.get("high")
        for key, bound in (("low", low), ("high", high)):
            if bound is None:
                continue
            if dtype == "bool":
                raise self.error(f"{field}.{key}", "a bool input takes no range")
            wanted = (int,) if dtype == "int64" else (int, float)
            if type(bound) not in wanted:
                kind = "an integer" if dtype == "int64" else "a number"
                raise self.error(f"{field}.{key}", f"{bound!r} must be {kind} for dtype {dtype!r}")
        if low is not None and high is not None and low > high:
            raise self.error(field, f"low {low!r} is above high {high!r}")
        return TensorInput(shape=tuple(shape), dtype=dtype, low=low, high=high)

    def kwargs(self, value: Any, inputs: dict[str, tuple]) -> dict[str, dict[str, Any]]:
        if not isinstance(value, dict):
            raise self.error("kwargs", "must be a table {method = {name = value}}")
        for method, values in value.items():
            if method not in inputs:
                raise self.error(
                    f"kwargs.{method}", f"method {method!r} has no inputs; the methods are {', '.join(inputs)}"
                )
            if not isinstance(values, dict):
                raise self.error(f"kwargs.{method}", f"must be a table {{name = value}}, got {values!r}")
            for key, item in values.items():
                if type(item) not in (bool, int, float, str):
                    raise self.error(f"kwargs.{method}.{key}", f"{item!r} must be a bool, integer, float or string")
        return {m: dict(v) for m, v in value.items()}

    def check_call(self, cls: type, inputs: dict[str, tuple], kwargs: dict[str, dict]) -> None:
        for method, args in inputs.items():
            signature = inspect.signature(getattr(cls, method))
            try:
                signature.bind(None, *args, **kwargs.get(method, {}))
            except TypeError as exc:
                raise self.error(
                    f"inputs.{method}", f"{len(args)} inputs do not fit {cls.__name__}.{method}{signature}: {exc}"
                ) from None

    def float_dtypes(self, value: Any) -> tuple[str, ...]:
        dtypes = self.strings("float_dtypes", value)
        for dtype in dtypes:
            if dtype not in FLOAT_DTYPES:
                raise self.error(
                    "float_dtypes", f"{dtype!r}{_suggest(dtype, FLOAT_DTYPES)} is not one of {', '.join(FLOAT_DTYPES)}"
                )
        if not dtypes or len(set(dtypes)) != len(dtypes):
            raise self.error("float_dtypes", f"{list(dtypes)} must name at least one dtype, each once")
        return dtypes

    def ops(self, value: Any) -> tuple[str, ...]:
        ops = self.strings("ops", value)
        for op in ops:
            if not _OP.match(op):
                raise self.error("ops", f"{op!r} is not an overload name such as 'aten.mul.Tensor'")
        return ops

    def strings(self, field: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(field, f"{value!r} must be an array of strings")
        return tuple(value)

    def text(self, field: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self.error(field, f"{value!r} must be a string")
        return value


def _suggest(value: Any, choices: Any) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
