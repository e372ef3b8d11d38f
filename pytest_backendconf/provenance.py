"""The given program's nodes, found again in the graphs an engine derives from it.

A backend whose toolchain rewrites the program (torch's decompositions,
ExecuTorch's edge passes, an engine's own conversion) still owes every
error and every debug handle to a node of the program ``preprocess`` was
given. torch records where each derived node comes from
(``node.meta["from_node"]``: a chain of ``NodeSource`` records naming a
graph by ``id`` and a node by name); `ProgramNodes` indexes the given
program's nodes, subgraphs included, and follows that chain back:

    nodes = ProgramNodes(program)
    decomposed = program.run_decompositions()
    for node in decomposed.graph_module.graph.nodes:
        original = nodes.origin(node)        # a node of `program`, or None
        handle = debug_handles.get(original)

`fault_node` resolves the node the suite's fault injection names
(``compile_spec["__backendconf_fault__"]["node"]``), and `fingerprint`
says when a cached derivation of the program is stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.export import ExportedProgram

#: How many provenance records `ProgramNodes.origin` reads before giving up (a cycle would be a torch bug).
_MAX_RECORDS = 10_000


def graph_modules(graph_module: torch.fx.GraphModule) -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """``(path, graph module)`` of a graph module and of every subgraph in it (``torch.cond`` branches …)."""
    for path, module in graph_module.named_modules(remove_duplicate=False):
        if isinstance(module, torch.fx.GraphModule):
            yield path, module


def named_op_node(calls: list[torch.fx.Node], name: str) -> torch.fx.Node:
    """The op node of ``calls`` called ``name`` (the fault injection's); ``ValueError`` listing them otherwise."""
    for node in calls:
        if node.name == name:
            return node
    examples = ", ".join(repr(node.name) for node in calls[:10])
    more = f" and {len(calls) - 10} more" if len(calls) > 10 else ""
    raise ValueError(
        f"fault injection names node {name!r}, which is not an op node of this program; "
        f"its op nodes are {examples}{more}"
    )


class ProgramNodes:
    """The FX nodes of a given program (its subgraphs' too), and the way back to them from derived graphs."""

    def __init__(self, program: ExportedProgram) -> None:
        self.program = program
        self.by_graph: dict[tuple[int, str], torch.fx.Node] = {}
        self.by_name: dict[str, torch.fx.Node] = {}
        #: node -> "" or its subgraph's path + "/"
        self.path: dict[torch.fx.Node, str] = {}
        self.nodes: list[torch.fx.Node] = []
        for path, graph_module in graph_modules(program.graph_module):
            for node in graph_module.graph.nodes:
                self.by_graph[(id(node.graph), node.name)] = node
                self.by_name.setdefault(node.name, node)
                self.path[node] = f"{path}/" if path else ""
                self.nodes.append(node)
        #: The program's output node: what an error that no single node explains names.
        self.output = program.graph_module.graph.output_node()

    def call_nodes(self) -> list[torch.fx.Node]:
        return [node for node in self.nodes if node.op == "call_function"]

    def origin(self, node: torch.fx.Node | None, *, by_name: bool = False) -> torch.fx.Node | None:
        """The node of the given program that ``node`` (of a derived graph, or of the program) comes from.

        Breadth first through ``from_node``: the nearest recorded ancestor that
        is one of the program's. ``by_name``: where the records stop short of
        the program (a pass that copied a graph without recording it), the
        oldest name recorded, if a node of the program has it.
        """
        if node is None:
            return None
        found = self.by_graph.get((id(node.graph), node.name))
        if found is not None and found is node:
            return found
        pending = list(node.meta.get("from_node", ()))
        read, last = 0, None
        while pending and read < _MAX_RECORDS:
            source = pending.pop(0)
            read += 1
            found = self.by_graph.get((source.graph_id, source.name))
            if found is not None:
                return found
            last = source
            pending.extend(source.from_node)
        if by_name and last is not None:
            return self.by_name.get(last.name)
        return None

    def fault_node(self, name: str) -> torch.fx.Node:
        """The op node the suite's fault injection names; ``ValueError`` listing the op nodes otherwise."""
        return named_op_node(self.call_nodes(), name)

    def fingerprint(self) -> tuple:
        """What a derivation of the program depends on: every graph and node, every tensor's identity and version.

        Graph identities matter too: derived nodes' provenance names the
        program's graphs by ``id``. Two calls give equal tuples only if a
        cached derivation is still the program's.
        """
        program = self.program
        graphs = tuple(id(gm.graph) for _, gm in graph_modules(program.graph_module))
        nodes = tuple((n.name, n.op, str(n.target), str(n.args), str(n.kwargs)) for n in self.nodes)
        tensors = tuple(
            (name, id(t), t._version, t.dtype, tuple(t.shape))
            for name, t in (*program.state_dict.items(), *program.constants.items())
            if isinstance(t, torch.Tensor)
        )
        return graphs, nodes, tensors
