"""contract, profiling: ``execute_profiled`` returns what ``execute`` does, and events that can be trusted.

Only for backends that implement the optional ``execute_profiled(handle,
inputs) -> (outputs, events)`` (docs/writing-a-backend.md, "Profiling").
Like the other contract checks it calls the backend directly, on the
blobs the contract category preprocessed. For each case of ``[contract]
profiling_cases`` and each method, one call must give the outputs
``execute`` gives for the same inputs, and events that

- name only debug handles of that method's nodes,
- lie within the call, on the ``time.perf_counter_ns`` clock, start <= end,
- cover the delegated nodes: every op node of the method has at least one
  event (a backend that fuses nodes reports the fused kernel's time once per
  node it covers); nodes that do no work at run time (`NO_WORK`) may have none.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Iterator, cast

import torch

from pytest_backendconf.debuginfo import walk_nodes
from pytest_backendconf.debuginfo import op_name
from pytest_backendconf.diagnostics import Call, check_events
from pytest_backendconf.checks import Check, fail
from pytest_backendconf.errors import BackendContractError

from .._spec import section

if TYPE_CHECKING:
    from pytest_backendconf.backend import ProfilesExecution
    from pytest_backendconf.suite import SuiteContext

#: Ops with nothing to run on a device: shape assertions and tuple indexing.
NO_WORK = ("aten::_assert", "aten::sym_constrain_range", "aten::_functional_sym_constrain_range", "getitem")


def checks(ctx: SuiteContext, preprocessed: Any) -> Iterator[Check]:
    """:param preprocessed: the contract category's ``_preprocessed(ctx, case, dtype)`` (its blobs, shared)."""
    if not callable(getattr(ctx.backend, "execute_profiled", None)):
        return
    for case in section("contract").get("profiling_cases", ()):
        dtype = ctx.first_dtype(case) if case in ctx.cases else None
        if dtype is not None:
            yield Check(
                "contract",
                f"execute_profiled_events[{case}]",
                functools.partial(check_execute_profiled, case=case, dtype=dtype, preprocessed=preprocessed),
                stage="execute",
                case=case,
            )


def check_execute_profiled(ctx: SuiteContext, *, case: str, dtype: str, preprocessed: Any) -> None:
    backend = ctx.backend
    for method, (program, handles, blob) in preprocessed(ctx, case, dtype).items():
        where = f"{case}.{method} ({dtype})"
        handle = backend.compile({method: blob}, {method: {}})[method]
        flat = ctx.flat_inputs(case, dtype, method)
        expected = backend.execute(handle, flat)
        start = time.perf_counter_ns()
        try:
            # checks() makes this check only for a backend with a callable execute_profiled.
            answer = cast("ProfilesExecution", backend).execute_profiled(handle, flat)
        except Exception as exc:
            fail(f"{where}: execute_profiled() failed where execute() did not: {type(exc).__name__}: {exc}")
        end = time.perf_counter_ns()
        if not isinstance(answer, tuple) or len(answer) != 2:
            fail(f"{where}: execute_profiled() must return (outputs, events), got {type(answer).__name__}")
        outputs, events = answer
        try:
            torch.testing.assert_close(list(outputs), list(expected), equal_nan=True)
        except (AssertionError, TypeError) as exc:
            fail(f"{where}: execute_profiled() returned other outputs than execute():\n{exc}")
        try:
            call = Call(start, end, check_events(events, backend.name, method))
        except BackendContractError as exc:
            fail(f"{where}: {exc}")
        nodes = {handles[n]: (n.name, op_name(n)) for n in walk_nodes(program.graph_module)}
        delegated = [n.name for n in program.graph.nodes if n.op == "call_function"]
        problems = event_problems(call, nodes, delegated)
        if problems:
            fail(
                f"{where}: execute_profiled() events are wrong:\n  "
                + "\n  ".join(problems[:10])
                + "\nEvents are (debug_handle, start_ns, end_ns): the handle preprocess was given for the node, "
                "times from time.perf_counter_ns taken during the call, at least one event per delegated node."
            )


def event_problems(call: Call, nodes: dict[int, tuple[str, str]], delegated: list[str]) -> list[str]:
    """What is wrong with one call's events (empty: nothing).

    :param nodes: ``{debug handle: (node name, op)}`` of every node of the method.
    :param delegated: names of the op nodes the backend runs.
    """
    problems = []
    for i, (handle, start, end) in enumerate(call.events or ()):
        if handle not in nodes:
            problems.append(f"event {i} names debug handle {handle}, which is no node of this method")
        if not call.start_ns <= start <= end <= call.end_ns:
            problems.append(
                f"event {i} (handle {handle}) spans {start}..{end} ns, outside the call "
                f"{call.start_ns}..{call.end_ns} ns (time.perf_counter_ns)"
            )
    seen = {nodes[h][0] for h, _, _ in call.events or () if h in nodes}
    ops = dict(nodes.values())
    missing = [n for n in delegated if n not in seen and not ops.get(n, "").startswith(NO_WORK)]
    if missing:
        shown = ", ".join(f"{n!r} ({ops.get(n, '?')})" for n in missing[:8])
        problems.append(f"no event for {len(missing)} of the {len(delegated)} delegated nodes: {shown}")
    return problems
