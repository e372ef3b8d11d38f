"""Index outputs whose ties PyTorch leaves open: judged valid or not, never compared exactly.

``sort`` with ``stable=False``, ``topk``, ``max.dim``/``min.dim``,
``argmax``/``argmin``, ``kthvalue``, ``mode`` and ``median.dim`` may return
the index of any of several equal values: PyTorch does not say which, and
engines differ. Such an index output is valid when every index is in range
along the reduced dimension, the values it selects from the op's input
equal the values eager's indices select (NaN equal to NaN), and, for
``sort`` and ``topk``, no index repeats along the dimension. A valid output
is *settled*: replaced by the reference it is compared with, so that the
comparison counts it exact; an invalid one raises `InvalidIndices` naming
the first wrong index.

Which outputs are such indices: for one op call (the ops category), the
overload and its arguments (`tie_open_call`); for a whole program (parity,
delegation), the graph (`settle_program_ties`): a user output that *is* the
index result of one of these calls, directly or as an item of its tuple. An
output computed from indices (``idx + 1``, a reshape) is an ordinary output.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING, Mapping, Sequence, SupportsInt, cast

import torch

from .. import _compat

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclasses.dataclass(frozen=True)
class _Rule:
    """Where an overload's index output is and where its ``dim``/``keepdim`` arguments are."""

    index_output: int  #: position of the indices in the op's result
    dim_at: int | None  #: positional argument of ``dim`` (``None``: keyword only)
    dim_default: int | None  #: ``None``: the whole input flattened (argmax without dim)
    keepdim_at: int | None  #: positional argument of ``keepdim`` (``None``: the output keeps the dim)
    distinct: bool  #: indices along the dim are a selection without repeats (sort, topk)


_RULES = {
    "aten.sort.default": _Rule(1, 1, -1, None, True),
    "aten.sort.stable": _Rule(1, None, -1, None, True),
    "aten.topk.default": _Rule(1, 2, -1, None, True),
    "aten.max.dim": _Rule(1, 1, 0, 2, False),
    "aten.min.dim": _Rule(1, 1, 0, 2, False),
    "aten.argmax.default": _Rule(0, 1, None, 2, False),
    "aten.argmin.default": _Rule(0, 1, None, 2, False),
    "aten.kthvalue.default": _Rule(1, 2, -1, 3, False),
    "aten.mode.default": _Rule(1, 1, -1, 2, False),
    "aten.median.dim": _Rule(1, 1, 0, 2, False),
    "aten.nanmedian.dim": _Rule(1, 1, 0, 2, False),
}


@dataclasses.dataclass(frozen=True)
class IndexCall:
    """One call of a tie-open overload: which item of its result is indices, and along what."""

    overload: str  #: ``aten.topk.default``
    output: int  #: the position of the indices in the op's result (0 for a single tensor)
    dim: int | None  #: the dimension the indices run along (``None``: the input flattened)
    keepdim: bool  #: the indices keep the reduced dimension (size 1, or k for sort/topk)
    distinct: bool  #: no index repeats along ``dim`` (sort, topk)


def tie_open_call(overload: str, args: Sequence[object], kwargs: Mapping[str, object]) -> IndexCall | None:
    """The `IndexCall` of ``overload`` called with ``args``/``kwargs``, or ``None`` if its ties are fixed.

    ``args[0]`` is the input the indices select from and is not read: it may
    be a graph node. A stable sort fixes the order of ties: its indices must
    be exact, so it has none.
    """
    rule = _RULES.get(overload)
    if rule is None or kwargs.get("stable"):
        return None
    dim = kwargs.get(
        "dim", args[rule.dim_at] if rule.dim_at is not None and len(args) > rule.dim_at else rule.dim_default
    )
    keepdim = rule.keepdim_at is None or bool(
        kwargs.get("keepdim", args[rule.keepdim_at] if len(args) > rule.keepdim_at else False)
    )
    # The op's schema makes ``dim`` an int.
    index_dim = None if dim is None else int(cast("SupportsInt", dim))
    return IndexCall(overload, rule.index_output, index_dim, keepdim, rule.distinct)


class InvalidIndices(Exception):
    """A backend's index output selects other values than eager's, is out of range, or repeats an index."""


@dataclasses.dataclass(frozen=True)
class TieOpen:
    """An index output to judge: the call, the input its indices select from, and eager's indices into it."""

    call: IndexCall
    source: torch.Tensor
    indices: torch.Tensor


def settle_ties(
    actual: Sequence[object], reference: Sequence[object], tie_open: Mapping[int, TieOpen]
) -> tuple[list[object], list[int]]:
    """``actual`` with each valid tie-open index output replaced by ``reference``'s, and the outputs so settled.

    ``tie_open`` maps a position in the flat outputs to what judges it. An
    output equal to the reference, or with another structure (the comparison
    reports that), is left alone. Raises `InvalidIndices` naming the first
    wrong index.
    """
    settled = list(actual)
    done = []
    for at, judged in sorted(tie_open.items()):
        mine, theirs = actual[at], reference[at]
        if not (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)):
            continue  # as _comparable says
        if not _comparable(mine, theirs) or torch.equal(mine, theirs):
            continue
        if mine.shape != judged.indices.shape:
            continue  # not the shape of eager's own indices: the comparison reports it
        _check(judged, mine, at)
        settled[at] = theirs.clone()
        done.append(at)
    return settled, done


def _differ(mine: object, theirs: object) -> bool:
    """Two `_comparable` tensors, not equal."""
    return (
        isinstance(mine, torch.Tensor)
        and isinstance(theirs, torch.Tensor)
        and _comparable(mine, theirs)
        and not torch.equal(mine, theirs)
    )


def _comparable(mine: object, theirs: object) -> bool:
    return (
        isinstance(mine, torch.Tensor)
        and isinstance(theirs, torch.Tensor)
        and mine.shape == theirs.shape
        and mine.dtype == theirs.dtype
        and not mine.is_floating_point()
    )


def _check(judged: TieOpen, mine: torch.Tensor, at: int) -> None:
    source, theirs = judged.source, judged.indices
    dim, keepdim = judged.call.dim, judged.call.keepdim
    if dim is None:  # over the whole input flattened
        source, dim, keepdim = source.reshape(-1), 0, False
        mine, theirs = mine.reshape(()), theirs.reshape(())
    if source.dim() == 0:
        source, dim = source.reshape(1), 0
        mine, theirs = mine.reshape(1), theirs.reshape(1)
        keepdim = True
    dim = dim % source.dim()
    if not keepdim:
        mine, theirs = mine.unsqueeze(dim), theirs.unsqueeze(dim)
    mine, theirs = mine.to(torch.int64), theirs.to(torch.int64)
    size = source.shape[dim]
    outside = (mine < 0) | (mine >= size)
    if outside.any():
        where = [int(i) for i in outside.nonzero()[0]]
        raise InvalidIndices(
            f"output {at} (indices of {judged.call.overload}) at {where}: index {int(mine[tuple(where)])} "
            f"is out of range for dimension {dim} of size {size}"
        )
    picked, wanted = source.gather(dim, mine), source.gather(dim, theirs)
    differs = ~((picked == wanted) | (picked.isnan() & wanted.isnan()))
    if differs.any():
        where = [int(i) for i in differs.nonzero()[0]]
        raise InvalidIndices(
            f"output {at} (indices of {judged.call.overload}) at {where}: index {int(mine[tuple(where)])} "
            f"selects {float(picked[tuple(where)]):.6g} where eager's index {int(theirs[tuple(where)])} "
            f"selects {float(wanted[tuple(where)]):.6g} (ties may be broken either way, other values may not)"
        )
    if judged.call.distinct:
        ordered = mine.sort(dim=dim).values
        n = ordered.shape[dim]
        if n > 1 and (ordered.narrow(dim, 1, n - 1) == ordered.narrow(dim, 0, n - 1)).any():
            raise InvalidIndices(
                f"output {at} (indices of {judged.call.overload}): an index repeats along dimension {dim}"
            )


def tie_open_outputs(program: ExportedProgram) -> dict[int, tuple[torch.fx.Node, IndexCall]]:
    """The user outputs of an exported program that are tie-open indices: position -> (producer node, call).

    An output counts when it is the index result of a tie-open call itself
    (``argmax``) or the item of that call's tuple that holds the indices
    (``getitem(topk, 1)``).
    """
    from torch.export.graph_signature import OutputKind

    graph = program.graph_module.graph
    outputs = next(n for n in reversed(graph.nodes) if n.op == "output").args[0]
    specs = program.graph_signature.output_specs
    user = [value for value, spec in zip(outputs, specs) if spec.kind == OutputKind.USER_OUTPUT]
    found = {}
    for position, node in enumerate(user):
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            continue
        producer, item = node, None  # None: the call's result itself
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            producer, item = node.args[0], node.args[1]
        if producer.op != "call_function" or not _compat.is_op_overload(producer.target):
            continue
        call = tie_open_call(str(producer.target), producer.args, producer.kwargs)
        if call is not None and call.output == (0 if item is None else item):
            found[position] = (producer, call)
    return found


def settle_program_ties(
    program: ExportedProgram, user_inputs: Sequence[object], actual: list[object], reference: list[object]
) -> tuple[list[object], list[int]]:
    """`settle_ties` for the flat user outputs of an exported program run on ``user_inputs`` (flat too).

    Only when a tie-open output differs from the reference does the program
    run (eager, node by node) to get what each one selects from and eager's
    own indices into it.
    """
    found = tie_open_outputs(program)
    open_ = [at for at in found if at < min(len(actual), len(reference)) and _differ(actual[at], reference[at])]
    if not open_:
        return actual, []
    values = _eager_values(program, user_inputs, {found[at][0] for at in open_})
    tie_open = {}
    for at in open_:
        producer, call = found[at]
        source, result = values[producer]
        indices = result[call.output] if isinstance(result, (tuple, list)) else result
        tie_open[at] = TieOpen(call, source, cast(torch.Tensor, indices))  # a tie-open call's indices: a tensor
    return settle_ties(actual, reference, tie_open)


class _Recorder(torch.fx.Interpreter):
    """Runs the graph and keeps, for the wanted nodes, their first argument's value and their result."""

    def __init__(self, module: torch.fx.GraphModule, wanted: set[torch.fx.Node]) -> None:
        super().__init__(module)
        self.wanted = wanted
        self.values: dict[torch.fx.Node, tuple[torch.Tensor, object]] = {}

    def run_node(self, n: torch.fx.Node) -> object:
        value = super().run_node(n)
        if n in self.wanted:
            self.values[n] = (self.env[n.args[0]], value)  # type: ignore[index]
        return value


def _eager_values(
    program: ExportedProgram, user_inputs: Sequence[object], wanted: set[torch.fx.Node]
) -> dict[torch.fx.Node, tuple[torch.Tensor, object]]:
    recorder = _Recorder(program.graph_module, wanted)
    with torch.no_grad():
        recorder.run(*_compat.graph_arguments(program, user_inputs))
    return recorder.values
