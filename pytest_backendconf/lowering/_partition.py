"""Partial delegation: which nodes a backend takes, grouped into partitions.

``to_backend(..., partition=...)`` (docs/writing-a-backend.md, "Partial
delegation") splits a method's exported program into *units* run one after
another: delegated partitions, each its own program for ``preprocess``, and
fallback segments holding every other node, run on the host CPU by the
reference interpreter. This module decides the split: it selects nodes,
groups them with torch's own partitioner (no cycle between the parts), orders
the units, and cuts each unit out of the method's program as an
``ExportedProgram`` of its own.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import operator
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind

from .. import _compat
from ..debuginfo import DebugHandles, walk_nodes
from ..debuginfo import op_name
from ..archive import Delegation, format_delegation  # noqa: F401  (re-exported)
from ..errors import BackendContractError, LoweringError, UnsupportedNodeError
from ._state import STATE_META, piece_state

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.export.graph_signature import InputSpec, OutputSpec, TensorArgument

    from ..backend import Backend

_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


# --- choosing nodes -------------------------------------------------------------------


def op_nodes(program: ExportedProgram) -> list[torch.fx.Node]:
    """The op nodes of a method's top-level graph: what is delegated or falls back."""
    return [n for n in program.graph.nodes if n.op == "call_function"]


def select_nodes(
    program: ExportedProgram, partition: object, backend: Backend, spec: dict, handles: DebugHandles, method: str
) -> set[torch.fx.Node]:
    """The op nodes ``partition=`` asks to delegate."""
    nodes = op_nodes(program)
    if partition == "supported":
        return accepted_nodes(program, backend, spec, handles, method)
    if isinstance(partition, str):
        raise LoweringError(
            f"partition={partition!r} is not understood: give None (the whole method), "
            "'supported', a list of submodule names such as ['encoder'], or a function node -> bool"
        )
    if callable(partition):
        chosen = set()
        for node in nodes:
            verdict = partition(node)
            if not isinstance(verdict, bool):
                raise LoweringError(
                    f"the partition function returned {verdict!r} for node {node.name!r}; it must return a bool"
                )
            if verdict:
                chosen.add(node)
        return chosen
    if isinstance(partition, (list, tuple)) and all(isinstance(p, str) for p in partition) and partition:
        return _under_submodules(program, nodes, list(partition), method)
    raise LoweringError(
        f"partition= must be None, 'supported', a non-empty list of submodule names, or a function "
        f"node -> bool; got {partition!r}"
    )


def _under_submodules(
    program: ExportedProgram, nodes: list[torch.fx.Node], names: list[str], method: str
) -> set[torch.fx.Node]:
    paths = {path for n in nodes for path, _ in (n.meta.get("nn_module_stack") or {}).values() if path}
    unknown = [name for name in names if name not in paths]
    if unknown:
        raise LoweringError(
            f"partition= names submodule(s) {unknown} that method {method!r} does not call; "
            f"the submodules it calls: {', '.join(sorted(paths)) or 'none'}"
        )

    def under(node: torch.fx.Node) -> bool:
        stack = node.meta.get("nn_module_stack") or {}
        return any(path == name or path.startswith(name + ".") for path, _ in stack.values() for name in names)

    return {n for n in nodes if under(n)}


def accepted_nodes(
    program: ExportedProgram, backend: Backend, spec: dict, handles: DebugHandles, method: str
) -> set[torch.fx.Node]:
    """The op nodes the backend accepts: ``supported_nodes``, else ``supported_ops``, else asked op by op."""
    nodes = op_nodes(program)
    supported_nodes = getattr(backend, "supported_nodes", None)
    if callable(supported_nodes):
        names = supported_nodes(program, copy.deepcopy(spec))
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise BackendContractError(
                f"supported_nodes() of backend {backend.name!r} must return an iterable of FX node "
                f"names, got {type(names).__name__}"
            )
        names = set(names)
        by_name = {n.name: n for n in program.graph.nodes}
        unknown = sorted(str(n) for n in names if n not in by_name)
        if unknown:
            raise BackendContractError(
                f"supported_nodes() of backend {backend.name!r} names {unknown[:5]}, which are not "
                f"nodes of method {method!r}; return FX node names of the program it is given"
            )
        return {n for n in nodes if n.name in names}
    capabilities = getattr(backend, "capabilities", None)
    ops = getattr(capabilities, "supported_ops", None)
    # An item of a multi-output op (split's pieces) goes where the op goes:
    # the list itself never crosses a partition boundary.
    producers = [n for n in nodes if not _is_item(n)]
    if ops is not None:
        dtypes = getattr(capabilities, "dtypes", None)
        accepted = {n for n in producers if op_overload(n) in ops and _dtypes_within(n, dtypes)}
    else:
        # A node nobody reads (an assertion) is not asked about: it would be a one-node program without
        # outputs, and it stays on the fallback anyway (plan_units).
        accepted = {n for n in producers if n.users and probe(program, n, backend, spec, handles)}
    return accepted | {n for n in nodes if _is_item(n) and n.args[0] in accepted}


def _is_item(node: torch.fx.Node) -> bool:
    return node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node)


def op_overload(node: torch.fx.Node) -> str:
    """The name ``supported_ops`` uses: "aten.mul.Tensor", "_operator.getitem", "higher_order.cond"."""
    target = node.target
    if _compat.is_op_overload(target):
        return str(target)
    if _compat.is_higher_order_op(target):
        return f"higher_order.{target.name()}"
    return f"{getattr(target, '__module__', None) or '<unknown>'}.{getattr(target, '__name__', repr(target))}"


def _dtypes_within(node: torch.fx.Node, dtypes: Iterable[torch.dtype] | None) -> bool:
    if dtypes is None:
        return True
    values = _compat.tree_leaves(node.meta.get("val"))
    return all(v.dtype in dtypes for v in values if isinstance(v, torch.Tensor))


# (backend name, op signature, compile spec) -> accepted. Per process, so per
# test session: each distinct op is asked once however many models use it.
_PROBES: dict[tuple, bool] = {}
_PROBES_LOCK = threading.Lock()


def probe(program: ExportedProgram, node: torch.fx.Node, backend: Backend, spec: dict, handles: DebugHandles) -> bool:
    """Whether ``preprocess`` accepts a one-node program of this node's op and signature."""
    key = (backend.name, op_signature(node), json.dumps(spec, sort_keys=True))
    with _PROBES_LOCK:
        if key in _PROBES:
            return _PROBES[key]
    try:
        unit = cut(program, [node, *(u for u in node.users if _is_item(u))], handles, name="probe")
    except LoweringError:
        unit = None  # a value that cannot leave a partition: only whole-method lowering can take it
    try:
        accepted = unit is not None and _accepts(backend, unit, spec)
    except UnsupportedNodeError:
        accepted = False
    with _PROBES_LOCK:
        _PROBES[key] = accepted
    return accepted


def _accepts(backend: Backend, unit: "CutProgram", spec: dict) -> bool:
    backend.preprocess(unit.program, copy.deepcopy(spec), unit.handles)
    return True


def op_signature(node: torch.fx.Node) -> tuple:
    """The op and what its kernel sees of its arguments: tensor dtypes and shapes, other values."""

    def describe(value: object) -> object:
        if isinstance(value, torch.fx.Node):
            val = value.meta.get("val")
            if isinstance(val, torch.Tensor):
                return ("tensor", str(val.dtype), tuple(str(d) for d in val.shape))
            return ("value", value.op, repr(val))
        if isinstance(value, (list, tuple)):
            return tuple(describe(v) for v in value)
        return repr(value)

    return (op_overload(node), describe(node.args), tuple(sorted((k, describe(v)) for k, v in node.kwargs.items())))


# --- grouping and ordering ------------------------------------------------------------


@dataclasses.dataclass
class Unit:
    """One step of a partitioned method: a delegated partition or a fallback segment."""

    delegated: bool
    nodes: list[torch.fx.Node]


def plan_units(program: ExportedProgram, selected: set[torch.fx.Node]) -> list[Unit]:
    """Group ``selected`` into partitions (torch's partitioner) and order every unit to run.

    Consecutive fallback nodes become one segment, so a method alternates
    between delegated partitions and fallback segments.
    """
    partitions = _compat.propose_partitions(program.graph_module, lambda node: node in selected)
    # A partition whose nodes nobody reads (a lone `_assert_tensor_metadata`) would give the backend
    # a program without outputs: nothing to compute, and some engines cannot load an empty model.
    # Its nodes run on the fallback.
    partitions = [nodes for nodes in partitions if any(n.users for n in nodes)]
    position = {n: i for i, n in enumerate(program.graph.nodes)}
    owner: dict[torch.fx.Node, int] = {}
    groups: list[list[torch.fx.Node]] = []
    for nodes in partitions:
        nodes = sorted(nodes, key=position.__getitem__)
        for n in nodes:
            owner[n] = len(groups)
        groups.append(nodes)
    # Each fallback op node is a unit of its own until the order is known.
    for n in op_nodes(program):
        if n not in owner:
            owner[n] = len(groups)
            groups.append([n])
    delegated = len(partitions)
    order = _topological(groups, owner, position)
    units: list[Unit] = []
    for g in order:
        if g < delegated:
            units.append(Unit(True, groups[g]))
        elif units and not units[-1].delegated:
            units[-1].nodes.extend(groups[g])
        else:
            units.append(Unit(False, list(groups[g])))
    return units


def _topological(
    groups: list[list[torch.fx.Node]], owner: dict[torch.fx.Node, int], position: dict[torch.fx.Node, int]
) -> list[int]:
    """Groups in an order where each runs after the groups it reads from (earliest node first)."""
    import heapq

    needs: list[set[int]] = [set() for _ in groups]
    users: list[set[int]] = [set() for _ in groups]
    for g, nodes in enumerate(groups):
        for n in nodes:
            for source in n.all_input_nodes:
                s = owner.get(source)
                if s is not None and s != g:
                    needs[g].add(s)
                    users[s].add(g)
    ready = [(position[nodes[0]], g) for g, nodes in enumerate(groups) if not needs[g]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(g)
        for u in users[g]:
            needs[u].discard(g)
            if not needs[u]:
                heapq.heappush(ready, (position[groups[u][0]], u))
    if len(order) != len(groups):
        # torch's partitioner never proposes such a grouping; fail loudly if it ever does.
        raise LoweringError("the partitions form a cycle with the fallback; please report this as a bug")
    return order


# --- cutting a unit out of the method's program ----------------------------------------


@dataclasses.dataclass
class CutProgram:
    """A unit as an ``ExportedProgram`` of its own, with its boundary in the method's terms."""

    program: ExportedProgram
    handles: DebugHandles
    #: Method-graph nodes whose values the unit reads as user inputs, in input order.
    inputs: list[torch.fx.Node]
    #: Method-graph nodes whose values the unit returns, in output order.
    outputs: list[torch.fx.Node]


def cut(program: ExportedProgram, nodes: list[torch.fx.Node], handles: DebugHandles, *, name: str) -> CutProgram:
    """The program that computes ``nodes`` from the values they read.

    Parameters, buffers and constants the nodes use come along (each unit's
    blob holds its own); every other value read from outside is a user input,
    and every value used outside (or returned by the method) an output. The
    copied nodes keep their names, metadata and debug handles, so a backend
    sees the user's source lines and fault injection can name them.
    """
    inside = set(nodes)
    position = {n: i for i, n in enumerate(program.graph.nodes)}
    signature = program.graph_signature
    spec_by_name = {spec.arg.name: spec for spec in signature.input_specs if hasattr(spec.arg, "name")}

    reads: list[torch.fx.Node] = []
    attrs: list[torch.fx.Node] = []
    for n in nodes:
        for source in n.all_input_nodes:
            if source in inside:
                continue
            bucket = attrs if source.op == "get_attr" else reads
            if source not in bucket:
                bucket.append(source)
    reads.sort(key=position.__getitem__)
    constant_reads = [r for r in reads if _input_kind(spec_by_name, r) in _CONSTANT_KINDS]
    user_reads = [r for r in reads if r not in constant_reads]

    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    by_copy: dict[torch.fx.Node, int] = {}
    input_specs: list[InputSpec] = []
    state_dict: dict[str, torch.Tensor | torch.nn.Parameter] = {}
    constants: dict = {}
    for source in constant_reads + user_reads:
        placeholder = graph.placeholder(source.name)
        placeholder.meta = copy.copy(source.meta)
        env[source] = placeholder
        by_copy[placeholder] = handles[source]
        if source in constant_reads:
            original = spec_by_name[source.name]  # a constant read has a spec: _input_kind found it
            target = original.target
            if target in program.state_dict:
                state_dict[target] = program.state_dict[target]
            else:
                constants[target] = program.constants[target]
            input_specs.append(dataclasses.replace(original, arg=_tensor_argument(source.name)))
        else:
            _check_crossing(source, name)
            input_specs.append(_user_input_spec(source.name))
    for attr in attrs:
        value = _attribute(program.graph_module, str(attr.target))
        _set_attribute(root, str(attr.target), value)
        copied = graph.get_attr(str(attr.target))
        copied.meta = copy.copy(attr.meta)
        env[attr] = copied
        by_copy[copied] = handles[attr]
        if hasattr(value, "graph"):
            # A subgraph (torch.cond's branches); the same node objects: their own handles.
            for nested in walk_nodes(cast("torch.fx.GraphModule", value)):
                by_copy[nested] = handles[nested]
    for n in nodes:
        env[n] = graph.node_copy(n, env.__getitem__)
        by_copy[env[n]] = handles[n]

    outputs = [n for n in nodes if any(user not in inside for user in n.users)]
    for out in outputs:
        _check_crossing(out, name)
    output_node = graph.output(tuple(env[o] for o in outputs))
    by_copy[output_node] = handles[nodes[-1]] if nodes else -1
    gm = torch.fx.GraphModule(root, graph)
    output_specs = [_user_output_spec(o.name) for o in outputs]
    exported = _compat.exported_program(
        gm,
        input_specs,
        output_specs,
        state_dict=state_dict,
        constants=constants,
        range_constraints=dict(program.range_constraints),
        n_inputs=len(user_reads),
        n_outputs=len(outputs),
        verifiers=list(program.verifiers),  # a piece is in the program's IR: in-place ops on its intermediates too
    )
    state = piece_state(program, user_reads, outputs)
    if state:
        exported.graph_module.meta[STATE_META] = state
    # The program's graph module is a copy of gm: map its nodes, by name, to the handles.
    copies = {n.name: n for n in gm.graph.nodes}
    final = {}
    for node in exported.graph_module.graph.nodes:
        original = copies.get(node.name)
        final[node] = by_copy[original] if original is not None else by_copy[output_node]
    for nested_node, h in by_copy.items():
        if nested_node.graph is not gm.graph:
            final[nested_node] = h
    return CutProgram(exported, DebugHandles(final), user_reads, outputs)


def _check_crossing(node: torch.fx.Node, unit: str) -> None:
    """Values between units travel as tensors: anything else cannot cross a boundary."""
    if not isinstance(node.meta.get("val"), torch.Tensor):
        raise LoweringError(
            f"node {node.name!r} ({op_name(node)}) gives a {type(node.meta.get('val')).__name__}, "
            f"not a tensor, to another partition ({unit}); values between partitions must be tensors. "
            "Delegate it together with its users (a partition function or submodule list), or lower "
            "the whole method"
        )


def _input_kind(spec_by_name: dict[str, InputSpec], node: torch.fx.Node) -> InputKind | None:
    spec = spec_by_name.get(node.name) if node.op == "placeholder" else None
    return spec.kind if spec is not None else None


def _tensor_argument(name: str) -> TensorArgument:
    from torch.export.graph_signature import TensorArgument

    return TensorArgument(name=name)


def _user_input_spec(name: str) -> InputSpec:
    from torch.export.graph_signature import InputSpec

    return InputSpec(kind=InputKind.USER_INPUT, arg=_tensor_argument(name), target=None)


def _user_output_spec(name: str) -> OutputSpec:
    from torch.export.graph_signature import OutputSpec

    return OutputSpec(kind=OutputKind.USER_OUTPUT, arg=_tensor_argument(name), target=None)


def _attribute(module: torch.nn.Module, target: str) -> object:
    obj: object = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _set_attribute(root: torch.nn.Module, target: str, value: object) -> None:
    *parents, last = target.split(".")
    obj = root
    for part in parents:
        if not hasattr(obj, part):
            setattr(obj, part, torch.nn.Module())
        obj = getattr(obj, part)
    setattr(obj, last, value)
