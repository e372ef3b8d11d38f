"""Integer kernels of quantized programs: int8 × int8 → int32 accumulation → fixed-point requantization.

A PT2E program computes a quantized convolution as ``dequantize → float
conv2d → quantize``. An NPU runs the same thing in integers, and so does the
reference backend (the compiler's pattern pass, ``_qpatterns``, writes these
kernels' opcodes in place of such a chain):

1. subtract the zero points from the int8/uint8 activations and weights;
2. accumulate the products in an int32 accumulator, and add the bias,
   quantized to int32 with scale ``input_scale * weight_scale`` (as TFLite
   and XNNPACK do);
3. requantize: multiply by ``input_scale * weight_scale / output_scale``,
   held as an int32 multiplier and a power-of-two shift (`quantize_multiplier`),
   with gemmlowp's ``SaturatingRoundingDoublingHighMul`` and rounding right
   shift (`multiply_by_quantized_multiplier`); per-channel weights get one
   multiplier per output channel;
4. add the output zero point and clamp to ``[quant_min, quant_max]`` (a fused
   ReLU raises the lower bound to the zero point).

Step 2 runs as a float64 convolution or matmul of the zero-point-shifted
integers. That is exact: every product is an integer of magnitude at most
255 · 255, and the compiler fuses a pattern only when the sum of the
products' magnitudes, bias included, stays below 2**31 for every input (the
int32 accumulator of an NPU cannot overflow), far below the 2**53 up to
which float64 holds every integer, so no partial sum is ever rounded,
whatever order the kernel adds in. (torch's CPU convolution has no int32 or
int64 kernel, and ``torch._int_mm`` covers only some shapes.) The accumulator
is then converted to int64 exactly, and everything after is integer
arithmetic.

The rounding differs from eager PyTorch's float program in two legitimate
ways: a tie of the requantization rounds half away from zero (gemmlowp)
where ``torch.round`` rounds half to even, and the multiplier carries 31
bits where float32 carries 24. Both move an output to the neighbouring
quantization step now and then, which the quantized verdict allows.

Target side: imports torch only, never the compiler.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
#: The left shift TFLite's int8 add applies before rescaling both inputs to a common scale.
ADD_LEFT_SHIFT = 20
#: The smallest and largest shifts a multiplier may have (right shifts are negative).
MIN_SHIFT, MAX_SHIFT = -62, 30

_CONVOLUTIONS = {3: F.conv1d, 4: F.conv2d}


# --- the fixed-point arithmetic ---------------------------------------------------------------


def quantize_multiplier(real: float) -> tuple[int, int]:
    """``real`` (> 0) as ``(multiplier, shift)``: ``real ≈ multiplier · 2**(shift - 31)``, multiplier in [2**30, 2**31).

    TFLite's ``QuantizeMultiplier``: the mantissa rounded to 31 bits (half away
    from zero). A ``ValueError`` for a real that is not positive and finite
    or whose shift is outside [`MIN_SHIFT`, `MAX_SHIFT`]; the compiler then
    keeps the float program.
    """
    if not (isinstance(real, float) and math.isfinite(real) and real > 0):
        raise ValueError(f"a requantization multiplier must be a positive finite float, got {real!r}")
    mantissa, shift = math.frexp(real)  # real = mantissa * 2**shift, mantissa in [0.5, 1)
    multiplier = math.floor(mantissa * 2**31 + 0.5)  # exact: mantissa has 53 bits
    if multiplier == 2**31:
        multiplier, shift = 2**30, shift + 1
    if not MIN_SHIFT <= shift <= MAX_SHIFT:
        raise ValueError(f"requantization multiplier {real!r} needs shift {shift}, outside [{MIN_SHIFT}, {MAX_SHIFT}]")
    return multiplier, shift


def saturating_rounding_doubling_high_mul(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    """gemmlowp's ``SaturatingRoundingDoublingHighMul`` of int32 values held in int64: ``round(a · b / 2**31)``.

    The product is exact in int64; the nudge rounds half away from zero and
    the division truncates, as in C. The one overflow, ``INT32_MIN · INT32_MIN``,
    saturates to ``INT32_MAX``.
    """
    product = a * b
    nudge = torch.where(product >= 0, 2**30, 1 - 2**30)
    result = torch.div(product + nudge, 2**31, rounding_mode="trunc")
    return torch.where((a == INT32_MIN) & (torch.as_tensor(b) == INT32_MIN), INT32_MAX, result)


def rounding_divide_by_pot(x: torch.Tensor, exponent: torch.Tensor | int) -> torch.Tensor:
    """gemmlowp's ``RoundingDivideByPOT``: ``x / 2**exponent`` rounded half away from zero (exponent >= 0)."""
    exponent = torch.as_tensor(exponent, dtype=torch.int64)
    mask = torch.bitwise_left_shift(torch.ones_like(exponent), exponent) - 1
    remainder = torch.bitwise_and(x, mask)
    threshold = torch.bitwise_right_shift(mask, 1) + (x < 0)
    return torch.bitwise_right_shift(x, exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(
    x: torch.Tensor, multiplier: torch.Tensor | int, shift: torch.Tensor | int
) -> torch.Tensor:
    """TFLite's ``MultiplyByQuantizedMultiplier``: ``x · multiplier · 2**(shift - 31)`` in int32 fixed point.

    ``x`` is int64 holding int32 values; ``multiplier`` and ``shift`` are ints
    or int64 tensors that broadcast against it (one per output channel).
    """
    shift = torch.as_tensor(shift, dtype=torch.int64)
    multiplier = torch.as_tensor(multiplier, dtype=torch.int64)
    left = torch.clamp(shift, min=0)
    right = torch.clamp(-shift, min=0)
    shifted = torch.clamp(x * torch.bitwise_left_shift(torch.ones_like(left), left), INT32_MIN, INT32_MAX)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted, multiplier), right)


def requantize(
    accumulator: torch.Tensor,
    multiplier: torch.Tensor | int,
    shift: torch.Tensor | int,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    channel_dim: int | None = None,
) -> torch.Tensor:
    """An int64 accumulator to the output's integers: saturate to int32, rescale, add the zero point, clamp.

    Per-channel ``multiplier`` and ``shift`` (1-D tensors) apply along ``channel_dim``.
    """
    if channel_dim is not None and isinstance(multiplier, torch.Tensor) and isinstance(shift, torch.Tensor):
        shape = [1] * accumulator.dim()
        shape[channel_dim] = -1
        multiplier, shift = multiplier.reshape(shape), shift.reshape(shape)
    accumulator = torch.clamp(accumulator, INT32_MIN, INT32_MAX)  # the int32 accumulator; the compiler's bound keeps it
    scaled = multiply_by_quantized_multiplier(accumulator, multiplier, shift)
    return torch.clamp(scaled + zero_point, quant_min, quant_max).to(dtype)


# --- the kernels --------------------------------------------------------------------------------


def _centered(q: torch.Tensor, zero_point: torch.Tensor | int, channel_dim: int = 0) -> torch.Tensor:
    """``q - zero_point`` in float64 (exact); per-channel zero points along ``channel_dim``."""
    wide = q.to(torch.float64)
    if isinstance(zero_point, torch.Tensor):
        shape = [1] * q.dim()
        shape[channel_dim] = -1
        return wide - zero_point.to(torch.float64).reshape(shape)
    return wide - zero_point


def _exact_int(accumulator: torch.Tensor, bias: torch.Tensor | None, channel_dim: int) -> torch.Tensor:
    total = accumulator.to(torch.int64)  # integers below 2**31: exact (module docstring)
    if bias is None:
        return total
    shape = [1] * total.dim()
    shape[channel_dim] = -1
    return total + bias.to(torch.int64).reshape(shape)


def quantized_convolution(
    x: torch.Tensor,
    x_zero_point: int,
    weight: torch.Tensor,
    weight_zero_point: torch.Tensor | int,
    bias: torch.Tensor | None,
    multiplier: torch.Tensor | int,
    shift: torch.Tensor | int,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``quantize(conv(dequantize(x), dequantize(weight), bias))`` in integers (conv1d or conv2d by rank).

    Padding pads the centered input with 0, which is the zero point: what
    the float program's padding of the dequantized input with 0.0 means.
    """
    convolution = _CONVOLUTIONS[x.dim()]
    accumulator = convolution(
        _centered(x, x_zero_point), _centered(weight, weight_zero_point), None, stride, padding, dilation, groups
    )
    total = _exact_int(accumulator, bias, 1)
    return requantize(total, multiplier, shift, zero_point, quant_min, quant_max, dtype, channel_dim=1)


def quantized_linear(
    x: torch.Tensor,
    x_zero_point: int,
    weight: torch.Tensor,
    weight_zero_point: torch.Tensor | int,
    bias: torch.Tensor | None,
    multiplier: torch.Tensor | int,
    shift: torch.Tensor | int,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``quantize(linear(dequantize(x), dequantize(weight), bias))`` in integers; channels are the last dim."""
    accumulator = F.linear(_centered(x, x_zero_point), _centered(weight, weight_zero_point))
    total = _exact_int(accumulator, bias, -1)
    return requantize(total, multiplier, shift, zero_point, quant_min, quant_max, dtype, channel_dim=-1)


def quantized_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    a_zero_point: int,
    b_zero_point: int,
    multiplier: int,
    shift: int,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``quantize(matmul(dequantize(a), dequantize(b)))`` in integers (``mm`` and ``bmm`` are matmuls too)."""
    accumulator = torch.matmul(_centered(a, a_zero_point), _centered(b, b_zero_point)).to(torch.int64)
    return requantize(accumulator, multiplier, shift, zero_point, quant_min, quant_max, dtype)


def quantized_add(
    a: torch.Tensor,
    b: torch.Tensor,
    a_zero_point: int,
    b_zero_point: int,
    a_multiplier: int,
    a_shift: int,
    b_multiplier: int,
    b_shift: int,
    multiplier: int,
    shift: int,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``quantize(dequantize(a) + dequantize(b))`` as TFLite's int8 add computes it.

    Both inputs, shifted left by `ADD_LEFT_SHIFT` bits, are rescaled to a
    common scale (twice the larger input scale) by multipliers below one;
    their sum is requantized to the output.
    """
    left = 2**ADD_LEFT_SHIFT
    a_scaled = multiply_by_quantized_multiplier((a.to(torch.int64) - a_zero_point) * left, a_multiplier, a_shift)
    b_scaled = multiply_by_quantized_multiplier((b.to(torch.int64) - b_zero_point) * left, b_multiplier, b_shift)
    return requantize(a_scaled + b_scaled, multiplier, shift, zero_point, quant_min, quant_max, dtype)
