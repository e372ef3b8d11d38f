"""ProgramNodes: a program's nodes found again from the graphs torch derives from it (the engines' shared helper)."""

from __future__ import annotations

import pytest
import torch

from pytest_backendconf.provenance import ProgramNodes, graph_modules


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)).softmax(-1)


class Branches(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


def _program(model=None, *args):
    return torch.export.export(model or Model().eval(), args or (torch.randn(2, 4),))


def test_every_decomposed_node_leads_back_to_the_op_node_it_comes_from():
    program = _program()
    nodes = ProgramNodes(program)
    decomposed = program.run_decompositions()
    calls = [n for n in decomposed.graph_module.graph.nodes if n.op == "call_function"]
    origins = {n.name: nodes.origin(n) for n in calls}
    assert all(o is not None and o in nodes.nodes for o in origins.values()), origins
    # linear decomposes into several nodes (a transpose, addmm), each traced to the one linear node.
    linear = next(n for n in nodes.call_nodes() if "linear" in str(n.target))
    assert sum(o is linear for o in origins.values()) > 1, origins
    # A node of the program is its own origin; None stays None.
    assert nodes.origin(linear) is linear and nodes.origin(None) is None


def test_a_node_without_provenance_is_found_by_name_only_when_asked():
    program = _program()
    nodes = ProgramNodes(program)
    copy = torch.fx.Graph()
    copy.graph_copy(program.graph_module.graph, {})
    copied = next(n for n in copy.nodes if n.op == "call_function")
    copied.meta.pop("from_node", None)
    assert nodes.origin(copied) is None and nodes.origin(copied, by_name=True) is None  # no record at all
    # Records that stop short of the program (a pass that copied a graph without recording it):
    # the oldest name recorded, when asked.
    original = next(n for n in nodes.call_nodes() if n.name == copied.name)
    stranger = type("NodeSource", (), {"graph_id": -1, "name": original.name, "from_node": []})()
    copied.meta["from_node"] = [stranger]
    assert nodes.origin(copied) is None and nodes.origin(copied, by_name=True) is original


def test_subgraph_nodes_are_indexed_with_their_path():
    program = _program(Branches(), torch.randn(3))
    nodes = ProgramNodes(program)
    paths = {p for p, _ in graph_modules(program.graph_module)}
    assert "" in paths and len(paths) == 3, paths
    sin = next(n for n in nodes.nodes if "sin" in str(n.target))
    assert nodes.path[sin].endswith("/") and nodes.path[nodes.output] == ""


def test_the_fault_node_is_an_op_node_or_a_value_error_listing_them():
    nodes = ProgramNodes(_program())
    name = nodes.call_nodes()[0].name
    assert nodes.fault_node(name).name == name
    with pytest.raises(
        ValueError, match=r"fault injection names node 'x', which is not an op node .*its op nodes are '"
    ):
        nodes.fault_node("x")


def test_the_fingerprint_changes_when_a_weight_changes_in_place():
    program = _program()
    nodes = ProgramNodes(program)
    before = nodes.fingerprint()
    assert nodes.fingerprint() == before
    with torch.no_grad():
        next(iter(program.state_dict.values())).add_(1)
    assert nodes.fingerprint() != before
