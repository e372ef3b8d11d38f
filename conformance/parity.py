"""parity: every zoo model, in every dtype the backend declares, matches eager PyTorch.

Inputs come from Hypothesis (uniform values, the range's edge values, and
both mixed); tolerances from the backend's declaration, else the defaults in
``suite.toml``. A model the backend rejects is *unsupported*, never a pass.
"""

from __future__ import annotations

import functools
from typing import Iterator

import torch
from hypothesis import given, seed as hypothesis_seed, strategies as st

from pytest_backendconf import UnsupportedNodeError
from pytest_backendconf._context import FIXED, INPUT_MODES, SuiteContext
from pytest_backendconf._hypothesis import PROFILES
from pytest_backendconf._check import Check, CheckFailed, Unsupported

from ._spec import section


def checks(ctx: SuiteContext) -> Iterator[Check]:
    for case in ctx.cases.values():
        for dtype in ctx.dtypes_for(case):
            for method in case.methods:
                suffix = "" if method == "forward" else f".{method}"
                yield Check(
                    category="parity",
                    name=f"{case.name}{suffix}[{dtype}]",
                    run=functools.partial(check_parity, case_name=case.name, dtype=dtype, method=method),
                    stage="execute",
                    case=case.name,
                )


def lowered_or_unsupported(ctx: SuiteContext, case_name: str, dtype: str):
    """The case lowered to the backend; `Unsupported` if the backend rejects a node."""
    try:
        return ctx.lower(case_name, dtype)
    except UnsupportedNodeError as exc:
        raise Unsupported.from_rejection(exc) from exc


def tolerance(ctx: SuiteContext, dtype: str) -> tuple[float, float]:
    declared = ctx.capabilities.tolerances or {}
    torch_dtype = getattr(torch, "float32" if dtype == FIXED else dtype)
    if torch_dtype in declared:
        return declared[torch_dtype]
    rtol, atol = section("parity")["tolerances"].get(str(torch_dtype).removeprefix("torch."), (0.0, 0.0))
    return float(rtol), float(atol)


def check_parity(ctx: SuiteContext, *, case_name: str, dtype: str, method: str) -> None:
    lowered = lowered_or_unsupported(ctx, case_name, dtype)
    eager = getattr(ctx.module(case_name, dtype), method)
    run = getattr(lowered, method)
    rtol, atol = tolerance(ctx, dtype)
    profile = PROFILES[ctx.hypothesis_profile]

    @profile
    @given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(INPUT_MODES))
    def compare(seed: int, mode: str) -> None:
        args, kwargs = ctx.example(case_name, dtype, method, seed=seed, mode=mode)
        originals = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        expected = eager(*args, **kwargs)
        actual = run(*args, **kwargs)
        try:
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as exc:
            raise CheckFailed(
                f"{case_name}.{method} in {dtype}: the backend's outputs differ from eager PyTorch "
                f"(rtol={rtol}, atol={atol}) for inputs drawn with seed={seed}, mode={mode!r}:\n{exc}"
            ) from None
        for i, (before, after) in enumerate(zip(originals, args)):
            if isinstance(before, torch.Tensor) and not torch.equal(before, after):
                raise CheckFailed(f"{case_name}.{method}: execute() changed input {i} in place")

    if not profile.derandomize:
        compare = hypothesis_seed(ctx.hypothesis_seed)(compare)
    compare()
