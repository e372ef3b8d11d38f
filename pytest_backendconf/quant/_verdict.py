"""The quantized verdict: a backend's outputs against eager PyTorch running the same Q/DQ program.

Errors are stated in quantization steps of each output: the scale of the
``dequantize`` that produces it (an output no dequantize produces, such as
a dynamic scheme's float linear, gets the step int8 would have over the
reference output's range, ``(max - min) / 255``). A backend that requantizes
with another legitimate tie rule, or through a fixed-point multiplier,
lands on a neighbouring step now and then; one that truncates, drops a
zero point or scales the wrong axis is off by a step or more on a large
share of elements, or by many steps. `QuantizedRule` bounds both. The
SQNR of the backend and of the reference against the float model is
stated beside them: how much the quantization itself costs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

_DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
#: int8's levels: the implied step of an output that no dequantize produces.
_LEVELS = 255


@dataclasses.dataclass(frozen=True)
class QuantizedRule:
    """How far from the reference a quantized output may be: legitimate rounding, no more."""

    #: The largest error in steps (a tie broken the other way is one step; carried through a later op, two).
    max_steps: float = 2.0
    #: The largest share of elements off by one step or more (ties and multiplier rounding are rare).
    max_share: float = 0.05

    def text(self) -> str:
        return f"at most {self.max_steps:g} steps, at most {self.max_share:.0%} of elements off by a step or more"


@dataclasses.dataclass(frozen=True)
class QuantizedOutput:
    """One output judged: its step and where it comes from, the errors in steps, both SQNRs."""

    index: int
    step: float
    step_from: str
    max_steps: float
    mean_steps: float
    share_off: float
    sqnr_backend: float
    sqnr_reference: float
    passed: bool
    #: Set when the output is not a float tensor of the reference's shape and dtype (then not judged in steps).
    mismatch: str = ""

    def text(self) -> str:
        if self.mismatch:
            return f"output {self.index}: {self.mismatch}"
        return (
            f"output {self.index}: max {self.max_steps:.3g} steps, mean {self.mean_steps:.3g} steps, "
            f"{self.share_off:.1%} of elements off by >= 1 step (step {self.step:.4g}, {self.step_from}); "
            f"SQNR against the float model: backend {_db(self.sqnr_backend)}, reference {_db(self.sqnr_reference)}"
        )

    def json(self) -> dict[str, Any]:
        return {
            k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
            for k, v in dataclasses.asdict(self).items()
        }


def _db(value: float) -> str:
    return "exact" if value == math.inf else f"{value:.1f} dB"


def sqnr_db(signal: torch.Tensor, approximation: torch.Tensor) -> float:
    """``10 log10(|signal|² / |signal - approximation|²)`` in float64; inf when they are equal."""
    s = signal.detach().double()
    noise = (s - approximation.detach().double()).pow(2).sum().item()
    power = s.pow(2).sum().item()
    if noise == 0:
        return math.inf
    if power == 0:
        return -math.inf
    return 10 * math.log10(power / noise)


def output_steps(program: Any) -> list[tuple[float | None, str]]:
    """Per user output of a Q/DQ program: the scale of the dequantize producing it (None: none does), and its name."""
    from torch.export.graph_signature import OutputKind

    output = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    values = list(output.args[0])
    found: list[tuple[float | None, str]] = []
    for spec, node in zip(program.graph_signature.output_specs, values):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        target = str(getattr(node, "target", ""))
        scale = node.args[1] if target == _DEQUANTIZE else None
        if isinstance(scale, float):
            found.append((scale, f"the scale of {node.name!r}"))
        else:
            found.append((None, "no dequantize produces it: int8's step over the reference output's range"))
    return found


def judge_quantized(
    actual: list,
    reference: list,
    float_outputs: list,
    steps: list[tuple[float | None, str]],
    rule: QuantizedRule,
) -> list[QuantizedOutput]:
    """Each flat output of the backend against the reference's (same Q/DQ program, eager), in steps."""
    judged = []
    for index, want in enumerate(reference):
        got = actual[index] if index < len(actual) else None
        wide = float_outputs[index] if index < len(float_outputs) else want
        step, step_from = steps[index] if index < len(steps) else (None, "")
        if not isinstance(want, torch.Tensor) or not want.is_floating_point():
            same = isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want)
            judged.append(
                _mismatch(
                    index,
                    "" if same else f"{_describe(got)}, the reference gives {_describe(want)} (compared exactly)",
                    passed=same,
                )
            )
            continue
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            judged.append(
                _mismatch(index, f"the backend gives {_describe(got)}, the reference {_describe(want)}", passed=False)
            )
            continue
        if step is None:
            span = (want.max() - want.min()).item() if want.numel() else 0.0
            step = span / _LEVELS if span > 0 else 1.0
        error = (got.double() - want.double()).abs() / step
        error = torch.where(torch.isnan(error), torch.full_like(error, math.inf), error)
        if torch.isnan(got).equal(torch.isnan(want)):
            error = torch.where(torch.isnan(want), torch.zeros_like(error), error)
        # A hair under one step still counts as one: float rounding of the step itself.
        off = (error >= 1 - 1e-6).double().mean().item() if error.numel() else 0.0
        most = error.max().item() if error.numel() else 0.0
        mean = error.mean().item() if error.numel() else 0.0
        passed = most <= rule.max_steps + 1e-6 and off <= rule.max_share
        judged.append(
            QuantizedOutput(
                index,
                step,
                step_from,
                most,
                mean,
                off,
                sqnr_db(wide, got),
                sqnr_db(wide, want),
                passed,
            )
        )
    return judged


def _mismatch(index: int, text: str, *, passed: bool) -> QuantizedOutput:
    return QuantizedOutput(index, 0.0, "", 0.0, 0.0, 0.0, math.nan, math.nan, passed, mismatch=text or "equal")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]
