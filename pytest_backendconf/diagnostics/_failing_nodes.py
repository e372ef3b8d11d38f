"""Which nodes a whole-graph compiler cannot build, when its own build error names none, and the verdict.

A fused compiler (TVM, IREE, an engine that builds one kernel for the graph)
fails the whole build with an error that names no node, while the contract
asks ``preprocess`` to name its nodes: `UnsupportedNodeError` for a node the
backend does not claim, `CompilerError` for one it claims and its compiler
broke on. `failing_nodes` cuts each node out as a one-node program (the
divergence locator's pieces: outside inputs become placeholders, the
program's weights stay constants, its range constraints stay, a ``torch.cond``
keeps its branches, the node's metadata, source frames included, is copied)
and asks the backend to build it alone: the nodes whose one-node programs
fail are the culprits, in program order, each with a `NodeFailure` (the
exception, its diagnostic line, and whether it needs the node's constants or
its dynamic shapes to fail). `FailingNodes.raise_verdict` turns them into the
error ``preprocess`` raises.

It is meant to be called from the backend's own ``preprocess``; the probes
call that ``preprocess`` again, so while probing, a nested `failing_nodes`
returns no nodes and the backend's original build error propagates (which is
how the probe learns that the node fails).
"""

from __future__ import annotations

import contextvars
import dataclasses
import operator
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import torch
from torch.export import ExportedProgram

from .. import _compat
from .._diagnostic import diagnostic_line
from ..debuginfo import DebugHandleRecorder
from ..errors import CompilerError, UnsupportedNodeError
from ..lowering import op_overload
from ._divergence import piece_program

if TYPE_CHECKING:
    from ..backend import Backend

# True while failing_nodes probes: the backend's preprocess, called on a one-node
# program, must not probe again (it would recurse without end).
_probing: contextvars.ContextVar[bool] = contextvars.ContextVar("backendconf_probing", default=False)

#: How a node's one-node failure reproduced: as the node stands in the program (its weights constants,
#: its sizes dynamic where the program's are) and also otherwise (``alone``); only while its weights are
#: constants (built with them as inputs, it builds); only with its dynamic sizes (built static, it builds).
Reproduced = Literal["alone", "only_with_constants", "only_with_dynamic_shapes"]

#: Which nodes the backend claims: op overload names (``{"aten.tanh.default"}``, as
#: ``Capabilities.supported_ops``), or a function of the node.
Claims = Collection[str] | Callable[[torch.fx.Node], bool]


@dataclasses.dataclass(frozen=True)
class NodeFailure:
    """What building one node alone raised: enough to decide between "not claimed" and "compiler broke".

    :param node: the node of the program given to `failing_nodes`.
    :param op: its op, as ``Capabilities.supported_ops`` names it (``aten.tanh.default``,
        ``higher_order.cond``).
    :param exception: the exception its one-node build raised.
    :param diagnostic: that exception's diagnostic line: the first line naming an op or giving a
        compiler's ``error:`` (``'arith.constant' op failed to verify …``), else its first line.
    :param reproduced: `Reproduced`: whether it failed alone whatever the node's weights and sizes, only
        with its weights as constants, or only with its dynamic sizes.
    """

    node: torch.fx.Node
    op: str
    exception: BaseException
    diagnostic: str
    reproduced: Reproduced = "alone"

    @property
    def text(self) -> str:
        """``"BuildError: no schedule for tanh"``: the exception's type and message; for a verdict the
        one-node build raised itself (`UnsupportedNodeError`, `CompilerError`), its reason, as the
        node's error reads when the backend builds that program on its own."""
        reason = _own_reason(self.exception)
        return reason if reason is not None else f"{type(self.exception).__name__}: {self.exception}"


class FailingNodes(list[torch.fx.Node]):
    """The nodes that fail alone, in program order: a ``list[torch.fx.Node]`` that also keeps each one's failure.

    ``failures[node]`` is its `NodeFailure`; ``errors[node]`` the text of the
    exception that building it alone raised (``"BuildError: no schedule for
    tanh"``). ``supported_ops`` is what the backend declared it claims
    (``Capabilities.supported_ops``; None: it declared no list).
    """

    def __init__(self, failures: Iterable[NodeFailure] = (), supported_ops: Collection[str] | None = None) -> None:
        found = list(failures)
        super().__init__(failure.node for failure in found)
        #: node -> what building it alone raised.
        self.failures: dict[torch.fx.Node, NodeFailure] = {f.node: f for f in found}
        #: node -> the text of its own build error.
        self.errors: dict[torch.fx.Node, str] = {f.node: f.text for f in found}
        self.supported_ops = None if supported_ops is None else frozenset(supported_ops)

    def rejections(self) -> list[tuple[torch.fx.Node, str]]:
        """``[(node, its error)]``, as ``UnsupportedNodeError(rejections=...)`` takes them."""
        return [(node, self.errors[node]) for node in self]

    def claimed(self, claims: Claims | None = None) -> list[torch.fx.Node]:
        """The failing nodes the backend claims: by ``claims`` (op names or a function of the node), else
        by its ``supported_ops``; a backend that declared no list claims every node."""
        if claims is None:
            claims = self.supported_ops
        if claims is None:
            return list(self)
        if isinstance(claims, str):
            raise TypeError(
                f"claims={claims!r} is one string; pass a collection of op overload names "
                f"(claims={{{claims!r}}}) or a function of the node"
            )
        if callable(claims):
            return [node for node in self if claims(node)]
        names = frozenset(claims)
        return [node for node in self if self.failures[node].op in names]

    def verdict(self, claims: Claims | None = None) -> CompilerError | UnsupportedNodeError | None:
        """The error ``preprocess`` raises for these nodes; None when no node fails alone.

        A claimed node that fails is a `CompilerError` naming every such node
        with its diagnostic line (a compiler failure is never hidden behind an
        unsupported node); otherwise every node is an `UnsupportedNodeError`
        rejection with its own error text.
        """
        if not self:
            return None
        claimed = self.claimed(claims)
        if claimed:
            return CompilerError(failures=[(node, self._said(node)) for node in claimed])
        return UnsupportedNodeError(rejections=self.rejections())

    def raise_verdict(self, error: BaseException, claims: Claims | None = None) -> NoReturn:
        """Raise `verdict` from ``error`` (the whole build's); with no node failing alone, ``error`` itself:
        the harness then says it cannot tell whether the backend claims the program."""
        verdict = self.verdict(claims)
        if verdict is None:
            raise error
        raise verdict from error

    def _said(self, node: torch.fx.Node) -> str:
        failure = self.failures[node]
        needs = {
            "only_with_constants": " (only with its weights as constants)",
            "only_with_dynamic_shapes": " (only with its dynamic sizes)",
        }.get(failure.reproduced, "")
        return failure.diagnostic + needs


def failing_nodes(
    program: ExportedProgram, backend: str | object, compile_spec: Mapping[str, Any] | None = None
) -> FailingNodes:
    """The nodes of ``program`` whose one-node programs ``backend`` fails to lower, in program order.

    Each ``call_function`` node of ``program`` (a ``torch.cond`` included)
    becomes a program of its own, its inputs placeholders with the node's input
    metadata, its weights the program's constants, its symbolic sizes under
    the program's range constraints; it goes through the backend's
    ``preprocess`` and, when the backend is available, its ``compile``, with
    ``compile_spec``; any exception means the node fails. A failing node is
    built again with its weights as inputs, and with static sizes, to tell
    whether it fails only so (`NodeFailure.reproduced`). The returned nodes
    are ``program``'s own: ``raise nodes.raise_verdict(exc)`` raises
    `CompilerError` for those the backend claims, `UnsupportedNodeError`
    otherwise (`FailingNodes.verdict`).

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
    from ..capabilities import capabilities_of
    from ..lowering import resolve_backend

    backend_obj, _ = resolve_backend(backend)
    spec = dict(compile_spec or {})
    supported = capabilities_of(backend_obj).supported_ops
    token = _probing.set(True)
    try:
        failures = (_failure(program, node, backend_obj, spec) for node in _candidates(program))
        return FailingNodes((f for f in failures if f is not None), supported)
    finally:
        _probing.reset(token)


def _candidates(program: ExportedProgram) -> list[torch.fx.Node]:
    return [
        n
        for n in program.graph_module.graph.nodes
        if n.op == "call_function"
        and n.target is not operator.getitem
        and isinstance(n.meta.get("val"), (torch.Tensor, tuple, list))
    ]


def _failure(
    program: ExportedProgram, node: torch.fx.Node, backend: Backend, spec: dict[str, Any]
) -> NodeFailure | None:
    """What building ``node`` alone raised, or None if it builds; a failure built again to say what it needs."""
    exception = _build(lambda: _piece(program, node), backend, spec)
    if exception is None:
        return None
    reproduced: Reproduced = "alone"
    if _has_weights(program, node) and _build(lambda: _piece(program, node, constants=False), backend, spec) is None:
        reproduced = "only_with_constants"
    elif _is_dynamic(node):
        static = _static_piece(program, node)
        if static is not None and _build(lambda: static, backend, spec) is None:
            reproduced = "only_with_dynamic_shapes"
    said = _own_reason(exception) or str(exception)
    return NodeFailure(
        node, op_overload(node), exception, diagnostic_line(said) or type(exception).__name__, reproduced
    )


def _own_reason(exception: BaseException) -> str | None:
    """The reason of a verdict the backend raised on the one-node program (its symbolicated text is the
    piece's, not the user's), else None."""
    if isinstance(exception, (UnsupportedNodeError, CompilerError)):
        reason = getattr(exception, "reason", "")
        return reason if isinstance(reason, str) and reason else None
    return None


def _piece(program: ExportedProgram, node: torch.fx.Node, *, constants: bool = True) -> ExportedProgram:
    # The metadata values stand in for the eager ones: the piece is built, never run.
    env = {n: n.meta.get("val") for n in node.all_input_nodes}
    env[node] = node.meta.get("val")
    piece, _, _ = piece_program(
        [node], env, program=program if constants else None, range_constraints=program.range_constraints
    )
    return piece


def _build(make: Callable[[], ExportedProgram], backend: Backend, spec: dict[str, Any]) -> Exception | None:
    """The exception making the piece (``make()``) and building it raised, or None if it builds."""
    try:
        piece = make()
        handles = DebugHandleRecorder().assign(piece.graph_module)
        blob = backend.preprocess(piece, dict(spec), handles)
        from ..lowering import availability

        if availability(backend):
            backend.compile({"forward": blob}, {"forward": dict(spec)})
    except Exception as exc:
        return exc
    return None


def _has_weights(program: ExportedProgram, node: torch.fx.Node) -> bool:
    weights = {s.arg.name for s in program.graph_signature.input_specs if s.kind.name != "USER_INPUT"}
    return any(n.op == "placeholder" and n.name in weights for n in node.all_input_nodes)


def _is_dynamic(node: torch.fx.Node) -> bool:
    values = [n.meta.get("val") for n in (node, *node.all_input_nodes)]
    tensors = [v for value in values for v in _compat.tree_leaves(value) if isinstance(v, torch.Tensor)]
    return any(not isinstance(size, int) for t in tensors for size in t.shape)


def _static_piece(program: ExportedProgram, node: torch.fx.Node) -> ExportedProgram | None:
    """The node's piece exported again on inputs of the example's sizes (its sizes static); None when it
    cannot be (the harness then cannot say that the failure needs dynamic sizes)."""
    piece = _piece(program, node)
    try:
        inputs = []
        for spec in piece.graph_signature.input_specs:
            if spec.kind.name != "USER_INPUT":
                continue
            value = next(n for n in piece.graph.nodes if n.name == spec.arg.name).meta["val"]
            inputs.append(torch.zeros([_hint(size) for size in value.shape], dtype=value.dtype))
        return torch.export.export(piece.module(), tuple(inputs))
    except Exception:
        return None


def _hint(size: int | torch.SymInt) -> int:
    if isinstance(size, int):
        return size
    hint = size.node.hint
    return int(hint if hint is not None else size.node.shape_env.size_hint(size.node.expr))
