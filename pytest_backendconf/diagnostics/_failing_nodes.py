"""Which nodes a whole-graph compiler cannot build, when its own build error names none.

A fused compiler (TVM, an engine that builds one kernel for the graph) fails
the whole build with an error that names no node, while the contract asks
``preprocess`` to raise `UnsupportedNodeError(node, why)`. `failing_nodes`
cuts each node out as a one-node program (the divergence locator's pieces:
outside inputs become placeholders, the node's metadata, source frames
included, is copied) and asks the backend to build it alone: the nodes whose
one-node programs fail are the culprits, in program order, each with the
text of its own build error (`FailingNodes.errors`).

It is meant to be called from the backend's own ``preprocess``; the probes
call that ``preprocess`` again, so while probing, a nested `failing_nodes`
returns no nodes and the backend's original build error propagates (which is
how the probe learns that the node fails).
"""

from __future__ import annotations

import contextvars
import operator
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram

from ..debuginfo import DebugHandleRecorder
from ._divergence import piece_program

if TYPE_CHECKING:
    from ..backend import Backend

# True while failing_nodes probes: the backend's preprocess, called on a one-node
# program, must not probe again (it would recurse without end).
_probing: contextvars.ContextVar[bool] = contextvars.ContextVar("backendconf_probing", default=False)


class FailingNodes(list[torch.fx.Node]):
    """The nodes that fail alone, in program order: a ``list[torch.fx.Node]`` that also keeps each one's error.

    ``errors[node]`` is the text of the exception that building ``node``
    alone raised (``"BuildError: no schedule for tanh"``): the engine's own
    words for that node, where the whole build's error named none.
    """

    def __init__(self, failures: Iterable[tuple[torch.fx.Node, str]] = ()) -> None:
        pairs = list(failures)
        super().__init__(node for node, _ in pairs)
        #: node -> the text of its own build error.
        self.errors: dict[torch.fx.Node, str] = dict(pairs)

    def rejections(self) -> list[tuple[torch.fx.Node, str]]:
        """``[(node, its error)]``, as ``UnsupportedNodeError(rejections=...)`` takes them."""
        return [(node, self.errors[node]) for node in self]


def failing_nodes(
    program: ExportedProgram, backend: str | object, compile_spec: Mapping[str, Any] | None = None
) -> FailingNodes:
    """The nodes of ``program`` whose one-node programs ``backend`` fails to lower, in program order.

    Each ``call_function`` node of ``program`` becomes a program of its own
    (its inputs are placeholders with the node's input metadata) that goes
    through the backend's ``preprocess`` and, when the backend is available,
    its ``compile``, with ``compile_spec``; any exception means the node
    fails. The returned nodes are ``program``'s own, so that a backend can
    ``raise UnsupportedNodeError(nodes[0], why)`` from ``preprocess``, or name
    them all: ``UnsupportedNodeError(rejections=nodes.rejections())``, where
    each node's reason is its own build error (``nodes.errors[node]``).

    Called while probing (from the ``preprocess`` that a probe runs), it
    returns an empty list: the backend then raises its own build error, which
    is the probe's verdict.

    :param backend: a registered backend's name, or a backend object.
    """
    if not isinstance(program, ExportedProgram):
        raise TypeError(
            f"failing_nodes() takes the torch.export.ExportedProgram given to preprocess(), got "
            f"{type(program).__name__}; pass preprocess()'s first argument"
        )
    if _probing.get():
        return FailingNodes()
    from ..lowering import resolve_backend

    backend_obj, _ = resolve_backend(backend)
    spec = dict(compile_spec or {})
    token = _probing.set(True)
    try:
        failures = ((node, _build_alone(node, backend_obj, spec)) for node in _candidates(program))
        return FailingNodes((node, error) for node, error in failures if error is not None)
    finally:
        _probing.reset(token)


def _candidates(program: ExportedProgram) -> list[torch.fx.Node]:
    # Control flow (torch.cond) refers to subgraphs by get_attr: it is not cut out alone.
    return [
        n
        for n in program.graph_module.graph.nodes
        if n.op == "call_function"
        and n.target is not operator.getitem
        and not any(a.op == "get_attr" for a in n.all_input_nodes)
        and isinstance(n.meta.get("val"), (torch.Tensor, tuple, list))
    ]


def _build_alone(node: torch.fx.Node, backend: Backend, compile_spec: dict[str, Any]) -> str | None:
    """The text of the error building ``node`` alone raised, or ``None`` if it builds."""
    # The metadata values stand in for the eager ones: the piece is built, never run.
    env = {n: n.meta.get("val") for n in node.all_input_nodes}
    env[node] = node.meta.get("val")
    try:
        piece, _, _ = piece_program([node], env)
        handles = DebugHandleRecorder().assign(piece.graph_module)
        blob = backend.preprocess(piece, dict(compile_spec), handles)
        from ..lowering import availability

        if availability(backend):
            backend.compile({"forward": blob}, {"forward": dict(compile_spec)})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
