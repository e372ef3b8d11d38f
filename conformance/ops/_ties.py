"""Index outputs of ops that leave the order of ties open: checked for validity, not equality.

``sort`` with ``stable=False``, ``topk``, ``max.dim``/``min.dim``,
``argmax``/``argmin``, ``kthvalue``, ``mode`` and ``median.dim`` may return
the index of any of several equal values: PyTorch does not say which, and
engines differ. Such an index output is valid when every index is in range
along the reduced dimension, the values it selects from the input equal the
values eager's indices select (NaN equal to NaN), and, for ``sort`` and
``topk``, no index is repeated along the dimension. A valid output counts
as exact; an invalid one fails the check with the first wrong index.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .discovery import OpSample, decode_arg, decode_arg_dict


@dataclasses.dataclass(frozen=True)
class TieRule:
    """Where an overload's index output is and how to read its dimension from the call."""

    index_output: int  #: position of the indices in the op's result
    dim_at: int | None  #: positional argument of ``dim`` (``None``: keyword only)
    dim_default: int | None  #: ``None``: the whole input flattened (argmax without dim)
    keepdim_at: int | None  #: positional argument of ``keepdim`` (``None``: the output keeps the dim)
    distinct: bool  #: indices along the dim are a selection without repeats (sort, topk)


RULES = {
    "aten.sort.default": TieRule(1, 1, -1, None, True),
    "aten.sort.stable": TieRule(1, None, -1, None, True),
    "aten.topk.default": TieRule(1, 2, -1, None, True),
    "aten.max.dim": TieRule(1, 1, 0, 2, False),
    "aten.min.dim": TieRule(1, 1, 0, 2, False),
    "aten.argmax.default": TieRule(0, 1, None, 2, False),
    "aten.argmin.default": TieRule(0, 1, None, 2, False),
    "aten.kthvalue.default": TieRule(1, 2, -1, 3, False),
    "aten.mode.default": TieRule(1, 1, -1, 2, False),
    "aten.median.dim": TieRule(1, 1, 0, 2, False),
    "aten.nanmedian.dim": TieRule(1, 1, 0, 2, False),
}


class InvalidIndices(Exception):
    """The backend's index output selects other values than eager's, or is out of range."""


def rule_for(sample: OpSample) -> TieRule | None:
    rule = RULES.get(sample.overload)
    if rule is None:
        return None
    if sample.overload == "aten.sort.stable" and decode_arg_dict(sample.kwargs, sample.inputs).get("stable"):
        return None  # a stable sort fixes the order of ties: its indices must be exact
    return rule


def settle_ties(sample: OpSample, actual: list[Any], expected: list[Any]) -> tuple[list[Any], list[int]]:
    """``actual`` with each valid tie-open index output replaced by eager's, and the outputs so settled.

    Raises `InvalidIndices` naming the first wrong index.
    """
    rule = rule_for(sample)
    if rule is None:
        return actual, []
    if sample.outputs is None:
        if rule.index_output != 0:
            return actual, []
        at = 0
    elif rule.index_output in sample.outputs:
        at = sample.outputs.index(rule.index_output)
    else:
        return actual, []
    mine, theirs = actual[at], expected[at]
    if not isinstance(mine, torch.Tensor) or mine.shape != theirs.shape or mine.dtype != theirs.dtype:
        return actual, []  # a structure mismatch: the comparison reports it
    args = decode_arg(sample.args, sample.inputs)
    kwargs = decode_arg_dict(sample.kwargs, sample.inputs)
    source = args[0]
    dim = kwargs.get(
        "dim", args[rule.dim_at] if rule.dim_at is not None and len(args) > rule.dim_at else rule.dim_default
    )
    keepdim = rule.keepdim_at is None or bool(
        kwargs.get("keepdim", args[rule.keepdim_at] if len(args) > rule.keepdim_at else False)  # type: ignore[operator]
    )
    _check(source, mine, theirs, dim, keepdim, rule.distinct, at)
    settled = list(actual)
    settled[at] = theirs.clone()
    return settled, [at]


def _check(
    source: torch.Tensor, mine: torch.Tensor, theirs: torch.Tensor, dim: Any, keepdim: bool, distinct: bool, at: int
) -> None:
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
    size = source.shape[dim]
    outside = (mine < 0) | (mine >= size)
    if outside.any():
        where = [int(i) for i in outside.nonzero()[0]]
        raise InvalidIndices(
            f"output {at} (indices) at {where}: index {int(mine[tuple(where)])} is out of range "
            f"for dimension {dim} of size {size}"
        )
    picked, wanted = source.gather(dim, mine), source.gather(dim, theirs)
    differs = ~((picked == wanted) | (picked.isnan() & wanted.isnan()))
    if differs.any():
        where = [int(i) for i in differs.nonzero()[0]]
        raise InvalidIndices(
            f"output {at} (indices) at {where}: index {int(mine[tuple(where)])} selects {float(picked[tuple(where)]):.6g} "
            f"where eager's index {int(theirs[tuple(where)])} selects {float(wanted[tuple(where)]):.6g} "
            "(ties may be broken either way, other values may not)"
        )
    if distinct:
        ordered = mine.sort(dim=dim).values
        n = ordered.shape[dim]
        if n > 1 and (ordered.narrow(dim, 1, n - 1) == ordered.narrow(dim, 0, n - 1)).any():
            raise InvalidIndices(f"output {at} (indices): an index repeats along dimension {dim}")
