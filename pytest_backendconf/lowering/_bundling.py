"""Bundled inputs: what ``save(..., bundled_inputs=...)`` stores, and `bundles` to read them back.

The lowered module keeps no eager module, so the expected outputs come from
the caller: each entry of ``bundled_inputs`` is either a tuple of inputs,
whose expected outputs are computed here by calling the eager module passed
as ``eager=`` (on the host, at save time), or a `Bundle` that already
carries its expected outputs and tolerance (what the suite's golden folder
writes: eager's outputs from the check itself).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Mapping, cast

import torch

from .. import _compat
from ..archive import Bundle, encode_bundles
from ..capabilities import capabilities_of
from ..errors import ArchiveError

if TYPE_CHECKING:
    from ..capabilities import Pair
    from ._lowered_module import LoweredModule, WrapperModule

#: (rtol, atol) per dtype when neither ``tolerance=`` nor the backend's ``Capabilities.tolerances`` gives
#: one: ``torch.testing.assert_close``'s defaults, which are also the conformance suite's parity
#: defaults (tests/test_bundles.py keeps the two equal).
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}


def bundles(module: WrapperModule | LoweredModule, method: str = "forward") -> list[Bundle]:
    """The bundles of ``method`` of a module loaded from an archive: inputs, expected outputs, tolerance."""
    lowered: object = getattr(module, "lowered", module)
    if not hasattr(lowered, "methods") or not hasattr(lowered, "bundles"):
        raise TypeError(f"bundles() needs a lowered module (from load or to_backend), got {type(module).__name__}")
    if method not in lowered.methods:
        raise ValueError(f"the lowered module has no method {method!r} (its methods: {', '.join(lowered.methods)})")
    return [] if lowered.bundles is None else lowered.bundles.decode(method)


def bundle_entries(
    core: LoweredModule, bundled_inputs: object, eager: object, tolerance: tuple[float, float] | None
) -> dict[str, bytes]:
    """The archive entries of the bundles to save with ``core`` (a `LoweredModule`)."""
    if bundled_inputs is None:
        if eager is not None or tolerance is not None:
            raise ArchiveError("save(eager=..., tolerance=...) are for bundled_inputs=; pass the inputs to bundle too")
        return core.bundles.entries() if core.bundles is not None else {}
    if not isinstance(bundled_inputs, Mapping):
        raise ArchiveError(
            'bundled_inputs must be {"method": [(input, ...), ...]}, got ' + type(bundled_inputs).__name__
        )
    if tolerance is not None and (
        not isinstance(tolerance, tuple)
        or len(tolerance) != 2
        or not all(isinstance(v, (int, float)) for v in tolerance)
    ):
        raise ArchiveError(f"tolerance must be a pair (rtol, atol), got {tolerance!r}")
    made: dict[str, list[Bundle]] = {}
    for method, items in bundled_inputs.items():
        if method not in core.methods:
            raise ArchiveError(
                f"bundled_inputs names method {method!r}, which the lowered module does not have "
                f"(its methods: {', '.join(core.methods)})"
            )
        if not isinstance(items, (list, tuple)):
            raise ArchiveError(f"bundled_inputs[{method!r}] must be a list of input tuples, got {type(items).__name__}")
        made[method] = [_bundle(core, method, i, item, eager, tolerance) for i, item in enumerate(items)]
    return encode_bundles(made, list(core.methods))


def _bundle(
    core: LoweredModule, method: str, i: int, item: object, eager: object, tolerance: tuple[float, float] | None
) -> Bundle:
    where = f"bundled_inputs[{method!r}][{i}]"
    if isinstance(item, Bundle):
        return item
    if not isinstance(item, tuple):
        raise ArchiveError(f"{where} must be a tuple of positional inputs (or a Bundle), got {type(item).__name__}")
    if eager is None:
        raise ArchiveError(
            f"{where}: the expected outputs are eager PyTorch's, and the lowered module keeps no eager "
            "module: pass it as save(..., eager=model), or give Bundle(inputs, expected, rtol, atol) entries"
        )
    function = getattr(eager, method, None) if method != "forward" else eager
    if not callable(function):
        raise ArchiveError(
            f"{where}: eager={type(eager).__name__} has no method {method!r} to compute the expected outputs"
        )
    with torch.no_grad():
        expected = function(*copy.deepcopy(item))
    rtol, atol, source = _tolerance(core, expected, tolerance)
    return Bundle(inputs=item, expected=_detached(expected), rtol=rtol, atol=atol, tolerance=source)


def _tolerance(core: LoweredModule, expected: object, given: tuple[float, float] | None) -> tuple[float, float, str]:
    if given is not None:
        return float(given[0]), float(given[1]), "given to save()"
    floats = [t.dtype for t in _compat.tree_leaves(expected) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        return 0.0, 0.0, "exact (no floating-point outputs)"
    # The loosest dtype among the outputs decides: one tolerance per bundle.
    dtype = max(floats, key=lambda d: DEFAULT_TOLERANCES.get(str(d).removeprefix("torch."), (0.0, 0.0))[0])
    name = str(dtype).removeprefix("torch.")
    declared = capabilities_of(core.backend).tolerances or {}
    if dtype in declared:
        rtol, atol = cast("Pair", declared[dtype])  # a dtype's entry is a pair (Capabilities.tolerances)
        return float(rtol), float(atol), f"the backend's capabilities for {name}"
    rtol, atol = DEFAULT_TOLERANCES.get(name, (0.0, 0.0))
    return rtol, atol, f"default for {name}"


def _detached(value: object) -> object:
    return _compat.tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)
