"""Where a model's backend outputs first depart from eager PyTorch, without any backend hook.

Eager runs once over the exported program, recording every intermediate.
Then each node, in program order, becomes a one-node program (its inputs
are placeholders fed with the eager intermediates, its metadata, source
frames included, copied), lowered whole to the backend and compared with
the eager value: the first node out of tolerance is where the model
diverges. When no single node is out of tolerance (small errors adding
up, or an engine that fuses several nodes into one kernel), growing
prefixes of the graph, fed with the eager inputs at their frontier, are
bisected for the first node whose output is out of tolerance, and then the
group ending at that node is shrunk from the front to the smallest one
still out of tolerance: the nodes that diverge only together, each named
with its source line. A node's index output that breaks ties another way,
validly (`pytest_backendconf.numerics.settle_ties`), is no divergence.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import operator
from typing import TYPE_CHECKING, Any, NoReturn, Sequence, cast

import torch
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from .. import _compat

from ..debuginfo import DebugHandleRecorder
from ..debuginfo import DebugInfo, build_debug_infos
from ..numerics import (
    Closeness,
    InvalidIndices,
    StructureMismatch,
    TieOpen,
    Tolerance,
    compare_outputs,
    settle_ties,
    tie_open_call,
    worst,
)

if TYPE_CHECKING:
    from torch.fx import Node
    from torch.fx.node import Argument

    from ..backend import Backend


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first node out of tolerance, its debug info and how far off it is."""

    node: str
    op: str
    info: DebugInfo
    closeness: Closeness
    #: When no node is out of tolerance alone: the smallest run of nodes that is out of
    #: tolerance together, in program order (``node`` is the first output out of tolerance in it).
    group: tuple[DebugInfo, ...] = ()

    def text(self) -> str:
        c = self.closeness
        allowed = c.tolerance.atol + c.tolerance.rtol * abs(c.expected)
        error = f"max abs error {c.max_abs:.3g} (tolerance {allowed:.3g}: {c.tolerance})"
        if len(self.group) > 1:
            lines = "\n".join(f"  '{i.node}' ({i.op}) at {_where(i)}" for i in self.group)
            return (
                f"Diverges first in a group of {len(self.group)} nodes, each within tolerance alone but not "
                f"together (an engine that fuses them?), first out of tolerance at node '{self.node}' ({self.op}): {error}\n"
                f"{lines}\n{self.info}"
            )
        return f"Diverges first at node '{self.node}' ({self.op}): {error}\n{self.info}"

    def as_json(self) -> dict[str, Any]:
        """The report's ``details.divergence``: the node, its operator and how far off it is, as data."""
        c = self.closeness

        def number(value: float) -> float | str:  # JSON has no inf or NaN: strings, as the report's numerics
            return float(value) if math.isfinite(value) else str(float(value))

        found: dict[str, Any] = {
            "node": self.node,
            "op": self.op,
            "max_abs_error": number(c.max_abs),
            "allowed": number(c.tolerance.atol + c.tolerance.rtol * abs(c.expected)),
            "rtol": float(c.tolerance.rtol),
            "atol": float(c.tolerance.atol),
        }
        if len(self.group) > 1:
            found["group"] = [i.node for i in self.group]
        return found


def _where(info: DebugInfo) -> str:
    frame = info.frames[-1] if info.frames else None
    if frame is None:
        return "(no source line)"
    source = f": {frame.source.strip()}" if frame.source and frame.source.strip() else ""
    return f"{frame.file}:{frame.line}{source}"


def locate_divergence(
    module: torch.nn.Module,
    backend: str | object,
    example_inputs: tuple,
    *,
    method: str = "forward",
    tolerance: tuple[float, float] | None = None,
) -> DebugInfo | None:
    """The debug info of the first node whose backend output departs from eager, or ``None``.

    :param backend: a registered backend's name, or a backend object.
    :param tolerance: ``(rtol, atol)``; default: the suite's default for the
        dtype of the node's output (docs/writing-a-backend.md, "Tolerances").
    """
    import copy

    from ..lowering import export_method
    from ..lowering import resolve_backend

    backend_obj, _ = resolve_backend(backend)
    work = copy.deepcopy(module)
    program = export_method(work, method, tuple(example_inputs), {})
    found = locate_in_program(
        program,
        backend_obj,
        list(_compat.tree_leaves(tuple(example_inputs))),
        top_class=type(module).__name__,
        method=method,
        tolerance=None if tolerance is None else Tolerance(*tolerance, "given"),
    )
    return found.info if found is not None else None


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """The suite's parity default for a dtype (``[parity]`` in conformance/suite.toml).

    The suite's settings file is read as data, so that the locator outside
    the suite judges with the same defaults without importing the suite.
    """
    import sys
    from importlib import resources

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    spec = tomllib.loads(resources.files("pytest_backendconf.conformance").joinpath("suite.toml").read_text())
    rtol, atol = spec["parity"]["tolerances"].get(str(dtype).removeprefix("torch."), (0.0, 0.0))
    return Tolerance(float(rtol), float(atol), "default")


def locate_in_program(
    program: ExportedProgram,
    backend: Backend,
    user_inputs: list[object],
    *,
    top_class: str,
    method: str = "forward",
    tolerance: Tolerance | None = None,
) -> Divergence | None:
    """`locate_divergence` over an already exported program and its flat user inputs."""
    env = eager_intermediates(program, user_inputs)
    graph = program.graph_module.graph
    candidates = [
        n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem and _localizable(n)
    ]
    handles = DebugHandleRecorder().assign(program.graph_module)
    infos = build_debug_infos(program.graph_module, handles, method=method, top_class=top_class)
    by_name = {info.node: info for info in infos.values()}

    def judge(nodes: list[Node]) -> tuple[Node, Closeness] | None:
        """The first of ``nodes``' outputs out of tolerance when they run together on the backend."""
        try:
            results = run_on_backend(nodes, env, backend, program=program)
        except Exception:
            return None  # the backend cannot run this piece alone: no verdict from it
        for node, actual, expected in results:
            tol = tolerance or _tolerance_of(expected)
            try:
                closeness = compare_outputs(actual, expected, tol)
            except StructureMismatch:
                continue
            top = worst(c for c in closeness if not c.passed)
            if top is not None:
                return node, top
        return None

    for node in candidates:
        verdict = judge([node])
        if verdict is not None:
            return _divergence(verdict, by_name)
    # No node is wrong alone: find the shortest prefix whose outputs are out of tolerance.
    low, high = 0, len(candidates)
    if high == 0 or judge(candidates) is None:
        return None
    while high - low > 1:
        middle = (low + high) // 2
        if judge(candidates[:middle]) is not None:
            high = middle
        else:
            low = middle
    verdict = judge(candidates[:high])
    if verdict is None:
        return None
    # The smallest group ending at the failing node: shrink from the front while it still fails.
    start, end = 0, high - 1  # candidates[start:high] fails; candidates[end:high] (one node) does not
    while end - start > 1:
        middle = (start + end) // 2
        if judge(candidates[middle:high]) is not None:
            start = middle
        else:
            end = middle
    found = _divergence(verdict, by_name)
    if found is None:
        return None
    group = tuple(by_name[n.name] for n in candidates[start:high] if n.name in by_name)
    return dataclasses.replace(found, group=group)


def _divergence(verdict: tuple[Node, Closeness], by_name: dict[str, DebugInfo]) -> Divergence | None:
    node, closeness = verdict
    info = by_name.get(node.name)
    if info is None:
        return None
    return Divergence(node.name, info.op, info, closeness)


def _tolerance_of(value: object) -> Tolerance:
    leaves = [v for v in _compat.tree_leaves(value) if isinstance(v, torch.Tensor)]
    return default_tolerance(leaves[0].dtype if leaves else torch.float32)


def _localizable(node: Node) -> bool:
    # Control flow (torch.cond) refers to subgraphs by get_attr: it is not cut out alone.
    return not any(a.op == "get_attr" for a in node.all_input_nodes) and isinstance(
        node.meta.get("val"), (torch.Tensor, tuple, list)
    )


class _Recorder(torch.fx.Interpreter):
    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.values: dict[Node, object] = {}

    def run_node(self, n: Node) -> object:
        value = super().run_node(n)
        self.values[n] = value
        return value


def eager_intermediates(program: ExportedProgram, user_inputs: Sequence[object]) -> dict[Node, object]:
    """Every node's eager value, running the exported graph with the program's own state."""
    recorder = _Recorder(program.graph_module)
    with torch.no_grad():
        recorder.run(*_compat.graph_arguments(program, user_inputs))
    return recorder.values


def run_on_backend(
    nodes: list[Node],
    env: dict[Node, object],
    backend: Backend,
    *,
    program: ExportedProgram | None = None,
    outputs: list[Node] | None = None,
) -> list[tuple[Node, list[object], list[object]]]:
    """Lower ``nodes`` (in order) as one program fed with eager values: per output node, its outputs
    from the backend and from eager (the items of a tuple that the graph uses).

    ``program`` and ``outputs`` are `piece_program`'s: the program's weights stay constants, and only
    ``outputs`` are the piece's outputs (default: every node).
    """
    from ..lowering import lower_programs

    piece, inputs, counts = piece_program(nodes, env, program=program, outputs=outputs)
    lowered = lower_programs({"forward": piece}, backend, {"forward": {}}, module_type=inputs_module_type(len(inputs)))
    with torch.no_grad():
        flat = _compat.tree_leaves(lowered(*inputs))
    results = []
    position = 0
    for node, items in counts:
        values = flat[position : position + len(items)]
        position += len(items)
        value = env[node]
        # Items: the node returns a tuple, and the graph reads these of it (getitem).
        expected = [value] if items == [None] else [cast("Sequence[object]", value)[i] for i in items if i is not None]
        results.append((node, _settle_ties(node, items, values, expected, env), expected))
    return results


def _settle_ties(
    node: Node, items: list[int | None], values: list[object], expected: list[object], env: dict[Node, object]
) -> list[object]:
    """``values`` with a valid other order of ties in ``node``'s index output counted as eager's (numerics' rule)."""
    if not _compat.is_op_overload(node.target):
        return values
    call = tie_open_call(str(node.target), node.args, node.kwargs)
    if call is None or len(values) != len(expected):
        return values
    if items == [None]:
        at = 0 if call.output == 0 else None
    else:
        at = items.index(call.output) if call.output in items else None
    if at is None:
        return values
    try:
        # A tie-open op selects from its first argument, a tensor node, and its indices are a tensor.
        source = cast(torch.Tensor, env[cast("Node", node.args[0])])
        settled, _ = settle_ties(values, expected, {at: TieOpen(call, source, cast(torch.Tensor, expected[at]))})
    except InvalidIndices:
        return values  # other values selected: the comparison reports the difference
    return settled


def piece_program(
    nodes: list[Node],
    env: dict[Node, object],
    *,
    program: ExportedProgram | None = None,
    outputs: list[Node] | None = None,
    range_constraints: dict | None = None,
) -> tuple[ExportedProgram, list[torch.Tensor], list[tuple[Node, list[int | None]]]]:
    """A program of ``nodes`` whose outside inputs are placeholders fed with eager values.

    With ``program`` (the program the nodes come from), its weights (parameters, buffers, lifted
    constants) stay constants of the piece, as a backend saw them in the whole program: a compiler
    that fuses a quantized convolution only over a constant weight fuses it here too. ``outputs``
    (default: every node) are the nodes whose values the piece returns; a node whose value nothing
    outside reads stays an intermediate, as in the program.

    ``range_constraints`` (the program's, for its symbolic sizes) are kept on the piece: without them a
    size the program bounds is unbounded there. A higher-order op's subgraphs (``torch.cond``'s
    branches, read by ``get_attr``) go into the piece with it.

    Returns it, its inputs, and per output node which of its results are outputs
    (``[None]``: the node's tensor; else the tuple indices the graph uses).
    """
    graph = torch.fx.Graph()
    mapping: dict[Node, Argument] = {}
    inputs: list[torch.Tensor] = []
    inside = set(nodes)
    weights = _weights_of(program)
    kept: dict[str, tuple[InputSpec, torch.Tensor]] = {}  # placeholder name -> the weight's spec and tensor

    submodules: dict[str, torch.nn.Module] = {}

    def outside(n: Node) -> Argument:
        if n in mapping:
            return mapping[n]
        if n.op == "get_attr":
            # A subgraph (a cond branch): the piece holds the module itself, under the same name.
            owner = n.graph.owning_module
            assert owner is not None and isinstance(n.target, str)
            submodules[n.target] = _submodule(owner, n.target)
            mapping[n] = graph.node_copy(n)
            return mapping[n]
        value = env[n]
        if not isinstance(value, torch.Tensor):
            constant = cast("Argument", value)  # a number from an earlier node (a size): a constant here
            mapping[n] = constant
            return constant
        if n in weights:
            placeholder = graph.placeholder(f"weight{len(kept)}")
            placeholder.meta["val"] = n.meta.get("val")
            mapping[n] = placeholder
            kept[placeholder.name] = weights[n]
            return placeholder
        placeholder = graph.placeholder(f"input{len(inputs)}")
        placeholder.meta["val"] = n.meta.get("val")
        mapping[n] = placeholder
        inputs.append(value)
        return placeholder

    frontier = [n for node in nodes for n in node.all_input_nodes if n not in inside]
    # Placeholders first, weights before user inputs (as export orders them), then the nodes.
    for n in sorted(frontier, key=lambda n: (n.op == "get_attr", n not in weights)):
        outside(n)
    for node in nodes:
        mapping[node] = graph.node_copy(node, lambda n: mapping[n] if n in mapping else outside(n))
        for user in node.users:
            if user.target is operator.getitem and user not in inside:
                mapping[user] = graph.node_copy(user, lambda n: mapping[n])
    # The piece's outputs: copies of the nodes (the constants in `mapping` stand for nodes outside).
    output_nodes: list[Node] = []
    counts: list[tuple[Node, list[int | None]]] = []
    for node in nodes if outputs is None else outputs:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            output_nodes.append(cast("Node", mapping[node]))
            counts.append((node, [None]))
        else:
            # A tuple: the items the graph reads (getitem's index, an int).
            items = sorted(
                (u for u in node.users if u.target is operator.getitem and u in mapping),
                key=lambda u: cast(int, u.args[1]),
            )
            output_nodes.extend(cast("Node", mapping[u]) for u in items)
            counts.append((node, [cast(int, u.args[1]) for u in items]))
    graph.output(tuple(output_nodes))
    root = torch.nn.Module()
    for name, submodule in submodules.items():
        root.add_module(name, submodule)
    module = torch.fx.GraphModule(root, graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    # A weight keeps its kind and name (a parameter stays a parameter): compilers and their passes
    # look weights up by kind, and a parameter made a lifted constant fails in some (ExecuTorch's
    # XNNPACK passes) where the program builds.
    state_dict: dict[str, torch.Tensor] = {}
    constants: dict = {}  # name -> tensor (ExportedProgram's own annotation is wider)
    for spec, tensor in kept.values():
        assert spec.target is not None  # a weight's spec names it
        if spec.kind is InputKind.PARAMETER or (spec.kind is InputKind.BUFFER and spec.persistent):
            state_dict[spec.target] = tensor
        else:
            constants[spec.target] = tensor
    signature = ExportGraphSignature(
        input_specs=[
            dataclasses.replace(kept[p.name][0], arg=TensorArgument(p.name))
            if p.name in kept
            else InputSpec(InputKind.USER_INPUT, TensorArgument(p.name), None)
            for p in placeholders
        ],
        output_specs=[OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(o.name), None) for o in output_nodes],
    )
    in_spec = _compat.tree_flatten((tuple(inputs), {}))[1]
    out_spec = _compat.tree_flatten(tuple(output_nodes))[1]
    piece = ExportedProgram(
        root=module,
        graph=module.graph,
        graph_signature=signature,
        state_dict=state_dict,
        range_constraints=dict(range_constraints or {}),
        module_call_graph=[
            ModuleCallEntry("", ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec))
        ],
        constants=constants,
        # The dialect of the program the nodes come from (a training-IR program may hold in-place ops).
        verifiers=list(program.verifiers) if program is not None else None,
    )
    return piece, inputs, counts


def _submodule(owner: torch.nn.Module, target: str) -> torch.nn.Module:
    """The submodule a ``get_attr`` node names (a dotted path under ``owner``)."""
    value: object = owner
    for part in target.split("."):
        value = getattr(value, part)
    assert isinstance(value, torch.nn.Module), f"get_attr {target!r} is not a subgraph"
    return value


def _weights_of(program: ExportedProgram | None) -> dict[Node, tuple[InputSpec, torch.Tensor]]:
    """The program's placeholders that are its weights (parameters, buffers, lifted constants), with their
    specs and tensors."""
    if program is None:
        return {}
    by_name = {n.name: n for n in program.graph_module.graph.nodes if n.op == "placeholder"}
    found = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            continue
        tensor = program.state_dict.get(spec.target)
        if tensor is None:
            tensor = program.constants.get(spec.target)
        if isinstance(tensor, torch.Tensor) and spec.arg.name in by_name:
            found[by_name[spec.arg.name]] = (spec, tensor)
    return found


def inputs_module_type(arity: int) -> type:
    """A module type whose ``forward`` takes ``arity`` tensors (``input0`` …): the lowered signature."""
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(f"input{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(arity)
    ]

    def forward(self: torch.nn.Module, *inputs: torch.Tensor) -> NoReturn:  # pragma: no cover - never called
        raise NotImplementedError

    forward.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return type("Piece", (torch.nn.Module,), {"forward": forward, "__module__": __name__})
