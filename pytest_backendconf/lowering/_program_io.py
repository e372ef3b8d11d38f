"""A program's user inputs and outputs, with their example values (lowering and the CPU fallback share them)."""

from __future__ import annotations

from typing import Any

from .. import _compat


def user_inputs(program: Any) -> list[tuple[str, Any]]:
    """``(name, example value)`` of each user input: a fake tensor, or the constant baked in."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return _user_values(program.graph_signature.input_specs, "USER_INPUT", nodes)


def user_outputs(program: Any) -> list[tuple[str, Any]]:
    """``(name, example value)`` of each user output, in the program's output order."""
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    nodes = {a.name: a for a in _compat.tree_leaves(output_node.args[0]) if hasattr(a, "name")}
    return _user_values(program.graph_signature.output_specs, "USER_OUTPUT", nodes)


def _user_values(specs: Any, kind: str, nodes: dict[str, Any]) -> list[tuple[str, Any]]:
    values = []
    for spec in specs:
        if spec.kind.name == kind:
            arg = spec.arg
            values.append((arg.name, arg.value if hasattr(arg, "value") else nodes[arg.name].meta["val"]))
    return values
