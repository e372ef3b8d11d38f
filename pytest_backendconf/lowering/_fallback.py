"""Run a partitioned method: delegated partitions through the backend, the rest on the CPU.

A partitioned method is a `Plan`: numbered values (the method's flat user
inputs first, then every value that crosses a partition boundary) and steps
run in order, each reading some values and writing others. A step is a
delegated partition (the backend's ``execute`` on its own blob) or a
fallback segment: the nodes the backend does not run, compiled by the
reference compiler into its bytecode and run by its interpreter, the analogue
of ExecuTorch's portable kernels. The archive stores the plan as JSON and
the segments as blobs, so it stays code-free.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import torch

from ..allowlist import dtype_named
from ..debuginfo import DebugHandles
from ..debuginfo import DebugInfo, clip
from ..archive import value_spec
from ._method_calls import tensor_differences
from ._partition import Delegation, Unit, cut, op_nodes
from ..archive import Plan, Step
from ..errors import (
    BackendContractError,
    OperatorNotRegisteredError,
    OperatorRefusedError,
    OutputSpecError,
    UnsupportedNodeError,
)

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from ..backend import Value
    from ..reference.interpreter import LoadedProgram
    from ._partition import CutProgram

    #: A step's call: the backend's execute on a partition's handle (of the backend's own type, hence
    #: Any, as in `Backend.execute`), or `_run_fallback` on a fallback segment.
    Execute = Callable[[Any, list[Value]], Sequence[Value]]

FAULT_KEY = "__backendconf_fault__"


# --- building a plan at lowering --------------------------------------------------------


@dataclasses.dataclass
class PartitionedMethod:
    """What lowering a method with ``partition=`` gives: the plan and its blobs."""

    plan: Plan
    delegated_blobs: dict[str, bytes]  # key -> the backend's blob
    fallback_blobs: dict[str, bytes]  # key -> a reference-interpreter blob
    compile_specs: dict[str, dict]  # key -> the compile spec its preprocess got


def lower_units(
    program: ExportedProgram,
    units: list[Unit],
    handles: DebugHandles,
    infos: dict[int, DebugInfo],
    method: str,
    spec: dict,
    preprocess: Callable[[ExportedProgram, dict, DebugHandles, str], bytes],
) -> PartitionedMethod:
    """Cut each unit out of ``program``, preprocess the delegated ones, compile the fallback."""
    from ._program_io import user_inputs
    from ..reference.compiler import compile_program  # host only, like any preprocess

    fault = spec.get(FAULT_KEY)
    fault_node = fault.get("node") if isinstance(fault, dict) else None
    base_spec = {k: v for k, v in spec.items() if k != FAULT_KEY}

    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    value_of: dict[torch.fx.Node, int] = {}
    for i, (name, _) in enumerate(user_inputs(program)):
        if name in placeholders:
            value_of[placeholders[name]] = i
    n_inputs = len(user_inputs(program))
    n_values = n_inputs
    steps: list[Step] = []
    delegated_blobs: dict[str, bytes] = {}
    fallback_blobs: dict[str, bytes] = {}
    compile_specs: dict[str, dict] = {}
    groups: list[tuple[str, ...]] = []
    for unit in units:
        index = len(groups) if unit.delegated else sum(1 for s in steps if not s.delegated)
        key = f"{method}.{'partition' if unit.delegated else 'fallback'}{index}"
        piece = cut(program, unit.nodes, handles, name=key)
        unit_spec = dict(base_spec)
        if fault_node is not None and any(n.name == fault_node for n in unit.nodes):
            unit_spec[FAULT_KEY] = copy.deepcopy(fault)
        if unit.delegated:
            delegated_blobs[key] = preprocess(piece.program, unit_spec, piece.handles, key)
            compile_specs[key] = unit_spec
            groups.append(tuple(n.name for n in unit.nodes if n.op == "call_function"))
        else:
            fault_spec = {FAULT_KEY: unit_spec[FAULT_KEY]} if FAULT_KEY in unit_spec else None
            fallback_blobs[key] = _compile_fallback(compile_program, piece, fault_spec, infos)
        reads = []
        for source in piece.inputs:
            if source not in value_of:
                raise BackendContractError(f"internal: {key} reads {source.name!r} before it is computed")
            reads.append(value_of[source])
        writes = []
        for out in piece.outputs:
            value_of[out] = n_values
            writes.append(n_values)
            n_values += 1
        specs = tuple(value_spec(o.name, o.meta["val"]) for o in piece.outputs)
        steps.append(Step(unit.delegated, key, tuple(reads), tuple(writes), specs))

    outputs = _method_outputs(program, value_of, method)
    delegated_names = {n for g in groups for n in g}
    record = Delegation(
        partitions=len(groups),
        delegated=tuple(n.name for n in op_nodes(program) if n.name in delegated_names),
        fallback=tuple(n.name for n in op_nodes(program) if n.name not in delegated_names),
        partition_nodes=tuple(groups),
    )
    plan = Plan(n_inputs, n_values, tuple(steps), tuple(outputs), record)
    plan.check()
    return PartitionedMethod(plan, delegated_blobs, fallback_blobs, compile_specs)


def _compile_fallback(
    compile_program: Callable[..., bytes], piece: CutProgram, spec: dict | None, infos: dict[int, DebugInfo]
) -> bytes:
    try:
        return compile_program(piece.program, spec, piece.handles, fallback=True)
    except UnsupportedNodeError as exc:
        # The user's source line, as for a delegated node the backend rejects.
        for rejection in exc.rejections:
            node = rejection.node
            handle = piece.handles.get(node) if isinstance(node, torch.fx.Node) else None
            if handle is not None and handle in infos:
                rejection.debug_info = infos[handle]
            rejection.reason = f"the CPU fallback cannot run it either: {rejection.reason}"
        raise


def _method_outputs(
    program: ExportedProgram, value_of: dict[torch.fx.Node, int], method: str
) -> list[int | dict[str, object]]:
    from torch.export.graph_signature import OutputKind

    output_node = program.graph.output_node()
    values = output_node.args[0]
    values = values if isinstance(values, (list, tuple)) else (values,)
    out: list[int | dict[str, object]] = []
    for spec, value in zip(program.graph_signature.output_specs, values):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        if isinstance(value, torch.fx.Node):
            if value not in value_of:
                from ..errors import LoweringError

                raise LoweringError(
                    f"method {method!r} returns {value.name!r} (a parameter, buffer or constant) "
                    "directly; partial delegation cannot return it. Return a computed value "
                    "(e.g. `w.clone()`), or lower the whole method (partition=None)"
                )
            out.append(value_of[value])
        else:
            out.append({"constant": value})
    return out


# --- running a plan ---------------------------------------------------------------------


def load_fallback(blob: bytes, key: str, debug: dict[int, DebugInfo]) -> LoadedProgram:
    """Decode a fallback segment; an operator missing here names itself and the user's line."""
    from ..reference.interpreter import UnregisteredOperatorError, load

    try:
        return load(blob, dispatch=True, where=f"fallback segment {key!r} (archive entry 'fallback/{key}.bin')")
    except OperatorRefusedError:
        raise  # it names the segment, the node and the operator already
    except UnregisteredOperatorError as exc:
        info = debug.get(exc.debug_handle)
        where = info.frames[-1].render() if info is not None and info.frames else "  (no source recorded)"
        detail = f"\n{info}" if info is not None else ""
        raise OperatorNotRegisteredError(
            f"operator {info.op if info else exc.operator} ({exc.operator}) is not registered in this "
            f"process; the CPU fallback of {key.split('.')[0]!r} calls it through torch's dispatcher. "
            f"Source code:\n{where}{detail}\nImport the module that registers it (its torch.library "
            f"definition) before loading. (node {clip(exc.node)!r}, debug handle {exc.debug_handle})"
        ) from None
    except ValueError as exc:
        raise ValueError(f"fallback segment {key!r}: {exc}") from exc


class PlanRunner:
    """A plan bound to compiled handles: the per-call loop, with boundary checks."""

    __slots__ = ("bound", "n_values", "n_inputs", "outputs", "constants", "method", "backend_name")

    def __init__(
        self,
        plan: Plan,
        execute: Execute,
        handles: dict[str, object],
        fallbacks: dict[str, LoadedProgram],
        method: str,
        backend_name: str,
    ):
        self.method = method
        self.backend_name = backend_name
        self.n_inputs = plan.n_inputs
        self.n_values = plan.n_values
        bound: list[tuple[Execute, object, tuple[int, ...], tuple[int, ...], tuple | None, Step]] = []
        for step in plan.steps:
            if step.delegated:
                checks = tuple(
                    (dtype_named(s.dtype, where=f"partition {step.key!r}"), _expected(s.shape))
                    if s.kind == "tensor"
                    else (None, s.value)
                    for s in step.output_specs
                )
                bound.append((execute, handles[step.key], step.inputs, step.outputs, checks, step))
            else:
                bound.append((_run_fallback, fallbacks[step.key], step.inputs, step.outputs, None, step))
        self.bound = tuple(bound)
        self.outputs = tuple(o for o in plan.outputs)
        self.constants = tuple((i, o["constant"]) for i, o in enumerate(plan.outputs) if isinstance(o, dict))

    def run(self, inputs: list[Value]) -> list[Value]:
        values: list[Value] = [*inputs, *([None] * (self.n_values - self.n_inputs))]
        for call, handle, reads, writes, checks, step in self.bound:
            outs = call(handle, [values[i] for i in reads])
            if checks is not None:
                self._check(outs, checks, step)
            for i, value in zip(writes, outs):
                values[i] = value
        if self.constants:
            return [cast("Value", o["constant"]) if isinstance(o, dict) else values[o] for o in self.outputs]
        return [values[i] for i in cast("tuple[int, ...]", self.outputs)]  # no constant output: all indices

    def _check(self, outs: object, checks: tuple, step: Step) -> None:
        if not isinstance(outs, (list, tuple)) or len(outs) != len(checks):
            got = f"{len(outs)} outputs" if isinstance(outs, (list, tuple)) else type(outs).__name__
            raise OutputSpecError(
                f"method {self.method!r}, partition {step.key!r}: execute() of backend "
                f"{self.backend_name!r} must return a list of {len(checks)} outputs (the values "
                f"the rest of the method reads from it), got {got}",
                differs=("count",),
            )
        for i, (value, (dtype, expected)) in enumerate(zip(outs, checks)):
            if dtype is None:
                continue
            if (
                not isinstance(value, torch.Tensor)
                or value.dtype is not dtype
                or not _same_shape(value.shape, expected)
            ):
                spec = step.output_specs[i]
                got = (
                    f"a {str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}] tensor"
                    if isinstance(value, torch.Tensor)
                    else f"{type(value).__name__}"
                )
                raise OutputSpecError(
                    f"method {self.method!r}, partition {step.key!r} output {i} ({spec.name!r}): expected "
                    f"{spec.describe()}, got {got} from backend {self.backend_name!r}",
                    node=spec.name,
                    differs=tensor_differences(value, dtype, expected),
                )


def _expected(shape: tuple[int | None, ...] | None) -> torch.Size | tuple[int | None, ...]:
    """A `torch.Size` for a static shape; the tuple, ``None`` for each symbolic dimension, else."""
    assert shape is not None  # a tensor's spec has a shape (ValueSpec)
    static = [d for d in shape if d is not None]
    return torch.Size(static) if len(static) == len(shape) else tuple(shape)


def _same_shape(actual: Sequence[object], expected: Sequence[int | None]) -> bool:
    if actual == expected:
        return True
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def _run_fallback(program: LoadedProgram, inputs: list[Value]) -> list[Value]:
    return program.run(inputs)
