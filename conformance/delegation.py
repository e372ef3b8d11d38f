"""delegation: models the backend cannot run whole still run, partially delegated.

For every model and dtype that whole-method lowering rejects, the suite lowers
it with ``partition="supported"`` (docs/writing-a-backend.md, "Partial
delegation"): the backend runs the groups of nodes it accepts, the CPU
fallback the rest. Each such run must match eager PyTorch, survive an archive
round trip, and (for the models in ``suite.toml``) load and run on the
simulated target. What a backend declares it supports (``supported_nodes``,
``Capabilities.supported_ops``) must agree with what its ``preprocess``
accepts: declaring an op and then rejecting it is a contract failure naming
the op, not a silent "unsupported". A backend that lowers a model whole needs
none of this; that run is reported as "not needed".
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

import torch

import pytest_backendconf as bc
from pytest_backendconf import _compat
from pytest_backendconf.suite import SuiteContext
from pytest_backendconf.lowering import lower_programs
from pytest_backendconf.lowering import op_overload
from pytest_backendconf.checks import Check, CheckFailed, NotNeeded, Unsupported
from pytest_backendconf.numerics import InvalidIndices, StructureMismatch, compare_outputs
from pytest_backendconf.errors import LoweringError, UnsupportedNodeError


from ._spec import section


def checks(ctx: SuiteContext) -> Iterator[Check]:
    for case in ctx.cases.values():
        for dtype in ctx.dtypes_for(case):
            yield Check(
                category="delegation",
                name=f"{case.name}[{dtype}]",
                run=functools.partial(check_partial_delegation, case_name=case.name, dtype=dtype),
                stage="execute",
                case=case.name,
            )
    for name in section("delegation")["target_cases"]:
        first = ctx.first_dtype(name) if name in ctx.cases else None
        if first is not None:
            yield Check(
                category="delegation",
                name=f"target[{name}]",
                run=functools.partial(check_target, case_name=name, dtype=first),
                stage="target",
                case=name,
            )


def check_partial_delegation(ctx: SuiteContext, *, case_name: str, dtype: str) -> dict[str, Any]:
    lowered = _partitioned(ctx, case_name, dtype)
    records = bc.delegation(lowered)
    delegated = sum(len(r.delegated) for r in records.values())
    total = sum(r.total for r in records.values())
    if delegated == 0:
        raise Unsupported(f"{case_name} ({dtype}): the backend accepts none of its {total} op nodes")
    _check_parity(ctx, lowered, case_name, dtype)
    _check_round_trip(ctx, lowered, case_name, dtype)
    # The report keeps these per test; the summary adds them up.
    return {
        "delegation": {
            "delegated": delegated,
            "total": total,
            "partitions": sum(r.partitions for r in records.values()),
        }
    }


def check_target(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    from .parity import tie_judge, tolerance_for

    lowered = _partitioned(ctx, case_name, dtype)
    path = ctx.tmp_dir(f"delegation-{case_name}") / "model.bcpt"
    bc.save(lowered, path)
    calls = {
        method: [ctx.example(case_name, dtype, method, seed=s)[0] for s in section("delegation")["seeds"]]
        for method in ctx.cases[case_name].methods
    }
    result = bc.run_on_target(path, calls)
    if not result["loaded"]:
        error = result["error"]
        raise CheckFailed(
            f"{case_name} ({dtype}), partially delegated: the archive did not load on the target "
            f"({', '.join(result['blocked'])} blocked): {error['type']}: {error['message']}"
        )
    tol = tolerance_for(ctx, dtype, case_name)
    for method, examples in calls.items():
        for i, args in enumerate(examples):
            error = result["errors"][method][i]
            if error is not None:
                raise CheckFailed(f"{case_name}.{method} ({dtype}) on the target: {error['type']}: {error['message']}")
            want = getattr(lowered, method)(*args)
            got = list(_compat.tree_leaves(result["outputs"][method][i]))
            text = ""
            try:
                # Host and target may break ties apart (another kernel, another thread count): both must be valid.
                ties = tie_judge(ctx, case_name, dtype, method, args, {})
                if ties is not None:
                    got, _ = ties(got, list(_compat.tree_leaves(want)))
                results = compare_outputs(got, want, tol)
            except (StructureMismatch, InvalidIndices) as exc:
                results, text = [], str(exc)
            failing = [r for r in results if not r.passed]
            if failing or text:
                raise CheckFailed(
                    f"{case_name}.{method} ({dtype}): partially delegated, the target gives other outputs "
                    f"than the host:\n" + ("\n".join(r.text() for r in failing) if failing else text)
                )


# --- lowering, once per (case, dtype) ----------------------------------------------------------


def _partitioned(ctx: SuiteContext, case_name: str, dtype: str) -> Any:
    """The case lowered with partition="supported"; `NotNeeded` if the whole method lowers."""
    outcome = ctx.memo(("delegation", case_name, dtype), lambda: _lower(ctx, case_name, dtype))
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _lower(ctx: SuiteContext, case_name: str, dtype: str) -> Any:
    try:
        ctx.lower(case_name, dtype)  # parity's lowering: shared, so free when it already ran
    except UnsupportedNodeError as exc:
        contradiction = _declared_but_rejected(ctx, case_name, dtype, exc)
        if contradiction:
            return CheckFailed(contradiction)
    else:
        return NotNeeded(f"the backend lowers {case_name} ({dtype}) whole")
    case = ctx.cases[case_name]
    spec: dict[str, dict[str, Any]] = {m: {} for m in case.methods}
    programs = {m: ctx.program(case_name, dtype, m) for m in case.methods}
    try:
        return lower_programs(
            programs,
            ctx.backend,
            spec,
            module_type=type(ctx.module(case_name, dtype)),
            backend_version=ctx.registered.source.version,
            partition="supported",
        )
    except UnsupportedNodeError as exc:
        # The backend said it takes this node (by declaration, or by accepting
        # its op on its own), and then rejected it inside a larger partition.
        node = exc.node
        named = f"node {node.name!r} ({op_overload(node)})" if isinstance(node, torch.fx.Node) else f"{node!r:.80}"
        return CheckFailed(
            f"{case_name} ({dtype}): the backend claimed {named} "
            f"{_how_claimed(ctx)}, but its preprocess rejected it in a partition: a backend must accept "
            f"every node it claims. Rejection:\n{exc}"
        )
    except LoweringError as exc:
        return Unsupported(f"{case_name} ({dtype}) cannot be split into partitions: {exc}")


def _how_claimed(ctx: SuiteContext) -> str:
    if callable(getattr(ctx.backend, "supported_nodes", None)):
        return "in supported_nodes()"
    if ctx.capabilities.supported_ops is not None:
        return "in Capabilities.supported_ops"
    return "(its preprocess accepted the op alone)"


def _declared_but_rejected(ctx: SuiteContext, case_name: str, dtype: str, exc: UnsupportedNodeError) -> str | None:
    """The contract failure when the backend declared the node it rejects, else None."""
    node = getattr(exc, "node", None)
    if node is None or getattr(node, "op", None) != "call_function":
        return None
    op = op_overload(node)
    supported_nodes = getattr(ctx.backend, "supported_nodes", None)
    if callable(supported_nodes):
        for method in ctx.cases[case_name].methods:
            program = ctx.program(case_name, dtype, method)
            if node.graph is program.graph and node.name in set(supported_nodes(program, {})):
                return (
                    f"{case_name} ({dtype}): supported_nodes() of backend {ctx.backend.name!r} lists node "
                    f"{node.name!r} ({op}), but preprocess rejected it: declaring a node and rejecting it "
                    f"breaks the contract. Rejection:\n{exc}"
                )
        return None
    declared = ctx.capabilities.supported_ops
    dtypes = ctx.capabilities.dtypes
    values = [v for v in _compat.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
    if declared is not None and op in declared and (dtypes is None or all(v.dtype in dtypes for v in values)):
        return (
            f"{case_name} ({dtype}): backend {ctx.backend.name!r} declares {op} in Capabilities.supported_ops, "
            f"but preprocess rejected node {node.name!r}: declaring an op and rejecting it breaks the "
            f"contract (remove it from supported_ops, or accept it). Rejection:\n{exc}"
        )
    return None


# --- what each run must do ---------------------------------------------------------------------


def _check_parity(ctx: SuiteContext, lowered: Any, case_name: str, dtype: str) -> None:
    """Parity's rule and texts (three-way in float16/bfloat16, closeness, where it diverges) per example seed."""
    from .parity import _compare_with_eager, _Differs, _how, divergence_text, tie_judge, tolerance_for, truth_for

    tol = tolerance_for(ctx, dtype, case_name)
    truth = truth_for(ctx, case_name, dtype)
    for method in ctx.cases[case_name].methods:
        eager = getattr(ctx.module(case_name, dtype), method)
        for seed in section("delegation")["seeds"]:
            args, kwargs = ctx.example(case_name, dtype, method, seed=seed)
            ties = tie_judge(ctx, case_name, dtype, method, args, kwargs)
            expected = eager(*args, **kwargs)
            wide = truth(method, args, kwargs, expected) if truth is not None else None
            actual = getattr(lowered, method)(*args, **kwargs)
            record = bc.delegation(lowered)[method]
            where = f"{case_name}.{method} in {dtype}, partially delegated ({record.summary()})"
            try:
                _compare_with_eager(
                    actual,
                    expected,
                    tol,
                    {},
                    (args, kwargs, None),
                    where,
                    after=f" for example seed {seed}",
                    truth=wide,
                    how=_how(truth, wide),
                    ties=ties,
                )
            except _Differs as exc:
                details = dict(exc.details or {})
                located = divergence_text(ctx, case_name, dtype, method, args, kwargs, tol, details=details)
                raise CheckFailed(f"{exc}{located}", details=details) from None


def _check_round_trip(ctx: SuiteContext, lowered: Any, case_name: str, dtype: str) -> None:
    from pytest_backendconf import lowering as _lowering

    loaded = bc.load(_lowering.to_bytes(lowered))
    if bc.delegation(loaded) != bc.delegation(lowered):
        raise CheckFailed(f"{case_name} ({dtype}): the archive does not keep the partitions: {bc.delegation(loaded)}")
    for method in ctx.cases[case_name].methods:
        args, kwargs = ctx.example(case_name, dtype, method, seed=0)
        before = getattr(lowered, method)(*args, **kwargs)
        after = getattr(loaded, method)(*args, **kwargs)
        try:
            torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True)
        except AssertionError as exc:
            raise CheckFailed(
                f"{case_name}.{method} ({dtype}), partially delegated: loaded from its archive it gives other "
                f"outputs than before saving:\n{exc}"
            ) from None
