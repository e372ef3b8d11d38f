"""Checking `to_backend`'s arguments: the backend, the method compile spec, the example inputs.

Each check names the argument that is wrong and how to write it, before
anything is exported.
"""

from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from ..backend import TorchScriptBackend
from ..registry import Source, check_backend, lookup_backend
from ..errors import BackendContractError, LoweringError

if TYPE_CHECKING:
    from ..backend import Backend


def resolve_backend(backend: str | object) -> tuple[Backend, Source | None]:
    found: Backend | TorchScriptBackend
    if isinstance(backend, str):
        registered = lookup_backend(backend)
        found = registered.backend
        source: Source | None = registered.source
    else:
        found, source = check_backend(backend, Source("the backend object given to to_backend()")), None
    if isinstance(found, TorchScriptBackend):
        raise LoweringError(
            f"backend {found.name!r} is a TorchScript backend (C++ behind torch._C._jit_to_backend): "
            "bc.to_backend lowers torch.export programs. Lower a scripted module with "
            f"torch._C._jit_to_backend({found.name!r}, scripted, {{'forward': {{'': ''}}}}) after "
            "torch.ops.load_library of its library"
        )
    return found, source


def availability(backend: Backend) -> bool:
    try:
        available = backend.is_available()
    except Exception as exc:
        raise BackendContractError(
            f"is_available() of backend {backend.name!r} raised {type(exc).__name__}: {exc}; it must return "
            "True or False (False, with unavailable_reason() saying why, when it cannot tell)"
        ) from exc
    if not isinstance(available, bool):
        raise BackendContractError(
            f"is_available() of backend {backend.name!r} returned {available!r}; it must return a bool"
        )
    return available


def check_compile_spec(module: torch.nn.Module, spec: object) -> dict[str, dict[str, Any]]:
    if not isinstance(spec, Mapping) or not spec:
        raise LoweringError(
            f"the method compile spec must be a non-empty dict {{method_name: {{key: value}}}}, "
            f"got {spec!r}; e.g. {{'forward': {{}}}}"
        )
    checked: dict[str, dict[str, Any]] = {}
    for name, options in spec.items():
        method = getattr(type(module), name, None) if isinstance(name, str) else None
        if not isinstance(name, str) or not inspect.isfunction(method):
            methods = sorted(
                n for n, v in vars(type(module)).items() if inspect.isfunction(v) and not n.startswith("_")
            )
            raise LoweringError(
                f"compile-spec key {name!r} is not a method of {type(module).__name__}; "
                f"its methods: {', '.join(methods) or 'none'}"
            )
        if not isinstance(options, Mapping):
            raise LoweringError(
                f"the compile spec of method {name!r} must be a dict of options, got {type(options).__name__}"
            )
        check_json(options, f"compile spec of method {name!r}")
        # A deep copy through JSON: later changes to the caller's dict cannot leak in.
        checked[name] = json.loads(json.dumps(options))
    return checked


#: How deep a compile spec may nest; JSON readers elsewhere (a target runtime) have limits too.
_MAX_SPEC_DEPTH = 32
#: Integers in a compile spec fit in 64 bits, as a JSON reader in another language needs.
_SPEC_INT_RANGE = (-(2**63), 2**64 - 1)


def check_json(value: object, where: str, path: str = "", _open: tuple[int, ...] = ()) -> None:
    at = path or "top level"
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in _open:
            raise LoweringError(
                f"{where} contains itself at {at}; compile-spec values must be a tree (JSON), not a cycle"
            )
        if len(_open) >= _MAX_SPEC_DEPTH:
            raise LoweringError(f"{where} nests deeper than {_MAX_SPEC_DEPTH} levels at {at}; flatten it")
        _open = (*_open, id(value))
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise LoweringError(f"{where} has key {key!r} at {at}; keys must be strings")
            check_json(item, where, f"{path}[{key!r}]", _open)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json(item, where, f"{path}[{i}]", _open)
    elif (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not (_SPEC_INT_RANGE[0] <= value <= _SPEC_INT_RANGE[1])
    ):
        raise LoweringError(
            f"{where} has an integer of {value.bit_length()} bits at {at}; compile-spec integers must fit "
            "in 64 bits (pass a big number as a string)"
        )
    elif not (
        value is None
        or isinstance(value, (bool, int, str))
        or isinstance(value, float)
        and value == value
        and abs(value) != float("inf")
    ):
        raise LoweringError(
            f"{where} has a value of type {type(value).__name__} at {path}; compile-spec values must "
            "be JSON-compatible (dict with string keys, list, str, int, finite float, bool, None)"
        )


def check_examples(
    specs: Mapping[str, object], example_inputs: object, example_kwargs: Mapping[str, object]
) -> dict[str, tuple[tuple, dict]]:
    if isinstance(example_inputs, tuple):
        example_inputs = {"forward": example_inputs}
    if not isinstance(example_inputs, Mapping):
        raise LoweringError(
            "example_inputs must be a tuple (for forward) or a dict {method_name: tuple}, "
            f"got {type(example_inputs).__name__}"
        )
    out = {}
    for name in specs:
        if name not in example_inputs:
            raise LoweringError(
                f"no example inputs for method {name!r}: pass example_inputs={{{name!r}: (...)}} "
                "with one tuple of example arguments per lowered method"
            )
        args = example_inputs[name]
        if not isinstance(args, tuple):
            raise LoweringError(
                f"example inputs of method {name!r} must be a tuple, got {type(args).__name__}; "
                "write (x,) for a single input"
            )
        kwargs = example_kwargs.get(name, {})
        if not isinstance(kwargs, Mapping):
            raise LoweringError(f"example_kwargs of method {name!r} must be a dict, got {type(kwargs).__name__}")
        out[name] = (args, dict(kwargs))
    extra = sorted(set(example_inputs) - set(specs))
    if extra:
        raise LoweringError(f"example inputs given for {extra}, which the compile spec does not lower")
    return out


def normalize(function: Callable[..., object], name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Bind the example call to the method's signature and fill in defaults,

    so that the exported structure is the one every later call is normalized to.
    """
    signature = inspect.signature(function)
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise LoweringError(f"example inputs do not fit method {name!r}{signature}: {exc}") from None
    bound.apply_defaults()
    return tuple(bound.args[1:]), dict(bound.kwargs)
