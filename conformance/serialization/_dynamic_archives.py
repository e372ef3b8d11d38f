"""serialization, dynamic shapes: a module lowered with varying dimensions keeps them in its archive.

For each model with ``[model.dims]`` (first dtype), the module parity
lowered with dynamic shapes is saved and loaded, here and in the target
process, and called at the example sizes and then at a second shape (every
Dim at its maximum) and its minimum: the outputs must match the module it
was saved from, and a size outside the exported range must still be
refused with `InputSpecError`, since the ranges come from the archive.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Iterator

import pytest_backendconf as bc
from pytest_backendconf import lowering as _lowering
from pytest_backendconf.checks import Check, CheckFailed, fail

from ..extra_process import session
from ._saved_archives import SavedLowerings, serialization_check, target_scenario
from .._session_work import Scenario

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

#: The calls made per method: the example sizes, a second shape, the minimum, then one outside the range.
SHAPES = ("example", "max", "min", "outside")


def checks(ctx: SuiteContext) -> Iterator[Check]:
    cases = [(c.name, dtype) for c in ctx.cases.values() if c.dims and (dtype := ctx.first_dtype(c.name))]
    for name, dtype in cases:
        yield serialization_check(check_dynamic_round_trip, name, dtype, "load")
    for name, dtype in cases:
        yield serialization_check(check_dynamic_target_round_trip, name, dtype, "target")


class _Saved:
    """One case's dynamic lowering, its archive, the calls at each shape and the outputs."""

    def __init__(self, ctx: SuiteContext, case: str, dtype: str) -> None:
        from ..parity import lowered_or_unsupported

        self.lowered = lowered_or_unsupported(ctx, case, dtype, dynamic=True)
        self.data = _lowering.to_bytes(self.lowered)
        self.case, self.dtype = case, dtype
        model = ctx.cases[case]
        self.calls: dict[str, list[tuple[tuple, dict]]] = {}
        self.outside: dict[str, str] = {}
        for method in model.methods:
            dims = model.method_dims(method)
            if not dims:
                continue
            first = next(iter(dims))
            sizes = [
                {},
                {n: d.max for n, d in dims.items()},
                {n: d.min for n, d in dims.items()},
                {first: dims[first].max + 1},
            ]
            self.calls[method] = [ctx.example(case, dtype, method, seed=i, sizes=s) for i, s in enumerate(sizes)]
            self.outside[method] = (
                f"{first}={dims[first].max + 1}, above its range [{dims[first].min}, {dims[first].max}]"
            )

    @functools.cached_property
    def _outputs(self) -> dict[str, list[Any]] | Exception:
        found: dict[str, list[Any]] = {}
        for method, calls in self.calls.items():
            found[method] = []
            for shape, (args, kwargs) in zip(SHAPES, calls[:-1]):
                try:
                    found[method].append(getattr(self.lowered, method)(*args, **kwargs))
                except bc.OutputSpecError as exc:
                    return CheckFailed(
                        f"{self.case}.{method} ({self.dtype}) with dynamic shapes, at the {shape} sizes, before saving: {exc}"
                    )
        return found

    @property
    def outputs(self) -> dict[str, list[Any]]:
        """Per method, the lowered module's outputs for the calls inside the range."""
        if isinstance(self._outputs, Exception):
            raise self._outputs
        return self._outputs


_SAVED: SavedLowerings[_Saved] = SavedLowerings()


def _saved(ctx: SuiteContext, case: str, dtype: str) -> _Saved:
    return _SAVED.get(ctx, case, lambda: _Saved(ctx, case, dtype))


def _compare(case: str, dtype: str, method: str, where: str, got: list, want: list, *, rtol=0.0, atol=0.0) -> None:
    from .._session_work import same_outputs as _same

    for shape, actual, expected in zip(SHAPES, got, want):
        problem = _same(actual, expected, rtol=rtol, atol=atol)
        if problem:
            fail(
                f"{case}.{method} ({dtype}) with dynamic shapes, called at the {shape} sizes {where}: the "
                f"outputs differ from the lowered module it was saved from (rtol={rtol}, atol={atol}):\n{problem}"
            )


def check_dynamic_round_trip(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    saved = _saved(ctx, case, dtype)
    try:
        loaded = bc.load(saved.data)
    except Exception as exc:
        fail(f"{case} ({dtype}): loading the archive of its dynamic-shape lowering raised {type(exc).__name__}: {exc}")
    for method, calls in saved.calls.items():
        run = getattr(loaded, method)
        got = []
        for shape, (args, kwargs) in zip(SHAPES, calls[:-1]):
            try:
                got.append(run(*args, **kwargs))
            except bc.OutputSpecError as exc:
                fail(f"{case}.{method} ({dtype}) with dynamic shapes, at the {shape} sizes after load: {exc}")
        _compare(case, dtype, method, "after load", got, saved.outputs[method])
        args, kwargs = calls[-1]
        try:
            run(*args, **kwargs)
        except bc.InputSpecError:
            continue
        fail(
            f"{case}.{method} ({dtype}): after load the module accepted {saved.outside[method]}; the archive "
            "lost the exported ranges"
        )


def scenarios_at_hand(ctx: SuiteContext) -> list[Scenario]:
    """Target scenarios for the dynamic lowerings parity has made already (none lowered here)."""
    found = []
    for case in ctx.cases.values():
        dtype = ctx.first_dtype(case.name)
        if case.dims and dtype is not None and ctx.has_lowered(case.name, dtype, dynamic=True):
            try:
                found.append(_scenario(ctx, case.name, dtype))
            except Exception:  # unsupported or broken: the case's own checks report it
                continue
    return found


def _scenario(ctx: SuiteContext, case: str, dtype: str) -> Scenario:
    saved = _saved(ctx, case, dtype)
    return target_scenario(ctx, f"serialization-dynamic:{case}", f"{case}-dynamic.bcpt", saved.data, saved.calls)


def check_dynamic_target_round_trip(ctx: SuiteContext, *, case: str, dtype: str) -> None:
    from ..parity import tolerance

    saved = _saved(ctx, case, dtype)
    runs = session(ctx, "serialization")
    key = f"serialization-dynamic:{case}"
    with _SAVED.lock:
        if key not in runs.placed:
            more = [s for s in scenarios_at_hand(ctx) if s.key not in runs.placed]
            runs.place([_scenario(ctx, case, dtype)] + [s for s in more if s.key != key], [])
    result = runs.result(key)
    if not result["loaded"]:
        error = result["error"]
        fail(
            f"{case} ({dtype}): the archive of its dynamic-shape lowering did not load on the target: "
            f"{error['type']}: {error['message']}"
        )
    rtol, atol = tolerance(ctx, dtype)
    for method, expected in saved.outputs.items():
        errors = result["errors"][method]
        for shape, error in zip(SHAPES, errors[:-1]):
            if error is not None:
                fail(
                    f"{case}.{method} ({dtype}) with dynamic shapes, at the {shape} sizes on the target: "
                    f"{error['type']}: {error['message']}"
                )
        _compare(case, dtype, method, "on the target", result["outputs"][method][:-1], expected, rtol=rtol, atol=atol)
        if errors[-1] is None or errors[-1]["type"] != "InputSpecError":
            got = "was accepted" if errors[-1] is None else f"raised {errors[-1]['type']}: {errors[-1]['message']}"
            fail(
                f"{case}.{method} ({dtype}): on the target, a call with {saved.outside[method]} {got}; the loaded "
                "module must refuse it with InputSpecError from the ranges in the archive"
            )
