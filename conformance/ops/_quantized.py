"""The ops category's quantized operators: the Q/DQ overloads, and single-op quantized programs.

PT2E programs reach a delegate as float ops between ``quantized_decomposed``
quantize and dequantize nodes (the ``quantized`` category). OpInfo lists
none of those, so the samples here are the suite's own, drawn from a
generator seeded per sample (every run checks the same numbers):

- **The Q/DQ overloads** (`QDQ_OVERLOADS`: per tensor with a float or a
  tensor scale, per channel), in int8 and uint8, one sample each. A
  quantize's inputs span the whole integer range and beyond it (saturation)
  and hold exact ties ``(k + 1/2) * scale`` (the rounding rule); zero
  points are not zero, and the per-channel axis is not the first, so a
  dropped zero point or a wrong axis shows. Ids:
  ``backendconf::ops::quantized_decomposed.quantize_per_tensor.default[int8-sample0]``.
- **Single-op quantized programs** (`PROGRAMS`), as an NPU kernel takes
  them: int8 in, ``dequantize → conv2d / linear / add → quantize``, int8
  out, per scheme (static per tensor, static per channel); and the
  dynamic scheme's linear (float in, activations quantized at run time
  with ``choose_qparams``, float out). Ids:
  ``backendconf::ops::aten.conv2d.default[int8-static-per-channel]``.

Verdicts: a quantize's integers are exact, except that an element whose
exact quotient ``x / scale`` is a tie, or within float32 rounding of one,
may be one step off: another tie rule (half away from zero), or a
multiplication by the scale's reciprocal, rounds it the other way
legitimately. A dequantize is float32 arithmetic, judged as every float32
ops check is (``[ops] tolerances``). A quantized program is judged as the
``quantized`` category judges (`QuantizedRule`): its integer outputs in
steps (the integer difference) beside the SQNR against the float op on
the unquantized values; the dynamic linear's float output may pass by it.

The Q/DQ operators are torch's own (registered by
``_compat.register_quantized_decomposed``): no torchao needed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterator

import torch

from ... import _compat
from ...errors import UnsupportedNodeError
from ...lowering import export_method, lower_programs
from ...numerics import StructureMismatch, compare_outputs, summary_json
from ...quant import QuantizedRule, judge_quantized, output_steps
from ...checks import Check, CheckFailed, Unsupported
from ...suite import SuiteContext
from .discovery import OpSample, decode_arg, resolve_overload
from ._program import build_program, op_call_class
from .._spec import section

#: The integer dtypes of the Q/DQ samples (int8: every PT2E int8 scheme; uint8: asymmetric activations).
INTEGER_DTYPES = ("int8", "uint8")
_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}
#: Per dtype: a scale that is no power of two (x / scale rounds in float) and a zero point that is not 0.
_SCALE = {"int8": 0.0173, "uint8": 0.0219}
_ZERO_POINT = {"int8": -7, "uint8": 131}

QDQ_OVERLOADS = (
    "quantized_decomposed.quantize_per_tensor.default",
    "quantized_decomposed.quantize_per_tensor.tensor",
    "quantized_decomposed.dequantize_per_tensor.default",
    "quantized_decomposed.dequantize_per_tensor.tensor",
    "quantized_decomposed.quantize_per_channel.default",
    "quantized_decomposed.dequantize_per_channel.default",
)
#: Per-channel samples: shape (2, 4, 6), channels on axis 1 (a wrong axis cycles through other scales).
_CHANNEL_SHAPE, _AXIS = (2, 4, 6), 1
#: A quantize's elements within this relative distance of a tie may round either way (float32's
#: quotient ``x / scale`` or ``x * (1 / scale)`` is within two ULPs, 2**-22, of the exact one).
TIE_ZONE = 2.0**-20


def enabled(ctx: SuiteContext) -> bool:
    """Whether the quantized ops run: the Q/DQ operators register (torch's own module) and the backend
    declares float32 (every quantized program's float side) if it declares dtypes at all."""
    declared = ctx.capabilities.dtypes
    if declared is not None and torch.float32 not in declared:
        return False
    try:
        _compat.register_quantized_decomposed()
    except ImportError:  # pragma: no cover - a torch build without torch.ao
        return False
    return True


def checks(ctx: SuiteContext) -> Iterator[Check]:
    """The Q/DQ overloads' checks, then the single-op quantized programs'."""
    if not enabled(ctx):
        return
    declared = ctx.capabilities.dtypes
    for number, sample in enumerate(qdq_samples()):
        if declared is not None and getattr(torch, sample.dtype) not in declared:
            continue
        yield Check(
            category="ops",
            name=sample.name,
            run=functools.partial(check_qdq, number=number),
            stage="execute",
        )
    if declared is not None and torch.int8 not in declared:
        return
    for program in PROGRAMS:
        yield Check(
            category="ops", name=program.name, run=functools.partial(check_program, name=program.name), stage="execute"
        )


# --- the Q/DQ overloads ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _qdq_samples() -> tuple[OpSample, ...]:
    samples = []
    for number, overload in enumerate(QDQ_OVERLOADS):
        for dtype in INTEGER_DTYPES:
            generator = torch.Generator().manual_seed(7000 + 10 * number + INTEGER_DTYPES.index(dtype))
            samples.append(_qdq_sample(overload, dtype, generator))
    return tuple(samples)


def qdq_samples() -> list[OpSample]:
    """One sample per (Q/DQ overload, integer dtype), in `QDQ_OVERLOADS` order; fresh tensors each call."""
    return [dataclasses.replace(s, inputs=[t.clone() for t in s.inputs]) for s in _qdq_samples()]


def _qdq_sample(overload: str, dtype: str, generator: torch.Generator) -> OpSample:
    low, high = _RANGE[dtype]
    scale, zero_point = _SCALE[dtype], _ZERO_POINT[dtype]
    op = overload.split(".")[1]
    per_channel = op.endswith("per_channel")
    shape = _CHANNEL_SHAPE if per_channel else (3, 40)
    if per_channel:
        channels = _CHANNEL_SHAPE[_AXIS]
        # Scales a factor of up to 3 apart, zero points spread over the range: a wrong axis or a dropped
        # zero point moves most elements.
        scales = (scale * (1 + 2 * torch.rand(channels, generator=generator))).to(torch.float32)
        zeros = torch.randint(low // 2, high // 2 + 1, (channels,), generator=generator, dtype=torch.int64)
        if dtype == "int8":
            zeros[0] = 0
        quant = [{"$input": 1}, {"$input": 2}, _AXIS]
        extra = [scales, zeros]
        view = [1] * len(shape)
        view[_AXIS] = channels
        scale_of, zero_of = scales.double().reshape(view), zeros.reshape(view)
    elif overload.endswith(".tensor"):
        # The dynamic schemes' form: scale and zero point from choose_qparams (float64 and int64, one element).
        quant = [{"$input": 1}, {"$input": 2}]
        extra = [torch.tensor([scale], dtype=torch.float64), torch.tensor([zero_point], dtype=torch.int64)]
        scale_of, zero_of = torch.tensor(scale, dtype=torch.float64), torch.tensor(zero_point)
    else:
        quant = [scale, zero_point]
        extra = []
        scale_of, zero_of = torch.tensor(scale, dtype=torch.float64), torch.tensor(zero_point)
    if op.startswith("quantize"):
        # Integer levels across the range and 8 beyond each end (saturation), a third of them exact ties.
        levels = torch.randint(low - 8, high + 9, shape, generator=generator).double() - zero_of
        fraction = torch.rand(shape, generator=generator, dtype=torch.float64)
        fraction = torch.where(torch.rand(shape, generator=generator) < 1 / 3, 0.5, fraction)
        first = ((levels + fraction) * scale_of).to(torch.float32)
    else:
        first = torch.randint(low, high + 1, shape, generator=generator).to(getattr(torch, dtype))
    return OpSample(
        overload=overload,
        dtype=dtype,
        index=0,
        opinfo=f"the suite's own {op} sample",
        args=[{"$input": 0}, *quant, low, high, {"$dtype": dtype}],
        kwargs={},
        outputs=None,
        inputs=[first, *extra],
    )


def _program_of(ctx: SuiteContext, number: int) -> Any:
    sample = _qdq_samples()[number]
    return ctx.memo(("ops-qdq-program", number), lambda: build_program(sample, list(sample.inputs)))


def _lower(ctx: SuiteContext, program: Any, arity: int, overloads: list[str]) -> Any:
    """``program`` lowered whole; `Unsupported` where the backend declares other ops only, or rejects it."""
    declared = ctx.capabilities.supported_ops
    if declared is not None:
        missing = [o for o in overloads if o not in declared]
        if missing:
            raise Unsupported(f"{', '.join(missing)} not in the backend's Capabilities.supported_ops")
    try:
        return lower_programs(
            {"forward": program},
            ctx.backend,
            {"forward": {}},
            module_type=op_call_class(arity),
            backend_version=ctx.registered.source.version,
        )
    except UnsupportedNodeError as exc:
        if declared is not None:
            raise CheckFailed(
                f"{', '.join(overloads)}: declared in Capabilities.supported_ops but rejected: "
                f"{Unsupported.from_rejection(exc)}"
            ) from exc
        raise Unsupported.from_rejection(exc) from exc


def check_qdq(ctx: SuiteContext, *, number: int) -> dict[str, Any]:
    sample = qdq_samples()[number]
    program = _program_of(ctx, number)
    lowered = _lower(ctx, program, len(sample.inputs), [sample.overload])
    with torch.no_grad():
        actual = _compat.tree_leaves(lowered(*[t.clone() for t in sample.inputs]))
        expected = resolve_overload(sample.overload)(
            *[t.clone() if isinstance(t, torch.Tensor) else t for t in _call_args(sample)]
        )
    headline = f"{sample.overload} in {sample.dtype} (the suite's own sample {sample.index}, {_describe(sample)})"
    if len(actual) != 1 or not isinstance(actual[0], torch.Tensor):
        raise CheckFailed(f"{headline}: the backend gives {len(actual)} outputs, the reference one tensor")
    got = actual[0]
    if got.dtype != expected.dtype or got.shape != expected.shape:
        raise CheckFailed(
            f"{headline}: the backend gives a {_type(got)} tensor of shape {list(got.shape)}, the reference "
            f"a {_type(expected)} tensor of shape {list(expected.shape)}"
        )
    if sample.overload.split(".")[1].startswith("quantize"):
        return _judge_quantize(sample, got, expected, headline)
    tolerance = _float32_tolerance(ctx, sample.overload)
    try:
        results = compare_outputs([got], [expected], tolerance)
    except StructureMismatch as exc:  # pragma: no cover - shape and dtype are checked above
        raise CheckFailed(f"{headline}: {exc}") from None
    details = {"numerics": {**summary_json(results), "reference": "eager in float32"}}
    failing = [r for r in results if not r.passed]
    if failing:
        raise CheckFailed(
            f"{headline}: the backend's output differs from eager PyTorch:\n" + "\n".join(r.text() for r in failing),
            details=details,
        )
    return details


def _call_args(sample: OpSample) -> list[Any]:
    return decode_arg(sample.args, list(sample.inputs))


def _float32_tolerance(ctx: SuiteContext, overload: str) -> Any:
    from ...numerics import resolve_tolerance

    return resolve_tolerance(
        torch.float32, [overload], ctx.capabilities.tolerances, section("ops").get("tolerances", {})
    )


def _quotient(sample: OpSample) -> torch.Tensor:
    """The exact ``x / scale`` of a quantize sample, per element (float64)."""
    x = sample.inputs[0].double()
    args = sample.args
    if sample.overload.endswith("per_channel.default"):
        view = [1] * x.dim()
        view[_AXIS] = -1
        return x / sample.inputs[1].double().reshape(view)
    if sample.overload.endswith(".tensor"):
        return x / sample.inputs[1].double().reshape(())
    return x / float(args[1])


def _judge_quantize(sample: OpSample, got: torch.Tensor, want: torch.Tensor, headline: str) -> dict[str, Any]:
    """Exact integers, but for a step either way on elements whose quotient is (within float rounding of) a tie."""
    difference = (got.long() - want.long()).abs()
    quotient = _quotient(sample)
    distance = (quotient - quotient.floor() - 0.5).abs()
    tie = distance <= TIE_ZONE * quotient.abs().clamp(min=1.0)
    wrong = (difference > 1) | ((difference == 1) & ~tie)
    details = {
        "quantize": {
            "elements": want.numel(),
            "ties": int(tie.sum()),
            "off_at_ties": int(((difference == 1) & tie).sum()),
            "wrong": int(wrong.sum()),
            "max_steps": int(difference.max()) if difference.numel() else 0,
        }
    }
    if not bool(wrong.any()):
        return details
    first = tuple(int(i) for i in wrong.nonzero()[0])
    raise CheckFailed(
        f"{headline}: {int(wrong.sum())} of {want.numel()} quantized elements differ from eager PyTorch by more "
        "than a tie's rounding (exact, or one step where x / scale is within float rounding of a tie), max "
        f"{int(difference.max())} steps; first at {list(first)}: the backend gives {int(got[first])}, eager "
        f"{int(want[first])}, x / scale = {float(quotient[first]):.6g}",
        details=details,
    )


def _describe(sample: OpSample) -> str:
    low, high = _RANGE[sample.dtype]
    scale = "a per-channel scale and zero point" if "per_channel" in sample.overload else "a scale and zero point"
    if sample.overload.endswith(".tensor"):
        scale += " as tensors"
    return f"{scale}, quant range [{low}, {high}]"


def _type(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


# --- single-op quantized programs -------------------------------------------------------------------


def _ops() -> Any:
    _compat.register_quantized_decomposed()
    return torch.ops.quantized_decomposed


@dataclasses.dataclass(frozen=True)
class QuantizedProgram:
    """One single-op quantized program: the float op, its scheme, and how to build its samples."""

    overload: str  #: the float op between the Q/DQ nodes ("aten.conv2d.default")
    scheme: str  #: "int8-static-per-tensor", "int8-static-per-channel" or "int8-dynamic"
    build: Callable[[str, torch.Generator], "_Built"]

    @property
    def name(self) -> str:
        return f"{self.overload}[{self.scheme}]"


@dataclasses.dataclass
class _Built:
    module: torch.nn.Module  #: the Q/DQ program as a module (exported for the backend; eager for the reference)
    inputs: tuple[torch.Tensor, ...]
    float_output: torch.Tensor  #: the float op on the unquantized values (the SQNR's signal)
    #: For an int8 output: its (scale, zero point); None for a float output (the dynamic scheme).
    output_quantization: tuple[float, int] | None


def _qparams(x: torch.Tensor) -> tuple[float, int]:
    """Asymmetric int8 parameters covering ``x`` (as a min/max observer gives them)."""
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = max((high - low) / 255, 2.0**-12)
    return scale, int(max(-128, min(127, round(-128 - low / scale))))


def _quantize(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    return _ops().quantize_per_tensor.default(x, scale, zero_point, -128, 127, torch.int8)


def _weight(w: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric int8 weights ([-127, 127]) with their scales (one, or one per output channel) and zero points."""
    flat = w.abs().reshape(w.shape[0], -1).amax(dim=1) if per_channel else w.abs().max().reshape(1)
    scales = (flat / 127).clamp(min=2.0**-12).to(torch.float32)
    zeros = torch.zeros_like(scales, dtype=torch.int64)
    view = [-1] + [1] * (w.dim() - 1) if per_channel else [1] * w.dim()
    q = torch.clamp(torch.round(w / scales.reshape(view)), -127, 127).to(torch.int8)
    return q, scales, zeros


def _register_weight(module: torch.nn.Module, weight: tuple, bias: torch.Tensor) -> None:
    """The int8 weight, its scales and zero points, and the float bias, as buffers (exported as constants)."""
    q, scales, zeros = weight
    module.register_buffer("weight", q)
    module.register_buffer("weight_scales", scales)
    module.register_buffer("weight_zero_points", zeros)
    module.register_buffer("bias", bias)


class _StaticWeighted(torch.nn.Module):
    """``dq(x) → op(·, dq(w), bias) → q``: int8 in, int8 out."""

    weight_scales: torch.Tensor  #: a buffer (`_register_weight`)

    def __init__(self, op: Any, weight: Any, bias: torch.Tensor, x_q: tuple, y_q: tuple, **kwargs: Any) -> None:
        super().__init__()
        _register_weight(self, weight, bias)
        self.per_channel = self.weight_scales.numel() > 1
        self.weight_scale = float(self.weight_scales[0])  # a literal in the program, as PT2E writes a per-tensor scale
        self.op, self.x_q, self.y_q, self.kwargs = op, x_q, y_q, kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = _ops()
        x = ops.dequantize_per_tensor.default(x, *self.x_q, -128, 127, torch.int8)
        if self.per_channel:
            w = ops.dequantize_per_channel.default(
                self.weight, self.weight_scales, self.weight_zero_points, 0, -127, 127, torch.int8
            )
        else:
            w = ops.dequantize_per_tensor.default(self.weight, self.weight_scale, 0, -127, 127, torch.int8)
        y = self.op(x, w, self.bias, **self.kwargs)
        return ops.quantize_per_tensor.default(y, *self.y_q, -128, 127, torch.int8)


class _StaticAdd(torch.nn.Module):
    """``dq(a) + dq(b) → q``: int8 in (each with its own parameters), int8 out."""

    def __init__(self, a_q: tuple, b_q: tuple, y_q: tuple) -> None:
        super().__init__()
        self.a_q, self.b_q, self.y_q = a_q, b_q, y_q

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ops = _ops()
        a = ops.dequantize_per_tensor.default(a, *self.a_q, -128, 127, torch.int8)
        b = ops.dequantize_per_tensor.default(b, *self.b_q, -128, 127, torch.int8)
        return ops.quantize_per_tensor.default(torch.ops.aten.add.Tensor(a, b), *self.y_q, -128, 127, torch.int8)


class _DynamicLinear(torch.nn.Module):
    """``choose_qparams(x) → q → dq → linear(·, dq_per_channel(w), bias)``: float in, float out."""

    def __init__(self, weight: Any, bias: torch.Tensor) -> None:
        super().__init__()
        _register_weight(self, weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = _ops()
        scale, zero_point = ops.choose_qparams.tensor(x, -128, 127, 2.0**-12, torch.int8)
        x = ops.quantize_per_tensor.tensor(x, scale, zero_point, -128, 127, torch.int8)
        x = ops.dequantize_per_tensor.tensor(x, scale, zero_point, -128, 127, torch.int8)
        w = ops.dequantize_per_channel.default(
            self.weight, self.weight_scales, self.weight_zero_points, 0, -127, 127, torch.int8
        )
        return torch.ops.aten.linear.default(x, w, self.bias)


def _weighted(kind: str) -> Callable[[str, torch.Generator], _Built]:
    def build(scheme: str, generator: torch.Generator) -> _Built:
        per_channel = scheme != "int8-static-per-tensor"
        if kind == "conv2d":
            x = torch.rand(1, 3, 8, 8, generator=generator) * 2 - 1
            w = (torch.rand(4, 3, 3, 3, generator=generator) * 2 - 1) * (torch.arange(1, 5).reshape(4, 1, 1, 1) / 4)
            bias = torch.rand(4, generator=generator) * 0.2 - 0.1
            op, kwargs = torch.ops.aten.conv2d.default, {"padding": [1, 1]}
        else:
            x = torch.rand(4, 16, generator=generator) * 2 - 1
            w = (torch.rand(8, 16, generator=generator) * 2 - 1) * (torch.arange(1, 9).reshape(8, 1) / 8)
            bias = torch.rand(8, generator=generator) * 0.2 - 0.1
            op, kwargs = torch.ops.aten.linear.default, {}
        call = (lambda a, b, c: op(a, b, c, [1, 1], kwargs["padding"])) if kind == "conv2d" else op
        weight = _weight(w, per_channel)
        if scheme == "int8-dynamic":
            module: torch.nn.Module = _DynamicLinear(weight, bias)
            return _Built(module, (x,), call(x, w, bias), None)
        x_q = _qparams(x)
        y_q = _qparams(call(x, w, bias))
        module = _StaticWeighted(call, weight, bias, x_q, y_q)
        return _Built(module, (_quantize(x, *x_q),), call(x, w, bias), y_q)

    return build


def _add(scheme: str, generator: torch.Generator) -> _Built:
    a = torch.rand(2, 3, 5, 5, generator=generator) * 2 - 1
    b = torch.rand(2, 3, 5, 5, generator=generator) * 3 - 0.5
    a_q, b_q, y_q = _qparams(a), _qparams(b), _qparams(a + b)
    return _Built(_StaticAdd(a_q, b_q, y_q), (_quantize(a, *a_q), _quantize(b, *b_q)), a + b, y_q)


PROGRAMS = (
    QuantizedProgram("aten.conv2d.default", "int8-static-per-tensor", _weighted("conv2d")),
    QuantizedProgram("aten.conv2d.default", "int8-static-per-channel", _weighted("conv2d")),
    QuantizedProgram("aten.linear.default", "int8-static-per-tensor", _weighted("linear")),
    QuantizedProgram("aten.linear.default", "int8-static-per-channel", _weighted("linear")),
    QuantizedProgram("aten.linear.default", "int8-dynamic", _weighted("linear")),
    QuantizedProgram("aten.add.Tensor", "int8-static-per-tensor", _add),
)
_BY_NAME = {p.name: p for p in PROGRAMS}


def _built(ctx: SuiteContext, name: str) -> tuple[_Built, Any]:
    """The program's module and inputs, and its exported program; once per session."""

    def make() -> tuple[_Built, Any]:
        number = PROGRAMS.index(_BY_NAME[name])
        generator = torch.Generator().manual_seed(8000 + number)
        with torch.no_grad():
            built = _BY_NAME[name].build(_BY_NAME[name].scheme, generator)
        return built, export_method(built.module, "forward", built.inputs, {})

    return ctx.memo(("ops-quantized-program", name), make)


def check_program(ctx: SuiteContext, *, name: str) -> dict[str, Any]:
    built, program = _built(ctx, name)
    nodes = program.graph_module.graph.nodes
    overloads = sorted({str(n.target) for n in nodes if n.op == "call_function" and _compat.is_op_overload(n.target)})
    lowered = _lower(ctx, program, len(built.inputs), overloads)
    with torch.no_grad():
        actual = _compat.tree_leaves(lowered(*[t.clone() for t in built.inputs]))
        reference = _compat.tree_leaves(built.module(*[t.clone() for t in built.inputs]))
    rule = _rule()
    if built.output_quantization is None:
        steps = output_steps(program)
        judged = judge_quantized(actual, reference, [built.float_output], steps, rule)
    else:
        judged = _judge_integer(actual, reference, built, rule)
    details = {"quantized": [j.json() for j in judged]}
    failing = [j for j in judged if not j.passed]
    if failing:
        float_output = any(j.by_sqnr for j in failing)
        raise CheckFailed(
            f"{name}: the backend's quantized output differs from eager PyTorch running the same Q/DQ program "
            f"by more than rounding explains ({rule.text(float_output=float_output)}):\n"
            + "\n".join("  " + j.text() for j in failing),
            details=details,
        )
    return details


def _judge_integer(actual: list, reference: list, built: _Built, rule: QuantizedRule) -> list:
    """An int8 output in steps: both sides dequantized with the output's own parameters (one step = one level)."""
    assert built.output_quantization is not None
    scale, zero_point = built.output_quantization
    got = actual[0] if len(actual) == 1 else None
    want = reference[0]
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        return judge_quantized(actual, reference, [built.float_output], [(scale, "")], rule)

    def dequantized(t: torch.Tensor) -> torch.Tensor:
        return (t.double() - zero_point) * scale

    steps = [(scale, "the scale of the output's quantize")]
    return judge_quantized([dequantized(got)], [dequantized(want)], [built.float_output], steps, rule)


def _rule() -> QuantizedRule:
    found = section("quantized")["rule"]
    return QuantizedRule(
        max_steps=float(found["max_steps"]),
        max_share=float(found["max_share"]),
        sqnr_margin_db=float(found["sqnr_margin_db"]),
    )
