"""A program's user inputs and outputs, with their example values (lowering and the CPU fallback share them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from .. import _compat

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.export.graph_signature import InputSpec, OutputSpec
    from torch.fx import Node


def user_inputs(program: ExportedProgram) -> list[tuple[str, object]]:
    """``(name, example value)`` of each user input: a fake tensor, or the constant baked in."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return _user_values(program.graph_signature.input_specs, "USER_INPUT", nodes)


def user_outputs(program: ExportedProgram) -> list[tuple[str, object]]:
    """``(name, example value)`` of each user output, in the program's output order."""
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    nodes = {a.name: a for a in _compat.tree_leaves(output_node.args[0]) if hasattr(a, "name")}
    return _user_values(program.graph_signature.output_specs, "USER_OUTPUT", nodes)


def _user_values(
    specs: Iterable[InputSpec | OutputSpec], kind: str, nodes: dict[str, Node]
) -> list[tuple[str, object]]:
    values: list[tuple[str, object]] = []
    for spec in specs:
        if spec.kind.name == kind:
            arg = spec.arg
            values.append((arg.name, arg.value if hasattr(arg, "value") else nodes[arg.name].meta["val"]))
    return values
