"""contract: the four methods and the declaration keep the shapes of docs/backend-contract.md#the-four-hooks.

These call the backend directly, without the lowering in between, so that a
failure names the method that broke the contract.
"""

from __future__ import annotations

import functools
from typing import Iterator

import torch

from pytest_backendconf import UnsupportedNodeError
from pytest_backendconf.suite import SuiteContext
from pytest_backendconf.debuginfo import DebugHandleRecorder
from pytest_backendconf.lowering import user_outputs
from pytest_backendconf.checks import Check, Unsupported, fail

from . import _profiling as profiling
from .._spec import section


def checks(ctx: SuiteContext) -> Iterator[Check]:
    yield Check("contract", "is_available_is_a_stable_bool", check_is_available, stage="is_available")
    yield Check("contract", "capabilities_are_well_formed", check_capabilities, stage="declaration")
    names = section("contract")["cases"]
    for name in ctx.cases if names == "all" else names:
        dtype = ctx.first_dtype(name)
        if dtype is None:
            continue
        for check, stage in (
            (check_preprocess_returns_bytes, "preprocess"),
            (check_preprocess_is_deterministic, "preprocess"),
            (check_preprocess_leaves_the_program_alone, "preprocess"),
            (check_compile_returns_a_handle_per_method, "compile"),
            (check_execute_matches_the_output_spec, "execute"),
        ):
            yield Check(
                "contract",
                f"{check.__name__.removeprefix('check_')}[{name}]",
                functools.partial(check, case_name=name, dtype=dtype),
                stage=stage,
                case=name,
            )
    yield from profiling.checks(ctx, _preprocessed)


def check_is_available(ctx: SuiteContext) -> None:
    answers = [ctx.backend.is_available() for _ in range(3)]
    if not all(isinstance(a, bool) for a in answers):
        fail(f"is_available() must return a bool; it returned {answers!r}")
    if len(set(answers)) != 1:
        fail(f"is_available() changed between calls with nothing else happening: {answers!r}")


def check_capabilities(ctx: SuiteContext) -> None:
    problems = ctx.capabilities.problems()
    if problems:
        fail("capabilities are malformed:\n" + "\n".join(f"  - {p}" for p in problems))


def _preprocessed(ctx: SuiteContext, case_name: str, dtype: str) -> dict[str, tuple]:
    """Per method: (program, debug handles, blob), preprocessed here (not by the lowering), once."""
    return ctx.memo(("contract.preprocessed", case_name, dtype), lambda: _preprocess_all(ctx, case_name, dtype))


def _preprocess_all(ctx: SuiteContext, case_name: str, dtype: str) -> dict[str, tuple]:
    out = {}
    for method in ctx.cases[case_name].methods:
        program = ctx.program(case_name, dtype, method)
        handles = DebugHandleRecorder().assign(program.graph_module)
        try:
            blob = ctx.backend.preprocess(program, {}, handles)
        except UnsupportedNodeError as exc:
            raise Unsupported.from_rejection(exc) from exc
        out[method] = (program, handles, blob)
    return out


def check_preprocess_returns_bytes(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    for method, (_, _, blob) in _preprocessed(ctx, case_name, dtype).items():
        if not isinstance(blob, bytes):
            fail(f"preprocess() returned {type(blob).__name__} for method {method!r}; it must return bytes")


def check_preprocess_is_deterministic(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    for method, (program, handles, blob) in _preprocessed(ctx, case_name, dtype).items():
        again = ctx.backend.preprocess(program, {}, handles)
        if again != blob:
            fail(
                f"preprocess() gave different bytes for the same program, compile spec and debug "
                f"handles (method {method!r}: {len(blob)} then {len(again)} bytes, first difference "
                f"at byte {_first_difference(blob, again)})"
            )


def check_preprocess_leaves_the_program_alone(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    _preprocessed(ctx, case_name, dtype)
    for method in ctx.cases[case_name].methods:
        # Compared with the program as exported, so a write by any earlier
        # preprocess call of the session is caught too.
        changes = ctx.program_changes(case_name, dtype, method)
        if changes:
            fail(
                f"preprocess() changed {', '.join(changes)} of method {method!r}; it must treat "
                "the exported program as read-only"
            )


def check_compile_returns_a_handle_per_method(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    blobs = {m: blob for m, (_, _, blob) in _preprocessed(ctx, case_name, dtype).items()}
    handles = ctx.backend.compile(dict(blobs), {m: {} for m in blobs})
    if not isinstance(handles, dict):
        fail(f"compile() returned {type(handles).__name__}; it must return a dict {{method: handle}}")
    missing = sorted(set(blobs) - set(handles))
    if missing:
        fail(f"compile() returned no handle for method(s) {missing} (got {sorted(handles)})")


def check_execute_matches_the_output_spec(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    for method, (program, _, blob) in _preprocessed(ctx, case_name, dtype).items():
        # One method per compile call: a compile that drops methods is the
        # compile check's finding, not this one's.
        handle = ctx.backend.compile({method: blob}, {method: {}})[method]
        flat = ctx.flat_inputs(case_name, dtype, method)
        outputs = ctx.backend.execute(handle, flat)
        expected = [value for _, value in user_outputs(program)]
        if not isinstance(outputs, list):
            fail(f"execute() returned {type(outputs).__name__} for method {method!r}; it must return a list")
        if len(outputs) != len(expected):
            fail(f"execute() returned {len(outputs)} outputs for method {method!r}; the program has {len(expected)}")
        for i, (got, want) in enumerate(zip(outputs, expected)):
            if isinstance(want, torch.Tensor):
                if (
                    not isinstance(got, torch.Tensor)
                    or got.dtype != want.dtype
                    or tuple(got.shape) != tuple(want.shape)
                ):
                    fail(
                        f"execute() output {i} of method {method!r} is {_describe(got)}; the program "
                        f"says {_describe(want)}"
                    )


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}] tensor"
    return f"{type(value).__name__} {value!r}"


def _first_difference(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
