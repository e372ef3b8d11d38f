"""symbolication: every backend error points at the user's own source (docs/backend-contract.md#debug-handles-and-texts).

Three kinds of checks, all driven by ``[symbolication]`` in ``suite.toml``:

- a custom op no backend can know must be rejected at ``preprocess`` with
  `UnsupportedNodeError` whose text names the source line, with carets;
- a fault injected at a named node must come back from ``execute`` as a
  `BackendRuntimeError` with the debug handle this lowering gave that
  node, and the module hierarchy and source frames;
- ``bc.debug_info`` must cover every node of every lowered method.

Expected texts are built from the frames the data names (function and
expression), with file, line and columns read from the source file, so
the checks never depend on line numbers written down somewhere. A backend
that runs the probe op correctly (a fallback to eager for any op) has no
rejection to check: those checks skip.
"""

from __future__ import annotations

import collections
import copy
import functools
import inspect
import sys
from typing import Any, Iterator

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf import BackendRuntimeError, UnsupportedNodeError
from pytest_backendconf.suite import SuiteContext
from pytest_backendconf.debuginfo import DebugHandleRecorder, walk_nodes
from pytest_backendconf.debuginfo import build_debug_infos, format_missing, op_name
from pytest_backendconf.lowering import export_method, run_preprocess
from pytest_backendconf.backend import FAULT_KEY
from pytest_backendconf.checks import Check, CheckFailed, Unsupported, fail

from .._spec import section

HERE = " <--- HERE"


def checks(ctx: SuiteContext) -> Iterator[Check]:
    spec = section("symbolication")
    for entry in spec.get("rejections", ()):
        yield Check(
            "symbolication",
            f"unsupported_node_is_symbolicated[{entry['name']}]",
            functools.partial(check_rejection, entry=entry),
            stage="preprocess",
        )
    for entry in spec.get("faults", ()):
        case = ctx.cases.get(entry["case"])
        dtypes = ctx.dtypes_for(case) if case else []
        if case is None or not dtypes or entry["method"] not in case.methods:
            continue
        suffix = "" if entry["method"] == "forward" else f".{entry['method']}"
        yield Check(
            "symbolication",
            f"runtime_fault_is_symbolicated[{entry['case']}{suffix}:{entry['node']}]",
            functools.partial(check_fault, entry=entry, dtype=dtypes[0]),
            stage="execute",
            case=entry["case"],
        )
    for name in spec.get("debug_info_cases", ()):
        dtype = ctx.first_dtype(name)
        if dtype is not None:
            yield Check(
                "symbolication",
                f"debug_info_covers_every_node[{name}]",
                functools.partial(check_debug_info_coverage, case_name=name, dtype=dtype),
                stage="lowering",
                case=name,
            )
    from . import debug_apart

    yield from debug_apart.checks(ctx)


# --- expected texts, from the source ------------------------------------------------


def expected_frames(module: Any, frames: list, *, whole_line: bool = False) -> list[list[str]]:
    """Per frame, the accepted renderings (docs/backend-contract.md): carets under the expression, or also the whole line."""
    out = []
    for qualname, expression in frames:
        function = functools.reduce(getattr, qualname.split("."), module)
        file = inspect.getsourcefile(function)
        lines, start = inspect.getsourcelines(function)
        hits = [i for i, text in enumerate(lines) if expression in text]
        if len(hits) != 1:
            raise ValueError(
                f"suite.toml: expression {expression!r} occurs {len(hits)} times in {qualname} "
                f"({file}); it must name exactly one line"
            )
        source = lines[hits[0]].rstrip("\n")
        col = source.index(expression)
        head = f'  File "{file}", line {start + hits[0]}, in {function.__name__}'
        text = source.strip()
        indent = len(source) - len(source.lstrip())
        accepted = [f"{head}\n    {text}\n    {' ' * (col - indent)}{'~' * len(expression)}{HERE}"]
        if whole_line:
            accepted.append(f"{head}\n    {text}\n    {'~' * len(text)}{HERE}")
        out.append(accepted)
    return out


def _problems_with_text(text: str, entry: dict, frames: list[list[str]]) -> list[str]:
    """What is missing from a symbolicated text: the hierarchy line, the traceback block."""
    problems = []
    hierarchy = f"  Module hierarchy:{entry['hierarchy']}\n"
    if hierarchy not in text:
        problems.append(f"it has no line {hierarchy.rstrip()!r}")
    block = "Traceback of model source (most recent call last):\n"
    if block not in text:
        problems.append(f"it has no line {block.rstrip()!r}")
        return problems
    rest = text[text.index(block) + len(block) :]
    for i, accepted in enumerate(frames):
        found = [a for a in accepted if rest.startswith(a + "\n") or rest == a]
        if not found:
            problems.append(
                f"frame {i + 1} of {len(frames)} of the traceback should be\n{_indent(accepted[0])}\n"
                f"but the text there is\n{_indent(_lines(rest, 3))}"
            )
            break
        rest = rest[len(found[0]) + 1 :]
    return problems


# --- preprocess rejects an op it cannot know ----------------------------------------------


def _probe_dtype(ctx: SuiteContext) -> torch.dtype:
    declared = ctx.capabilities.dtypes
    if declared is None or torch.float32 in declared:
        return torch.float32
    floats = sorted((d for d in declared if d.is_floating_point), key=str)
    return floats[0] if floats else torch.float32


@functools.cache
def _probe_program(model: str, dtype: torch.dtype, shape: tuple) -> tuple[torch.nn.Module, Any, torch.Tensor]:
    """The probe model, its exported forward, and an input (one export per session)."""
    from .. import _probe_models

    module = getattr(_probe_models, model)().eval().to(dtype)
    x = torch.rand(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    return module, export_method(module, "forward", (x,), {}), x


def check_rejection(ctx: SuiteContext, *, entry: dict) -> None:
    from .. import _probe_models

    dtype = _probe_dtype(ctx)
    module, program, x = _probe_program(entry["model"], dtype, tuple(entry["input_shape"]))
    cls = type(module)
    targets = [n for n in walk_nodes(program.graph_module) if op_name(n) == _probe_models.OP_NAME]
    target = targets[0]
    where = f"{_probe_models.OP_NAME} in {cls.__name__} ({_probe_models.__file__})"
    handles = DebugHandleRecorder().assign(program.graph_module)
    infos = build_debug_infos(program.graph_module, handles, method="forward", top_class=cls.__name__)
    try:
        # The lowering's own preprocess step: it attaches the debug info to the error.
        blob = run_preprocess(ctx.backend, program, {}, handles, infos, "forward")
    except UnsupportedNodeError as exc:
        unrelated = _unrelated_rejection(ctx, exc, program, _probe_models.OP_NAME)
        if unrelated is not None:
            raise Unsupported(
                f"{cls.__name__}, the probe model, also uses {unrelated}, which backend {ctx.name!r} rejects "
                f"without the probe op too ({exc.reason or 'no reason given'}): its rejection text cannot be "
                "checked with this model"
            ) from exc
        problems, text = _problems_with_rejection(exc, target, program, entry, _probe_models)
        if problems:
            fail(
                f"preprocess() rejected {where} with UnsupportedNodeError, but:\n"
                + "\n".join(f"  - {p}" for p in problems)
                + f"\nthe text was:\n{_indent(_lines(text, 12))}"
            )
        return
    except Exception as exc:
        fail(
            f"preprocess() raised {type(exc).__name__} for {where}: {_lines(str(exc), 3)}\n"
            f"A node the backend cannot compile must be rejected with "
            f"UnsupportedNodeError(node, reason), so that the user sees their source line."
        )
    later = _what_happened_later(ctx, blob, module, x)
    fail(
        f"preprocess() accepted {where}, an op no backend can know, and returned {len(blob)} bytes; "
        f"{later}. Reject such a node at preprocess with UnsupportedNodeError(node, reason): a "
        f"failure at execute reaches the user on the device, without their source line."
    )


def _unrelated_rejection(ctx: SuiteContext, exc: UnsupportedNodeError, program: Any, probe: str) -> str | None:
    """The op of the rejected node when the backend rejects it for itself, not because of the probe op.

    A probe model puts the probe op next to ordinary ops (``x + 1``, ``sub``,
    ``torch.cond``). A backend that legitimately lacks one of those rejects it
    first; that is "unsupported", as everywhere else. To tell that from a
    backend blaming the wrong node, the same program with the probe op
    replaced by ``aten.clone`` is preprocessed again: a backend that lacks the
    op rejects the same node there too.
    """
    node = next((n for n in walk_nodes(program.graph_module) if n is exc.node), None)
    if node is None or op_name(node) == probe:
        return None
    twin = copy.deepcopy(program)
    for graph_module in {
        id(owner): owner for n in walk_nodes(twin.graph_module) if (owner := n.graph.owning_module) is not None
    }.values():
        for n in graph_module.graph.nodes:
            if n.op == "call_function" and op_name(n) == probe:
                n.target = torch.ops.aten.clone.default
        graph_module.recompile()
    handles = DebugHandleRecorder().assign(twin.graph_module)
    try:
        ctx.backend.preprocess(twin, {}, handles)
    except UnsupportedNodeError as again:
        if getattr(again.node, "name", None) == node.name:
            return op_name(node)
    except Exception:
        return None
    return None


def _problems_with_rejection(
    exc: UnsupportedNodeError, target: Any, program: Any, entry: dict, module: Any
) -> tuple[list[str], str]:
    """What is wrong with a rejection, and its text."""
    problems = []
    node = exc.node
    if node is not target:
        found = next((n for n in walk_nodes(program.graph_module) if n is node), None)
        kind = op_name(found) if found is not None else "not a node of this program"
        what = f"node {getattr(node, 'name', node)!r} ({kind})"
        problems.append(
            f"UnsupportedNodeError.node is {what}; expected node {target.name!r} "
            f"({op_name(target)}), the one the backend cannot compile"
        )
    try:
        text = str(exc)
    except Exception as error:  # e.g. .node is not a graph node at all
        problems.append(f"str() of the UnsupportedNodeError raised {type(error).__name__}: {error}")
        return problems, ""
    frames = expected_frames(module, entry["frames"], whole_line=entry.get("whole_line", False))
    head = f"The node of {op_name(target)} is not supported in this compiler. Source code:\n"
    if not text.startswith(head):
        problems.append(f"the text should begin {head.rstrip()!r}; it begins {_lines(text, 1)!r}")
    else:
        after = text[len(head) :]
        if not any(after.startswith(a + "\n") or after == a for a in frames[-1]):
            problems.append(
                f"the source code under the first line should be\n{_indent(frames[-1][0])}\n"
                f"but is\n{_indent(_lines(after, 3))}"
            )
    problems.extend(_problems_with_text(text, entry, frames))
    return problems, text


def _what_happened_later(ctx: SuiteContext, blob: bytes, module: torch.nn.Module, x: torch.Tensor) -> str:
    """What the backend did with the blob it should not have produced, for the failure message.

    A backend that runs any op through a fallback does know the probe op:
    then there is no rejection to check, and the check skips.
    """
    if ctx.backend.is_available() is not True:
        return "it was not compiled (the backend is not available here)"
    try:
        handle = ctx.backend.compile({"forward": blob}, {"forward": {}})["forward"]
    except Exception as exc:
        return f"compile() then raised {type(exc).__name__}: {_lines(str(exc), 1)}"
    try:
        outputs = ctx.backend.execute(handle, [x.clone()])
    except Exception as exc:
        return f"execute() then raised {type(exc).__name__}: {_lines(str(exc), 1)}"
    expected = module(x.clone())
    if isinstance(outputs, list) and len(outputs) == 1 and isinstance(outputs[0], torch.Tensor):
        if outputs[0].shape == expected.shape and torch.allclose(outputs[0], expected):
            pytest.skip(
                f"backend {ctx.name!r} ran the custom op correctly (a fallback for unknown ops?), "
                "so there is no rejection to check"
            )
    return "execute() then returned wrong outputs for it"


# --- runtime faults come back symbolicated --------------------------------------------------


def check_fault(ctx: SuiteContext, *, entry: dict, dtype: str) -> None:
    if not ctx.capabilities.fault_injection:
        pytest.skip(
            f"backend {ctx.name!r} does not declare fault_injection; runtime symbolication is "
            f"checked through the {FAULT_KEY!r} compile-spec key (docs/backend-contract.md#fault-injection)"
        )
    case, method, node = entry["case"], entry["method"], entry["node"]
    spec = {method: {FAULT_KEY: {"node": node}}}
    where = f"{case}.{method} [{dtype}] with compile spec {spec}"
    try:
        lowered = ctx.lower(case, dtype, spec)
    except UnsupportedNodeError as exc:
        raise Unsupported(_lines(str(exc), 1)) from exc
    infos = bc.debug_info(lowered)
    expected = [h for h, info in infos.items() if info.method == method and info.node == node]
    if len(expected) != 1:
        raise ValueError(f"suite.toml: {case}.{method} has {len(expected)} nodes named {node!r}; name one node")
    error = _first_fault(ctx, lowered, case, dtype, method, where)
    handle = error.debug_handle
    if handle != expected[0]:
        fail(_wrong_handle(handle, expected[0], infos, node, where))
    case_module = sys.modules[type(ctx.module(case, dtype)).__module__]
    frames = expected_frames(case_module, entry["frames"], whole_line=entry.get("whole_line", False))
    text = str(error)
    problems = []
    if not text.startswith(error.message + "\n"):
        problems.append(f"it should begin with the backend's message {error.message!r}")
    problems.extend(_problems_with_text(text, entry, frames))
    if problems:
        fail(
            f"the BackendRuntimeError for the fault injected at node {node!r} of {where} is not the "
            f"text of docs/backend-contract.md#debug-handles-and-texts:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + f"\nthe text was:\n{_indent(_lines(text, 14))}"
        )


def _first_fault(
    ctx: SuiteContext, lowered: Any, case: str, dtype: str, method: str, where: str
) -> BackendRuntimeError:
    run = getattr(lowered, method)
    seeds = int(section("symbolication").get("fault_seeds", 8))
    for seed in range(seeds):
        args, kwargs = ctx.example(case, dtype, method, seed=seed)
        try:
            run(*args, **kwargs)
        except BackendRuntimeError as exc:
            return exc
        except Exception as exc:
            fail(
                f"calling {where} raised {type(exc).__name__}: {_lines(str(exc), 2)}\n"
                "A backend that declares fault_injection must raise "
                "BackendError(message, debug_handle=debug_handles[node]) when execution reaches that node."
            )
    raise CheckFailed(
        f"{seeds} calls of {where} (example seeds 0..{seeds - 1}) all returned normally; a backend "
        "that declares fault_injection must raise BackendError(message, "
        "debug_handle=debug_handles[node]) when execution reaches the named node"
    )


def _wrong_handle(handle: Any, expected: int, infos: dict, node: str, where: str) -> str:
    what = f"execute() reported debug handle {handle!r} for the fault injected at node {node!r} of {where}"
    if handle is None:
        return f"{what}: BackendError carried no debug handle; pass debug_handle=debug_handles[node] ({expected})"
    user_sees = f"the user sees only: {format_missing([handle])!r}" if handle not in infos else ""
    if handle not in infos:
        numbered = f"{min(infos)}..{max(infos)}" if infos else "none"
        why = f"which is not a handle of this lowered module (its lowering numbered its nodes {numbered})"
    else:
        other = infos[handle]
        why = f"which is the handle of node {other.node!r} ({other.op}) of method {other.method!r}"
    return f"{what}, {why}; expected {expected}, the handle preprocess was given for that node" + (
        f" ({user_sees})" if user_sees else ""
    )


# --- debug info covers every node ---------------------------------------------------------


def check_debug_info_coverage(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    # A fresh lowering: its debug info must describe the programs as they are after it.
    try:
        lowered = ctx.lower(case_name, dtype, cache=False)
    except UnsupportedNodeError as exc:
        raise Unsupported(_lines(str(exc), 1)) from exc
    infos = bc.debug_info(lowered)
    # A lowering numbers its nodes 0, 1, 2, ... (methods one after another): nothing else.
    unnumbered = sorted(set(infos) - set(range(len(infos))))
    if unnumbered:
        fail(
            f"bc.debug_info() of {case_name} [{dtype}] has handles its lowering did not number (it numbers its "
            f"{len(infos)} nodes from 0): {unnumbered[:10]}"
        )
    for method in ctx.cases[case_name].methods:
        program = ctx.program(case_name, dtype, method)
        nodes = collections.Counter((n.name, op_name(n)) for n in walk_nodes(program.graph_module))
        described = collections.Counter((i.node, i.op) for i in infos.values() if i.method == method)
        missing, extra = nodes - described, described - nodes
        if missing or extra:
            fail(
                f"bc.debug_info() of {case_name}.{method} [{dtype}] does not match the program's "
                f"{sum(nodes.values())} nodes (nested subgraphs included):"
                + (f"\n  no debug info for {_nodes(missing)}" if missing else "")
                + (f"\n  debug info for nodes not in the program: {_nodes(extra)}" if extra else "")
                + "\nDid preprocess() change the program? It must treat it as read-only."
            )


# --- text helpers ---------------------------------------------------------------------


def _nodes(counter: collections.Counter) -> str:
    return ", ".join(f"{name!r} ({op})" for name, op in sorted(counter))


def _lines(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[:n])


def _indent(text: str) -> str:
    return "\n".join("    | " + line for line in text.splitlines())
