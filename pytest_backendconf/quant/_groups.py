"""Verdicts of LLM-quantized outputs: per token for run-time quantization, per group for weights.

A dynamic-activation (8da4w) output is judged token by token: each token's
activations have a scale of their own, so each row of an output is judged
with `judge_quantized` in steps of int8 over that row's range, a whole
output's worth of tokens never averaging away one token quantized with the
wrong scale (per tensor where it must be per token).

`judge_weights` judges one linear layer's weights as the backend runs them,
read back through unit inputs (row ``k`` of the identity gives column ``k``
of the weight): each element's error in steps of the scale of its own group,
the first row and group off, how many groups are, and, where the error has
the shape of a known defect (int4 nibbles swapped, a zero point ignored, the
group size or a group boundary wrong), that defect.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch

from ._verdict import QuantizedOutput, QuantizedRule, judge_quantized

#: A weight element at least this many steps of its group's scale off is off: rounding of a float
#: dequantization is a millionth of a step; a wrong integer, scale or zero point is a step or more.
OFF_STEPS = 0.5
_PER_TOKEN = "int8's step over the token's reference output range"


@dataclasses.dataclass(frozen=True)
class TokenVerdict:
    """One token of one output of run-time quantization, judged alone."""

    output: int
    token: int
    judged: QuantizedOutput

    def text(self) -> str:
        line = self.judged.text()
        return line.replace(f"output {self.judged.index}:", f"output {self.output}, token {self.token}:", 1)


def judge_tokens(actual: list, reference: list, floats: list, rule: QuantizedRule) -> list[TokenVerdict]:
    """Every token (row over the last dim) of every float output, judged alone in its own steps."""
    verdicts: list[TokenVerdict] = []
    for index, want in enumerate(reference):
        got = actual[index] if index < len(actual) else None
        wide = floats[index] if index < len(floats) else want
        if not (isinstance(want, torch.Tensor) and want.is_floating_point() and want.dim() >= 1):
            verdicts += [TokenVerdict(index, 0, j) for j in judge_quantized([got], [want], [wide], [(None, "")], rule)]
            continue
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            verdicts += [TokenVerdict(index, 0, j) for j in judge_quantized([got], [want], [wide], [(None, "")], rule)]
            continue
        rows = want.reshape(-1, want.shape[-1])
        judged = judge_quantized(
            list(got.reshape(-1, want.shape[-1])),
            list(rows),
            list(wide.reshape(-1, want.shape[-1])),
            [(None, _PER_TOKEN, True)] * rows.shape[0],
            rule,
        )
        verdicts += [TokenVerdict(index, token, j) for token, j in enumerate(judged)]
    return verdicts


def close_per_token(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """Which elements are within float tolerance of the reference, the absolute part scaled per token.

    ``|got - want| <= rtol * |want| + atol * max(1, max |want|)`` with the max over the element's token
    (its row over the last dim): a linear layer's output is a dot product whose rounding error grows with
    the size of its terms, which a token's largest output stands for; a token 30 times larger than
    another, summed in another order (a legitimate kernel), is off by 30 times more.
    """
    if want.dim() == 0 or want.numel() == 0:
        return torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    largest = want.abs().amax(dim=-1, keepdim=True).clamp(min=1.0)
    error = (got.double() - want.double()).abs()
    close = error <= rtol * want.double().abs() + atol * largest.double()
    return close | (torch.isnan(got) & torch.isnan(want))


@dataclasses.dataclass(frozen=True)
class WeightParts:
    """A quantized linear layer's weight as torchao holds it: integers, a scale and zero point per group."""

    qdata: torch.Tensor  # (out_features, in_features), int8 (int4 values unpacked, one per byte)
    scale: torch.Tensor  # (out_features, groups)
    zero_point: torch.Tensor | None  # (out_features, groups) or None
    group: int  # columns per group (in_features: one scale per row)
    bits: int

    def dequantized(self, column_group: Callable[[torch.Tensor], torch.Tensor] | None = None, *, zero: bool = True):
        """``(q - zero_point) * scale`` with each column's group given by ``column_group`` (default ``k // group``)."""
        columns = torch.arange(self.qdata.shape[1])
        index = (columns // self.group) if column_group is None else column_group(columns)
        scale = self.scale.reshape(self.qdata.shape[0], -1).double()[:, index]
        centered = self.qdata.double()
        if zero and self.zero_point is not None:
            centered = centered - self.zero_point.reshape(self.qdata.shape[0], -1).double()[:, index]
        return centered * scale

    def steps(self) -> torch.Tensor:
        """Each weight element's step: the scale of its group."""
        index = torch.arange(self.qdata.shape[1]) // self.group
        return self.scale.reshape(self.qdata.shape[0], -1).double()[:, index]


@dataclasses.dataclass(frozen=True)
class WeightVerdict:
    """One layer's weights as the backend runs them, against eager's."""

    layer: str
    row: int
    group: int
    columns: tuple[int, int]
    max_steps: float
    first_steps: float
    first_scale: float
    groups_off: int
    groups: int
    defect: str

    def text(self) -> str:
        first, last = self.columns
        return (
            f"layer {self.layer!r}: its weights, read back through unit inputs, are off in {self.groups_off} of "
            f"{self.groups} groups, by up to {self.max_steps:.3g} steps of their group's scale; first at row "
            f"{self.row}, group {self.group} (columns {first}-{last}): {self.first_steps:.3g} steps of its scale "
            f"{self.first_scale:.4g}" + (f"; {self.defect}" if self.defect else "")
        )

    def json(self) -> dict:
        return dataclasses.asdict(self)


def judge_weights(layer: str, got: torch.Tensor, want: torch.Tensor, parts: WeightParts) -> WeightVerdict | None:
    """``got`` (the backend's weight, read back) against ``want`` (eager's), in steps of each group's scale.

    None when no element is `OFF_STEPS` or more off.
    """
    step = parts.steps()
    error = (got.double() - want.double()).abs() / step
    error = torch.where(torch.isnan(error), torch.full_like(error, float("inf")), error)
    off = error >= OFF_STEPS
    if not bool(off.any()):
        return None
    rows, columns = off.shape
    per_group = off.reshape(rows, -1, parts.group).any(dim=-1) if columns % parts.group == 0 else off
    row, group = (int(i) for i in torch.nonzero(per_group)[0])
    first = error[row, group * parts.group : (group + 1) * parts.group]
    return WeightVerdict(
        layer=layer,
        row=row,
        group=group,
        columns=(group * parts.group, min((group + 1) * parts.group, columns) - 1),
        max_steps=float(error.max()),
        first_steps=float(first.max()),
        first_scale=float(step[row, group * parts.group]),
        groups_off=int(per_group.sum()),
        groups=per_group.numel(),
        defect=_defect(got.double(), want.double(), parts),
    )


def _groups_of(columns: torch.Tensor, *, size: int) -> torch.Tensor:
    return columns // size


def _shifted(columns: torch.Tensor, *, shift: int, size: int, groups: int) -> torch.Tensor:
    return torch.clamp((columns + shift) // size, 0, groups - 1)


def _defect(got: torch.Tensor, want: torch.Tensor, parts: WeightParts) -> str:
    """The known defect whose weights ``got`` are, if one is (each candidate recomputed from the integers)."""
    step = parts.steps()
    groups = parts.scale.reshape(parts.qdata.shape[0], -1).shape[1]

    def matches(candidate: torch.Tensor) -> bool:
        return bool(((got - candidate).abs() / step < OFF_STEPS).all())

    columns = parts.qdata.shape[1]
    if columns % 2 == 0:
        swapped = want[:, torch.arange(columns) ^ 1]
        if matches(swapped):
            return (
                "each value sits in its neighbour's column (columns swapped in pairs): int4 nibbles unpacked in "
                "the wrong order"
                if parts.bits == 4
                else "each value sits in its neighbour's column (columns swapped in pairs)"
            )
    if parts.zero_point is not None and bool((parts.zero_point != 0).any()) and matches(parts.dequantized(zero=False)):
        return "the values are (q) * scale: the zero point is ignored"
    if groups > 1:
        for other in (parts.group * 2, parts.group // 2, parts.group + 1, parts.group - 1):
            if other <= 0 or other == parts.group or (columns - 1) // other >= groups:
                continue
            if matches(parts.dequantized(functools.partial(_groups_of, size=other))):
                return f"the scales are applied to groups of {other} columns; the groups are {parts.group} wide"
        for shift, where in (
            (1, "early: column {0} takes group 1's scale"),
            (-1, "late: column {1} takes group 0's scale"),
        ):
            candidate = parts.dequantized(functools.partial(_shifted, shift=shift, size=parts.group, groups=groups))
            if matches(candidate):
                return "every group boundary is one column " + where.format(parts.group - 1, parts.group)
    ratio = got / torch.where(want == 0, torch.ones_like(want), want)
    nonzero = want != 0
    if bool(nonzero.any()):
        values = ratio[nonzero]
        if float(values.max() - values.min()) < 1e-3 * float(values.abs().max()) and abs(float(values[0]) - 1) > 1e-3:
            return f"every value is {float(values[0]):.4g} times eager's: a wrong scale"
    return ""
