"""The quantized verdict: a backend's outputs against eager PyTorch running the same Q/DQ program.

Errors are stated in quantization steps of each output: the scale of the
``dequantize`` that produces it (an output no dequantize produces, such as
a dynamic scheme's float linear, gets the step int8 would have over the
reference output's range, ``(max - min) / 255``). A backend that requantizes
with another legitimate tie rule, or through a fixed-point multiplier,
lands on a neighbouring step now and then; one that truncates, drops a
zero point or scales the wrong axis is off by a step or more on a large
share of elements, or by many steps. `QuantizedRule` bounds both, the
share rounded up to whole elements (a 12-element output has no 5% to
spare otherwise: one element is 8.3%; a 24-element one may have two). The
SQNR of the backend and of the reference against the float model is
stated beside them: how much the quantization itself costs.

An output no dequantize produces may pass by that SQNR instead: it has no
grid of steps of its own. Its implied step says nothing of the
quantization upstream (one step of a linear layer's output scale, through
a ``tanh``, is two implied steps of the ``tanh``'s narrower range), and an
output of run-time (dynamic) quantization comes from parameters chosen per
call (``choose_qparams``): a backend that chooses them another legitimate
way (per row, from its own reduction) is a step or two off the
reference's values on many elements while no worse against the float
model. Such an output passes within the steps rule, or with an SQNR
against the float model at most ``sqnr_margin_db`` below the reference's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Sequence

import torch

if TYPE_CHECKING:
    from torch.export import ExportedProgram

#: The op whose second argument is the scale of the quantized value it turns back into floats.
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
#: Ops whose result is a quantization's run-time parameters (the dynamic schemes' ``choose_qparams``,
#: ``choose_qparams_per_token_asymmetric`` ...): the report says which float outputs come from one.
RUNTIME_QPARAMS = "choose_qparams"
#: int8's levels: the implied step of an output that no dequantize produces.
_LEVELS = 255


@dataclasses.dataclass(frozen=True)
class QuantizedRule:
    """How far from the reference a quantized output may be: legitimate rounding, no more."""

    #: The largest error in steps (a tie broken the other way is one step; carried through a later op, two).
    max_steps: float = 2.0
    #: The largest share of elements off by one step or more (ties and multiplier rounding are rare);
    #: rounded up to whole elements, so one is always allowed (one of 12 is 8.3%).
    max_share: float = 0.10
    #: An output of run-time quantization off the steps rule still passes when its SQNR against the float
    #: model is at most this far (dB) below the reference's: 3 dB is twice the reference's noise power, half
    #: a bit of int8's 8 (6.02 dB a bit).
    sqnr_margin_db: float = 3.0

    def allowed_off(self, numel: int) -> int:
        """How many of ``numel`` elements may be off by a step or more: ``max_share`` of them, rounded up.

        A share of a few elements is all or nothing: legitimate rounding that moves one element in twenty
        moves one or two of 24 as often as not, and a defect moves a large share (truncation, half of them).
        """
        return max(1, math.ceil(self.max_share * numel - 1e-9))

    def text(self, float_output: bool = False) -> str:
        """The rule, as a failure states it (``float_output``: for outputs no dequantize produces)."""
        steps = (
            f"at most {self.max_steps:g} steps, at most {self.max_share:.0%} of elements "
            "(rounded up) off by a step or more"
        )
        if float_output:
            return (
                f"{steps}, or, for an output no dequantize produces (a float output, as run-time quantization "
                f"gives), an SQNR against the float model at most {self.sqnr_margin_db:g} dB below the reference's"
            )
        return steps


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
    #: Whether the output comes from run-time quantization (a ``choose_qparams`` upstream).
    runtime: bool = False
    #: Whether no dequantize produces it (its step is implied): it may pass by its SQNR.
    float_output: bool = False

    @property
    def by_sqnr(self) -> bool:
        """Whether the SQNR against the float model may pass it off the steps rule."""
        return self.float_output and not self.mismatch

    def text(self) -> str:
        if self.mismatch:
            return f"output {self.index}: {self.mismatch}"
        sqnr = f"SQNR against the float model: backend {_db(self.sqnr_backend)}, reference {_db(self.sqnr_reference)}"
        steps = (
            f"max {self.max_steps:.3g} steps, mean {self.mean_steps:.3g} steps, "
            f"{self.share_off:.1%} of elements off by >= 1 step (step {self.step:.4g}, {self.step_from})"
        )
        if self.float_output:
            below = self.sqnr_reference - self.sqnr_backend
            gap = f"{below:.1f} dB below, " if math.isfinite(below) and below > 0 else ""
            kind = "quantized at run time" if self.runtime else "a float output"
            return f"output {self.index}: {steps}; {sqnr} ({gap}{kind})"
        return f"output {self.index}: {steps}; {sqnr}"

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


#: How far from a whole number of steps a difference may be and still count as it (float32 rounding).
_STEP_SLACK = 1e-3


def output_steps(program: ExportedProgram) -> list[tuple[float | None, str, bool]]:
    """Per user output of a Q/DQ program: the scale of the dequantize producing it (None: none does), its
    name, and whether the output comes from run-time quantization (a ``choose_qparams`` upstream, and no
    dequantize with a fixed scale producing it)."""
    from torch.export.graph_signature import OutputKind

    output = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    values = list(output.args[0])
    found: list[tuple[float | None, str, bool]] = []
    for spec, node in zip(program.graph_signature.output_specs, values):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        target = str(getattr(node, "target", ""))
        scale = node.args[1] if target == DEQUANTIZE else None
        if isinstance(scale, float):
            found.append((scale, f"the scale of {node.name!r}", False))
        else:
            found.append(
                (
                    None,
                    "no dequantize produces it: int8's step over the reference output's range",
                    runtime_quantized(node),
                )
            )
    return found


def runtime_quantized(node: object) -> bool:
    """Whether a node's value depends on quantization parameters chosen at run time (``choose_qparams``)."""
    seen: set[torch.fx.Node] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if not isinstance(current, torch.fx.Node) or current in seen:
            continue
        seen.add(current)
        if current.op == "call_function" and RUNTIME_QPARAMS in str(current.target):
            return True
        pending.extend(current.all_input_nodes)
    return False


def implied_step(reference: torch.Tensor) -> float:
    """The step of an output no dequantize produces: int8's step over the reference output's range."""
    span = (reference.max() - reference.min()).item() if reference.numel() else 0.0
    return span / _LEVELS if span > 0 else 1.0


def errors_in_steps(got: torch.Tensor, want: torch.Tensor, step: float) -> torch.Tensor:
    """``|got - want| / step`` in float64; a NaN where the other has none is infinitely far."""
    error = (got.double() - want.double()).abs() / step
    error = torch.where(torch.isnan(error), torch.full_like(error, math.inf), error)
    if torch.isnan(got).equal(torch.isnan(want)):
        error = torch.where(torch.isnan(want), torch.zeros_like(error), error)
    return error


def steps_off(error: torch.Tensor) -> int:
    """How many elements are a step or more off.

    Outputs on the grid differ by whole steps, but each is a float32 value
    (q - zero_point) * scale, rounded to its own 24 bits: a value near 1 with
    a step of 0.008 is up to 2e-5 steps off its grid point. Whole steps are
    judged with that slack both ways.
    """
    return int((error >= 1 - _STEP_SLACK).sum().item())


def within(rule: "QuantizedRule", most: float, count_off: int, numel: int) -> bool:
    """The steps rule: at most ``max_steps`` anywhere, at most ``allowed_off`` elements a step or more off."""
    return most <= rule.max_steps + _STEP_SLACK and count_off <= rule.allowed_off(numel)


def judge_quantized(
    actual: list,
    reference: list,
    float_outputs: list,
    steps: Sequence[tuple[float | None, str] | tuple[float | None, str, bool]],
    rule: QuantizedRule,
) -> list[QuantizedOutput]:
    """Each flat output of the backend against the reference's (same Q/DQ program, eager), in steps.

    ``steps`` holds per output ``(step, where it comes from[, run-time quantized])`` (`output_steps`).
    """
    judged = []
    for index, want in enumerate(reference):
        got = actual[index] if index < len(actual) else None
        wide = float_outputs[index] if index < len(float_outputs) else want
        step, step_from, *more = steps[index] if index < len(steps) else (None, "")
        runtime = bool(more and more[0])
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
        float_output = step is None
        if step is None:
            step = implied_step(want)
        error = errors_in_steps(got, want, step)
        count_off = steps_off(error)
        off = count_off / error.numel() if error.numel() else 0.0
        most = error.max().item() if error.numel() else 0.0
        mean = error.mean().item() if error.numel() else 0.0
        sqnr_backend, sqnr_reference = sqnr_db(wide, got), sqnr_db(wide, want)
        passed = within(rule, most, count_off, error.numel())
        if float_output and not passed and sqnr_reference != -math.inf:  # -inf: the float model's output is all 0
            # No grid of its own (its step is implied; run-time parameters are chosen per call, and another
            # legitimate choice moves many elements): as good against the float model passes too.
            # NaN (a NaN output where the reference has none) compares False: a failure.
            passed = sqnr_backend >= sqnr_reference - rule.sqnr_margin_db
        judged.append(
            QuantizedOutput(
                index,
                step,
                step_from,
                most,
                mean,
                off,
                sqnr_backend,
                sqnr_reference,
                passed,
                runtime=runtime,
                float_output=float_output,
            )
        )
    return judged


def _mismatch(index: int, text: str, *, passed: bool) -> QuantizedOutput:
    return QuantizedOutput(index, 0.0, "", 0.0, 0.0, 0.0, math.nan, math.nan, passed, mismatch=text or "equal")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]
