"""``preprocess`` (host only): an ``ExportedProgram`` lowered to an ExecuTorch ``.pte``.

The program goes through ExecuTorch's own flow,
``to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()``
(no partitioner: portable kernels only). Then, so that nothing fails later
on the target with a bare error code:

- every instruction of the emitted method is traced back to the FX nodes of
  the *given* program (ExecuTorch's debug handle map gives, per instruction,
  its own debug handles; each of those nodes carries ``from_node``
  provenance back to ours), and the blob keeps, per instruction, our debug
  handles;
- every operator the method calls is looked up among the runtime's
  registered kernels, and the method is loaded once: an operator the runtime
  cannot run (``aten::sort.values`` has no portable kernel) becomes
  ``UnsupportedNodeError`` at the user's node instead of "error 0x14" at
  ``load_method``.

A lowering error gets the verdict of its kind (docs/backend-contract.md,
"Compile errors"). ExecuTorch does not claim what its edge dialect's
verifier refuses (``SpecViolationError``: an op outside the Core ATen
opset, mismatched dtypes) nor an op without an out variant: those are
``UnsupportedNodeError``. Any other exception of its lowering (a pass or
XNNPACK's preprocess raising) is its compiler breaking on a node it took:
``CompilerError`` at the node the error names. An error that names no node
is located by building each node alone (``failing_nodes``) when the program
has at most `PROBE_AT_MOST` ops (an operator check's program; each probe is
a lowering of a second or more); otherwise, or when no node fails alone, it
stays undecided.

This module imports ``executorch.exir`` and the XNNPACK partitioner; it is
declared host-only, and the runtime side never imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from pytest_backendconf import CompilerError, UnsupportedNodeError, check_compile_spec_keys, failing_nodes
from pytest_backendconf.backend import fault_node_name

from pytest_backendconf.provenance import ProgramNodes, graph_modules

from . import blob as blob_format
from . import runtime
from ._compat import cia_ops_memo

#: Compile-spec key asking for an injected fault (docs/writing-a-backend.md, "Capabilities").
FAULT_KEY = "__backendconf_fault__"
PARTITIONERS_KEY = "partitioners"
KNOWN_KEYS = (PARTITIONERS_KEY, FAULT_KEY)
#: Partitioners the compile spec may name; [] means ExecuTorch's portable kernels only.
KNOWN_PARTITIONERS = ("xnnpack",)
DEFAULT_PARTITIONERS = ("xnnpack",)

#: Programs with at most this many ops are probed node by node when a lowering error names no node.
PROBE_AT_MOST = 8
#: ExecuTorch's words for what it does not claim (`_not_claimed`).
_MISSING_OUT_VARIANT = "Missing out variants"

_KERNEL_NOT_FOUND = re.compile(r"kernel '([^']+)' not found")
_MISSING_OPERATOR = re.compile(r"Missing operator: \[(\d+)\] (\S+)")


def parse_spec(compile_spec: Mapping[str, Any] | None) -> tuple[tuple[str, ...], str | None]:
    """Validate the compile spec; return ``(partitioners, fault node name or None)``."""
    compile_spec = check_compile_spec_keys(compile_spec, KNOWN_KEYS, "executorch")
    partitioners = compile_spec.get(PARTITIONERS_KEY, list(DEFAULT_PARTITIONERS))
    if not isinstance(partitioners, (list, tuple)) or any(p not in KNOWN_PARTITIONERS for p in partitioners):
        raise ValueError(
            f"compile-spec key {PARTITIONERS_KEY!r} must be a list of {list(KNOWN_PARTITIONERS)} "
            f"(or [] for ExecuTorch's portable kernels only), got {partitioners!r}"
        )
    return tuple(partitioners), fault_node_name(compile_spec)


def lower_program(
    program: Any, compile_spec: Mapping[str, Any] | None, debug_handles: Mapping[Any, int], backend: object
) -> bytes:
    """The blob of one method: the ``.pte`` and the header (see ``blob``); ``backend`` probes nodes alone."""
    partitioners, fault_name = parse_spec(compile_spec)
    originals = ProgramNodes(program)
    fault = _fault(originals, fault_name, debug_handles) if fault_name else None
    executorch_program, origin_of_handle = _lower(program, partitioners, originals, backend, compile_spec)
    method = "forward"
    plan = next(p for p in executorch_program.executorch_program.execution_plan if p.name == method)
    handle_map = executorch_program.debug_handle_map.get(method, {})
    instructions = []
    covered: list[list[torch.fx.Node]] = []  # per instruction, the given program's nodes
    for index, instruction in enumerate(plan.chains[0].instructions):
        args = instruction.instr_args
        if hasattr(args, "op_index"):
            operator = plan.operators[args.op_index]
            what = f"kernel {_operator_name(operator)}"
        elif hasattr(args, "delegate_index"):
            what = f"delegate {plan.delegates[args.delegate_index].id}"
        else:
            what = type(args).__name__
        ours = _nodes_of(handle_map.get(index), origin_of_handle)
        covered.append(ours)
        instructions.append(
            blob_format.Instruction(
                what,
                tuple(dict.fromkeys(debug_handles[n] for n in ours if n in debug_handles)),
                tuple(dict.fromkeys(n.name for n in ours)),
            )
        )
    header = blob_format.Header(
        method=method,
        fed=_fed(program, len(plan.inputs)),
        outputs=_outputs(program),
        instructions=tuple(instructions),
        partitioners=partitioners,
        fault=fault,
    )
    pte = executorch_program.buffer
    _check_runtime_can_load(pte, plan, instructions, covered, originals)
    return blob_format.encode(header, pte)


# --- the given program's nodes ------------------------------------------------------


def _naming(originals: ProgramNodes, text: str) -> torch.fx.Node | None:
    """The op node whose operator ``text`` names (``aten::sort``, ``aten.sort.default``)."""
    for node in originals.call_nodes():
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            continue
        base = schema.name  # "aten::sort"
        dotted = base.replace("::", ".")
        if re.search(rf"(?<![\w.:]){re.escape(base)}(?![\w])|(?<![\w.]){re.escape(dotted)}(?![\w])", text):
            return node
    return None


def _fault(originals: ProgramNodes, name: str, debug_handles: Mapping[Any, int]) -> blob_format.Fault:
    calls = originals.call_nodes()
    for node in calls:
        if node.name == name and node in debug_handles:
            return blob_format.Fault(name, _op_name(node), debug_handles[node])
    examples = ", ".join(repr(n.name) for n in calls[:10])
    more = f" and {len(calls) - 10} more" if len(calls) > 10 else ""
    raise ValueError(
        f"fault injection names node {name!r}, which is not an op node of this program; its op nodes are {examples}{more}"
    )


def _op_name(node: torch.fx.Node) -> str:
    schema = getattr(node.target, "_schema", None)
    return schema.name if schema is not None else getattr(node.target, "__name__", str(node.target))


# --- lowering -------------------------------------------------------------------------


def _lower(
    program: Any,
    partitioners: tuple[str, ...],
    originals: ProgramNodes,
    backend: object,
    compile_spec: Mapping[str, Any] | None,
) -> tuple[Any, dict[int, list[torch.fx.Node]]]:
    """``(ExecutorchProgramManager, ExecuTorch debug handle -> our nodes)``.

    The provenance is read from the edge program before ``to_executorch``,
    whose passes renumber the nodes' debug handles in place; the debug
    handle map refers to the edge program's numbers.
    """
    from executorch.exir import to_edge_transform_and_lower

    partitioner = []
    if "xnnpack" in partitioners:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner.append(XnnpackPartitioner())
    try:
        with cia_ops_memo():
            edge = to_edge_transform_and_lower(program, partitioner=partitioner or None)
            origin_of_handle = _origins(edge.exported_program(), originals)
            return edge.to_executorch(), origin_of_handle
    except (UnsupportedNodeError, CompilerError):
        raise
    except Exception as exc:  # ExecuTorch's lowering raises plain exceptions
        raise _verdict(exc, program, originals, backend, compile_spec) from exc


def _verdict(
    exc: Exception, program: Any, originals: ProgramNodes, backend: object, compile_spec: Mapping[str, Any] | None
) -> Exception:
    """The error ``preprocess`` raises for a lowering exception: unsupported, a compiler failure, or undecided."""
    said = f"{type(exc).__name__}: {_first_line(exc)}{_caused_by(exc)}"
    node = _naming(originals, str(exc)) or _naming(originals, str(_innermost(exc)))
    if node is not None:
        if _not_claimed(exc):
            return UnsupportedNodeError(node, f"ExecuTorch does not take {_op_name(node)}: {said}")
        return CompilerError(node, f"ExecuTorch's lowering failed on {_op_name(node)}: {said}")
    undecided = RuntimeError(f"ExecuTorch could not lower the program: {said}")
    if len(originals.call_nodes()) <= PROBE_AT_MOST:
        bad = failing_nodes(program, backend, compile_spec)
        verdict = bad.verdict(claims=lambda n: not _not_claimed(bad.failures[n].exception))
        if verdict is not None:
            return verdict
    return undecided


def _not_claimed(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) is ExecuTorch refusing an op rather than breaking on it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UnsupportedNodeError) or type(current).__name__ == "SpecViolationError":
            return True
        if str(current).startswith(_MISSING_OUT_VARIANT):
            return True
        current = current.__cause__ or current.__context__
    return False


def _innermost(exc: BaseException) -> BaseException:
    """The exception at the end of ``exc``'s chain of causes (``exc`` itself when it has none)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _origins(edge_program: Any, originals: ProgramNodes) -> dict[int, list[torch.fx.Node]]:
    """ExecuTorch debug handle -> the nodes of the given program it comes from.

    Delegated nodes live in each lowered module's ``original_module``; the
    debug handle map lists their handles for the delegate's instruction.
    """
    found: dict[int, list[torch.fx.Node]] = {}

    def visit(graph_module: Any) -> None:
        for _, module in graph_modules(graph_module):
            for node in module.graph.nodes:
                handle = node.meta.get("debug_handle")
                origin = originals.origin(node, by_name=True) if node.op == "call_function" else None
                if isinstance(handle, int) and origin is not None and origin.op == "call_function":
                    nodes = found.setdefault(handle, [])
                    if origin not in nodes:
                        nodes.append(origin)
                if node.op == "get_attr":
                    lowered = getattr(module, str(node.target), None)
                    inner = getattr(lowered, "original_module", None)
                    if inner is not None:
                        visit(inner.graph_module)

    visit(edge_program.graph_module)
    return found


def _nodes_of(entry: Any, origin_of_handle: Mapping[int, list[torch.fx.Node]]) -> list[torch.fx.Node]:
    handles = entry if isinstance(entry, (list, tuple)) else [] if entry is None else [entry]
    nodes: list[torch.fx.Node] = []
    for handle in handles:
        for node in origin_of_handle.get(handle, ()):
            if node not in nodes:
                nodes.append(node)
    return nodes


def _operator_name(operator: Any) -> str:
    return f"{operator.name}.{operator.overload}" if operator.overload else operator.name


def _fed(program: Any, plan_inputs: int) -> tuple[bool, ...]:
    from pytest_backendconf.lowering import user_inputs

    inputs = user_inputs(program)
    tensors = tuple(isinstance(value, torch.Tensor) for _, value in inputs)
    if sum(tensors) == plan_inputs:
        return tensors
    if len(inputs) == plan_inputs:
        return tuple(True for _ in inputs)
    raise RuntimeError(
        f"ExecuTorch's method takes {plan_inputs} inputs; the program has {len(inputs)} user inputs "
        f"({sum(tensors)} tensors)"
    )


def _outputs(program: Any) -> tuple[tuple[str, Any], ...]:
    from pytest_backendconf.lowering import user_outputs

    outputs: list[tuple[str, Any]] = []
    for name, value in user_outputs(program):
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            if dtype not in blob_format.DTYPES:
                raise RuntimeError(f"output {name!r} has dtype {dtype}, which the executorch backend does not return")
            outputs.append(("tensor", dtype))
        elif value is None or isinstance(value, (bool, int, float, str)):
            outputs.append(("constant", value))
        else:
            raise RuntimeError(
                f"output {name!r} is a {type(value).__name__}; the executorch backend returns tensors and constants"
            )
    return tuple(outputs)


# --- can the runtime load it? ---------------------------------------------------------------


def _check_runtime_can_load(
    pte: bytes,
    plan: Any,
    instructions: list[blob_format.Instruction],
    covered: list[list[torch.fx.Node]],
    originals: ProgramNodes,
) -> None:
    """Raise `UnsupportedNodeError` for an operator the runtime here cannot load.

    The registry lookup is by operator name; a kernel registered for other
    dtypes only is found by loading the method, whose log names the kernel.
    """
    registered = runtime.registered_operators()
    names = [_operator_name(op) for op in plan.operators]
    for name in names:
        if name not in registered:
            _raise_missing_kernel(
                name, f"ExecuTorch's runtime has no kernel '{name}'", instructions, covered, originals
            )
    problem, log = runtime.try_load(pte, "forward")
    if problem is None:
        return
    kernel = _KERNEL_NOT_FOUND.search(log) or _MISSING_OPERATOR.search(log)
    if kernel is not None:
        name = kernel.group(1) if kernel.re is _KERNEL_NOT_FOUND else kernel.group(2)
        detail = " ".join(line.split("]", 1)[-1].strip() for line in log.splitlines() if "dtype:" in line)
        _raise_missing_kernel(
            name,
            f"ExecuTorch's runtime has no kernel '{name}' for these dtypes ({detail or 'see the runtime log'})",
            instructions,
            covered,
            originals,
        )
    raise RuntimeError(
        f"ExecuTorch's runtime cannot load the lowered method: {problem}; runtime log: {log.strip()[-500:]}"
    )


def _raise_missing_kernel(
    name: str,
    reason: str,
    instructions: list[blob_format.Instruction],
    covered: list[list[torch.fx.Node]],
    originals: ProgramNodes,
) -> None:
    for instruction, nodes in zip(instructions, covered):
        if instruction.what == f"kernel {name}" and nodes:
            node = nodes[0]
            raise UnsupportedNodeError(node, f"{reason} (error 0x14, OperatorMissing, at load_method)")
    node = _naming(originals, name)
    if node is not None:
        raise UnsupportedNodeError(node, f"{reason} (error 0x14, OperatorMissing, at load_method)")
    raise RuntimeError(f"{reason}; no node of the program maps to it")


def _caused_by(exc: BaseException) -> str:
    """The innermost cause's first line: ExecuTorch's pass manager wraps a pass's error in one that names only the pass."""
    cause = _innermost(exc)
    return "" if cause is exc else f" (caused by {type(cause).__name__}: {_first_line(cause)})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
