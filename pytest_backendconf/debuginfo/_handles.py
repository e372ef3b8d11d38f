"""Debug handles: each lowering numbers its graph nodes with a recorder of its own.

A lowering's handles start at 0 and are unique within it (every method, partition and fallback
segment), monotonic, and checked against int64 overflow (docs/backend-contract.md#debug-handles-and-texts).
They depend only on the programs lowered, never on what the process lowered before: the same
lowering gives the same handles, blobs and archive in any process, in any order, which is what lets
the preprocess cache serve a rerun under pytest-xdist.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

INT64_MAX = 2**63 - 1


class DebugHandleRecorder:
    """Issues the debug handles of one lowering (each `to_backend` makes its own); safe to share between threads."""

    def __init__(self, first: int = 0, last: int = INT64_MAX) -> None:
        self._next = first
        self._last = last
        self._lock = threading.Lock()

    def reserve(self, count: int) -> range:
        """Reserve ``count`` consecutive handles and return them as a range."""
        if count < 0:
            raise ValueError(f"cannot reserve {count} debug handles")
        with self._lock:
            start = self._next
            if self._last - start + 1 < count:
                raise OverflowError(
                    f"debug handles exhausted: {count} more requested after {start - 1}, "
                    f"but handles stop at {self._last} (int64)"
                )
            self._next = start + count
        return range(start, start + count)

    def assign(self, graph_module: GraphModule) -> "DebugHandles":
        """Give every node of ``graph_module`` and its nested subgraphs a handle.

        Nodes are numbered in graph order, each subgraph right after the
        node that references it (depth first), from where this recorder's
        last block ended: so the numbering depends only on the graphs given
        to this recorder, in their order.
        """
        nodes = list(walk_nodes(graph_module))
        block = self.reserve(len(nodes))
        return DebugHandles(dict(zip(nodes, block)))


class DebugHandles(Mapping["Node", int]):
    """``debug_handles[node]`` → the node's debug handle, nested subgraphs included."""

    def __init__(self, by_node: dict[Node, int]) -> None:
        self._by_node = by_node

    def __getitem__(self, node: Node) -> int:
        try:
            return self._by_node[node]
        except KeyError:
            raise KeyError(
                f"node {getattr(node, 'name', node)!r} has no debug handle: it is not a node "
                "of the program given to preprocess (did a pass copy the graph?)"
            ) from None

    def __iter__(self) -> Iterator[Node]:
        return iter(self._by_node)

    def __len__(self) -> int:
        return len(self._by_node)

    def __repr__(self) -> str:
        handles = list(self._by_node.values())
        span = f"{handles[0]}..{handles[-1]}" if handles else "none"
        return f"<DebugHandles {len(handles)} nodes, handles {span}>"


def walk_nodes(graph_module: GraphModule) -> Iterator[Node]:
    """Every node of ``graph_module``, each subgraph after the node that uses it."""
    for node in graph_module.graph.nodes:
        yield node
        if node.op == "get_attr":
            sub = _submodule(graph_module, str(node.target))
            if sub is not None and hasattr(sub, "graph"):
                yield from walk_nodes(cast("GraphModule", sub))  # a subgraph (torch.cond's branches)


def _submodule(graph_module: GraphModule, target: str) -> object:
    obj: object = graph_module
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
