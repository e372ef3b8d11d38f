"""State in the contract: buffer mutations become explicit inputs and outputs.

torch.export records a write to a buffer (``self.cache.index_copy_(...)``,
``self.acc.add_(x)``) as an in-place op on the buffer's placeholder or, once
functionalized, as a ``BUFFER_MUTATION`` output. A delegate runs graphs
without side effects, so the lowering rewrites such a program: each buffer
that a lowered method writes (the *state*) becomes a user input, first among
the inputs, and each new value a user output, first among the outputs. The
lowered module owns the state's tensors and passes them in and takes them
back on every call (docs/backend-contract.md, "State").

A write to a user input or a parameter is refused (the caller's tensors and
the weights are not state), and so is a state update made by a training-mode
op, where the hint to call ``.eval()`` is the fix.
"""

from __future__ import annotations

import operator
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import torch

from .. import _compat
from ..archive import StateSpec
from ..errors import LoweringError

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.export.graph_signature import InputSpec, OutputSpec, TensorArgument
    from torch.fx import Node

#: ``program.graph_module.meta[STATE_META]``: the `StateSpec` of each state the program reads.
STATE_META = "backendconf_state"
#: ``program.graph_module.meta[_STATE_NODES]``: ``{fqn: (placeholder name, new value's node name or None)}``.
_STATE_NODES = "backendconf_state_nodes"
#: The bool arguments that put an op in training mode (batch norm's ``training``, dropout's ``train``).
_TRAINING_ARGUMENTS = ("training", "train")


def state_specs(program: ExportedProgram) -> tuple[StateSpec, ...]:
    """The state a program given to ``preprocess`` reads and writes: one `StateSpec` per buffer.

    Empty for a program without state. A state input is a ``USER_INPUT``
    placeholder of the program; its `StateSpec` gives its position among the
    program's (and ``execute``'s) inputs and, when the program writes it, the
    position of its new value among the outputs. For a whole method the
    states come first, in these positions; a partition (``partition=``) gets
    the states its nodes read or write, at the positions its cut gave them.
    """
    return tuple(program.graph_module.meta.get(STATE_META, ()))


# --- refusing what is not state ---------------------------------------------------------


def _input_specs(program: ExportedProgram) -> dict[str, InputSpec]:
    return {spec.arg.name: spec for spec in program.graph_signature.input_specs if hasattr(spec.arg, "name")}


def in_place_writes(program: ExportedProgram) -> list[tuple[Node, Node]]:
    """``(node, placeholder)`` for each in-place op of the top-level graph that writes to a placeholder's
    memory, directly or through a view (``self.cache[0].add_(1)``, ``x.view(-1).relu_()``)."""
    aliases: dict[Node, frozenset[Node]] = {}
    writes: list[tuple[Node, Node]] = []
    for node in program.graph.nodes:
        if node.op == "placeholder":
            aliases[node] = frozenset({node})
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            source = node.args[0]
            aliases[node] = aliases.get(source, frozenset()) if isinstance(source, torch.fx.Node) else frozenset()
            continue
        schema = _compat.op_schema(node.target)
        if schema is None:
            continue
        shared: set[Node] = set()
        for i, argument in enumerate(schema.arguments):
            if argument.alias_info is None:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            values = value if isinstance(value, (list, tuple)) else (value,)
            for v in values:
                if isinstance(v, torch.fx.Node):
                    if argument.alias_info.is_write:
                        writes.extend((node, p) for p in sorted(aliases.get(v, ()), key=lambda n: n.name))
                    shared.update(aliases.get(v, ()))
        if any(r.alias_info is not None for r in schema.returns):
            aliases[node] = frozenset(shared)
    return writes


def _training_ops(program: ExportedProgram) -> list[Node]:
    found = []
    for node in program.graph.nodes:
        schema = _compat.op_schema(node.target) if node.op == "call_function" else None
        if schema is None:
            continue
        for i, argument in enumerate(schema.arguments):
            if argument.name in _TRAINING_ARGUMENTS:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
                if value is True:
                    found.append(node)
    return found


def _op(node: Node) -> str:
    schema = _compat.op_schema(node.target)
    return schema.name if schema is not None else str(node.target)


def check_mutations(program: ExportedProgram, method: str) -> frozenset[str]:
    """Refuse writes that cannot be state; return the buffers (by fully qualified name) it writes.

    A write to a user input names the node and the input; to a parameter,
    the node and the parameter; a state update in a program with a
    training-mode op says to call ``.eval()`` (and only then).
    """
    specs = _input_specs(program)
    written: dict[str, list[str]] = {}
    buffers: set[str] = set()
    for node, placeholder in in_place_writes(program):
        spec = specs.get(placeholder.name)
        kind = spec.kind.name if spec is not None else "USER_INPUT"
        if kind == "USER_INPUT":
            raise LoweringError(
                f"method {method!r} writes to its input {placeholder.name!r} (node {node.name!r}, "
                f"{_op(node)}, in place); a lowered method cannot change the caller's tensors. Write to a "
                f"copy ({placeholder.name} = {placeholder.name}.clone()) or return the new value"
            )
        if kind == "PARAMETER" and spec is not None:
            raise LoweringError(
                f"method {method!r} writes to parameter {spec.target!r} (node {node.name!r}, {_op(node)}, in "
                "place); parameters are constants to a backend. Register the tensor with register_buffer to "
                "keep it as state the lowered module carries from call to call"
            )
        if kind == "BUFFER" and spec is not None and spec.target is not None:
            buffers.add(spec.target)
            written.setdefault(spec.target, []).append(
                f"node {node.name!r} ({_op(node)} on {placeholder.name!r}, in place)"
            )
        else:
            raise LoweringError(
                f"method {method!r} writes to {placeholder.name!r}, a {kind.lower().replace('_', ' ')} "
                f"(node {node.name!r}, {_op(node)}, in place); only buffers can hold state"
            )
    for out in program.graph_signature.output_specs:
        kind = out.kind.name
        if kind == "BUFFER_MUTATION" and out.target is not None:
            buffers.add(out.target)
            written.setdefault(out.target, []).append(f"buffer mutation {out.target!r}")
        elif kind == "USER_INPUT_MUTATION":
            raise LoweringError(
                f"method {method!r} writes to its input {out.target!r} (output {out.arg.name!r}); a lowered "
                f"method cannot change the caller's tensors. Write to a copy or return the new value"
            )
        elif kind == "PARAMETER_MUTATION":
            raise LoweringError(
                f"method {method!r} writes to parameter {out.target!r}; parameters are constants to a "
                "backend. Register the tensor with register_buffer to keep it as state"
            )
    training = _training_ops(program)
    if buffers and training:
        described = ", ".join(d for fqn in sorted(written) for d in written[fqn])
        node = training[0]
        raise LoweringError(
            f"method {method!r} mutates state ({described}) with training-mode op node {node.name!r} "
            f"({_op(node)}, training=True) in the graph. Is the module in training mode? Call .eval() "
            "before lowering."
        )
    return frozenset(buffers)


# --- making state explicit ------------------------------------------------------------------


def make_explicit(
    programs: Mapping[str, ExportedProgram],
) -> tuple[dict[str, ExportedProgram], dict[str, tuple[StateSpec, ...]], dict[str, torch.Tensor]]:
    """The programs with their state explicit, each method's `StateSpec`s, and the state's initial values.

    The state is every buffer some method writes; a method that only reads
    such a buffer gets it as a state input too (prefill writes the cache,
    decode reads it: both must see its current value, not the value baked
    in at export). Programs without state are returned as they are.
    """
    written: set[str] = set()
    for name, program in programs.items():
        written |= check_mutations(program, name)
    if not written:
        return dict(programs), {}, {}
    out: dict[str, ExportedProgram] = {}
    specs: dict[str, tuple[StateSpec, ...]] = {}
    initial: dict[str, torch.Tensor] = {}
    for name, program in programs.items():
        reads = [s.target for s in program.graph_signature.input_specs if s.kind.name == "BUFFER"]
        if not any(fqn in written for fqn in reads):
            out[name] = program
            continue
        for fqn in reads:
            if fqn in written and fqn not in initial:
                value = program.state_dict[fqn] if fqn in program.state_dict else program.constants[fqn]
                # As exported: the program's own copy, never a module's live tensor.
                initial[fqn] = value.detach().clone()
        out[name], specs[name] = _explicit_cached(program, name, frozenset(written))
    return out, specs, initial


# Functionalizing retraces the program (about as long as the export itself): the suite lowers one
# exported program many times, so the explicit form is kept while the given program lives. Nothing
# downstream changes a program it is given (partitions are cut from copies).
_explicit_forms: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()
_explicit_lock = threading.Lock()


def _explicit_cached(
    program: ExportedProgram, method: str, state: frozenset[str]
) -> tuple[ExportedProgram, tuple[StateSpec, ...]]:
    with _explicit_lock:
        forms = _explicit_forms.setdefault(program, {})
        key = (state, id(program.graph), len(program.graph.nodes))
        if key not in forms:
            forms[key] = _explicit(program, method, set(state))
        return forms[key]


def functional_form(program: ExportedProgram) -> ExportedProgram:
    """What a backend that keeps state itself gets: torch.export's functional form (cached as above).

    Each state is a ``BUFFER`` input, its value as exported in ``state_dict``
    (or ``constants``), and its new value a ``BUFFER_MUTATION`` output.
    """
    with _explicit_lock:
        forms = _explicit_forms.setdefault(program, {})
        key = ("functional", id(program.graph), len(program.graph.nodes))
        if key not in forms:
            forms[key] = _functional(program)
        return forms[key]


def _functional(program: ExportedProgram) -> ExportedProgram:
    """A functional copy of ``program`` (torch.export's functionalization, no decomposition)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation noise from inside run_decompositions
        return program.run_decompositions({})


def _explicit(program: ExportedProgram, method: str, state: set[str]) -> tuple[ExportedProgram, tuple[StateSpec, ...]]:
    from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec

    functional = _functional(program)
    gm = functional.graph_module
    graph = gm.graph
    signature = functional.graph_signature
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    state_inputs = [s for s in signature.input_specs if s.kind == InputKind.BUFFER and s.target in state]
    others = [s for s in signature.input_specs if s not in state_inputs and s.kind != InputKind.USER_INPUT]
    users = [s for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    # The state placeholders move to just before the user's: the graph's placeholder order is the
    # signature's, and torch's checks want it so.
    first_user = next((placeholders[s.arg.name] for s in users if s.arg.name in placeholders), None)
    for spec in state_inputs:
        node = placeholders[spec.arg.name]
        if first_user is not None:
            first_user.prepend(node)
        else:
            last = [n for n in graph.nodes if n.op == "placeholder"][-1]
            if last is not node:
                last.append(node)
    input_specs: list[InputSpec] = [*others]
    for spec in state_inputs:
        input_specs.append(InputSpec(kind=InputKind.USER_INPUT, arg=spec.arg, target=None))
    input_specs += users

    output_node = graph.output_node()
    values = list(output_node.args[0]) if isinstance(output_node.args[0], (list, tuple)) else [output_node.args[0]]
    new_value: dict[str, object] = {}
    user_outputs: list[tuple[OutputSpec, object]] = []
    for spec, value in zip(signature.output_specs, values):
        if spec.kind == OutputKind.BUFFER_MUTATION and spec.target in state:
            new_value[spec.target] = value
        elif spec.kind == OutputKind.USER_OUTPUT:
            user_outputs.append((spec, value))
        else:
            raise LoweringError(
                f"method {method!r}: output {spec.arg!r} is a {spec.kind.name.lower().replace('_', ' ')}, which "
                "the lowering cannot make explicit state"
            )
    order = [s.target for s in state_inputs if s.target in new_value]
    output_specs: list[OutputSpec] = []
    outputs: list[object] = []
    for fqn in order:
        value = new_value[fqn]
        output_specs.append(OutputSpec(kind=OutputKind.USER_OUTPUT, arg=_argument(value), target=None))
        outputs.append(value)
    for spec, value in user_outputs:
        output_specs.append(spec)
        outputs.append(value)
    output_node.args = (tuple(outputs),)
    graph.lint()
    gm.recompile()

    state_specs_: list[StateSpec] = []
    nodes: dict[str, tuple[str, str | None]] = {}
    for i, spec in enumerate(state_inputs):
        fqn = spec.target
        value = placeholders[spec.arg.name].meta["val"]
        written = new_value.get(fqn)
        state_specs_.append(
            StateSpec(
                fqn=fqn,
                dtype=str(value.dtype).removeprefix("torch."),
                shape=tuple(int(d) for d in value.shape),
                input=i,
                output=order.index(fqn) if fqn in new_value else None,
            )
        )
        nodes[fqn] = (spec.arg.name, written.name if isinstance(written, torch.fx.Node) else None)
    keep = set(state)
    explicit = _compat.exported_program(
        gm,
        input_specs,
        output_specs,
        state_dict={k: v for k, v in functional.state_dict.items() if k not in keep},
        constants={k: v for k, v in functional.constants.items() if k not in keep},
        range_constraints=dict(functional.range_constraints),
        n_inputs=sum(1 for s in input_specs if s.kind == InputKind.USER_INPUT),
        n_outputs=len(output_specs),
    )
    explicit.graph_module.meta[STATE_META] = tuple(state_specs_)
    explicit.graph_module.meta[_STATE_NODES] = nodes
    return explicit, tuple(state_specs_)


def _argument(value: object) -> TensorArgument:
    from torch.export.graph_signature import TensorArgument

    if not isinstance(value, torch.fx.Node):
        raise LoweringError(f"a state's new value is {value!r}, not a tensor computed by the program")
    return TensorArgument(name=value.name)


def piece_state(program: ExportedProgram, reads: Iterable[Node], outputs: Iterable[Node]) -> tuple[StateSpec, ...]:
    """The `StateSpec`s of a partition cut out of ``program``: the states among its inputs and outputs."""
    nodes: dict[str, tuple[str, str | None]] = program.graph_module.meta.get(_STATE_NODES, {})
    if not nodes:
        return ()
    by_fqn = {s.fqn: s for s in state_specs(program)}
    read_at = {n.name: i for i, n in enumerate(reads)}
    written_at = {n.name: i for i, n in enumerate(outputs)}
    found = []
    for fqn, (placeholder, new) in nodes.items():
        if placeholder not in read_at and (new is None or new not in written_at):
            continue
        spec = by_fqn[fqn]
        # A partition may compute a state's new value from values another partition read it into.
        found.append(
            StateSpec(
                fqn=fqn,
                dtype=spec.dtype,
                shape=spec.shape,
                input=read_at.get(placeholder),
                output=written_at.get(new) if new is not None else None,
            )
        )
    return tuple(found)
