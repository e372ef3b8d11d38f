"""Backends that run a Q/DQ program node by node in eager PyTorch, one with a quantization defect each.

``EagerQDQ`` is `eager_backends.EagerBackend` under its own name: it runs
every ``quantized_decomposed`` quantize and dequantize node literally, so
it *is* the reference the ``quantized`` category judges with, and must pass
every check. ``OtherTieRule`` rounds halves away from zero instead of to
even: another legitimate rule, which must pass too. The others each break
one thing a quantized kernel can get wrong, and must fail naming the node:

- ``TruncatingQuantize``: quantize truncates toward zero instead of rounding;
- ``DroppedZeroPoint``: dequantize ignores the zero point;
- ``WrongChannelAxis``: per-channel quantize and dequantize apply their
  scales along the next axis (cycling through them where that axis is longer);
- ``UnsignedDynamicRange``: the dynamic schemes' ``choose_qparams`` takes
  every activation for non-negative (a kernel written for post-ReLU
  activations): the range it picks starts at zero, so negative values
  saturate at the zero point. Only outputs of run-time quantization see it:
  it proves the SQNR rule that judges them can fail.
"""

from __future__ import annotations

import torch

import pytest_backendconf as bc
from eager_backends import EagerBackend

# torchao's PT2E package registers the quantized_decomposed operators that a blob names.
import torchao.quantization.pt2e  # noqa: F401

qd = torch.ops.quantized_decomposed


def _quantize(rounding):
    def quantize(x, scale, zero_point, quant_min, quant_max, dtype):
        scale = float(scale)
        zero_point = int(zero_point)
        return torch.clamp(rounding(x / scale) + zero_point, quant_min, quant_max).to(dtype)

    return quantize


def _quantize_per_channel(rounding):
    def quantize(x, scales, zero_points, axis, quant_min, quant_max, dtype):
        shape = [1] * x.dim()
        shape[axis] = -1
        scaled = rounding(x / scales.reshape(shape)) + zero_points.reshape(shape)
        return torch.clamp(scaled, quant_min, quant_max).to(dtype)

    return quantize


def _away_from_zero(v):
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def _dequantize_without_zero_point(x, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    return x.to(out_dtype or torch.float32) * float(scale)


def _dequantize_wrong_axis(x, scales, zero_points, axis, quant_min, quant_max, dtype, *, out_dtype=None):
    wrong = (axis + 1) % x.dim()
    pick = torch.arange(x.shape[wrong]) % scales.numel()
    shape = [1] * x.dim()
    shape[wrong] = x.shape[wrong]
    scale = scales[pick].reshape(shape)
    zero = zero_points[pick].reshape(shape)
    return ((x.to(torch.float32) - zero) * scale).to(out_dtype or torch.float32)


def _quantize_wrong_axis(x, scales, zero_points, axis, quant_min, quant_max, dtype):
    wrong = (axis + 1) % x.dim()
    pick = torch.arange(x.shape[wrong]) % scales.numel()
    shape = [1] * x.dim()
    shape[wrong] = x.shape[wrong]
    scale = scales[pick].reshape(shape)
    zero = zero_points[pick].reshape(shape)
    return torch.clamp(torch.round(x / scale) + zero, quant_min, quant_max).to(dtype)


def _choose_qparams_from_zero(x, quant_min, quant_max, eps, dtype):
    return qd.choose_qparams.tensor(x.clamp(min=0), quant_min, quant_max, eps, dtype)


class EagerQDQ(EagerBackend):
    name = "eager_qdq"


class OtherTieRule(EagerBackend):
    name = "other_tie_rule"
    calls = {
        qd.quantize_per_tensor.default: _quantize(_away_from_zero),
        qd.quantize_per_tensor.tensor: _quantize(_away_from_zero),
        qd.quantize_per_channel.default: _quantize_per_channel(_away_from_zero),
    }


class TruncatingQuantize(EagerBackend):
    name = "truncating_quantize"
    calls = {
        qd.quantize_per_tensor.default: _quantize(torch.trunc),
        qd.quantize_per_tensor.tensor: _quantize(torch.trunc),
        qd.quantize_per_channel.default: _quantize_per_channel(torch.trunc),
    }


class DroppedZeroPoint(EagerBackend):
    name = "dropped_zero_point"
    calls = {
        qd.dequantize_per_tensor.default: _dequantize_without_zero_point,
        qd.dequantize_per_tensor.tensor: _dequantize_without_zero_point,
    }


class WrongChannelAxis(EagerBackend):
    name = "wrong_channel_axis"
    calls = {
        qd.dequantize_per_channel.default: _dequantize_wrong_axis,
        qd.quantize_per_channel.default: _quantize_wrong_axis,
    }


class UnsignedDynamicRange(EagerBackend):
    name = "unsigned_dynamic_range"
    calls = {qd.choose_qparams.tensor: _choose_qparams_from_zero}


@bc.hookimpl
def backendconf_register_backends(register):
    for backend in (
        EagerQDQ,
        OtherTieRule,
        TruncatingQuantize,
        DroppedZeroPoint,
        WrongChannelAxis,
        UnsignedDynamicRange,
    ):
        register(backend())
