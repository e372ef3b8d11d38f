"""Backends that run torchao's affine quantization ops node by node, one with an LLM-quantization defect each.

`eager_backends.EagerBackend` (``eager``) is registered here too: it
runs every ``torchao.*_affine`` node with torchao's own op, so it *is* the
reference the LLM schemes of the ``quantized`` category judge with, and
must pass. The others each break one thing an engine's int4/int8 kernels
get wrong, and must fail naming the layer and the group (or the token):

- ``SwappedNibbles``: int4 weights unpacked with the two nibbles of each
  byte in the wrong order, so each value lands in its neighbour's column;
- ``GroupOf64``: the scales of groups of 32 columns applied to groups of 64
  (column ``k`` takes scale ``k // 64``);
- ``IgnoredZeroPoint``: dequantize drops the zero point (weights of the
  asymmetric scheme, and 8da4w's activations);
- ``PerTensorActivations``: 8da4w's activations quantized with one scale and
  zero point for the whole tensor instead of one per token.
"""

from __future__ import annotations

import torch

import pytest_backendconf as bc
from eager_backends import EagerBackend

import torchao.quantization  # noqa: F401  (registers the torchao operators a blob names)

ao = torch.ops.torchao
_dequantize = ao.dequantize_affine.default


def _swapped_nibbles(
    q, block_size, scale, zero_point, input_dtype, quant_min=None, quant_max=None, output_dtype=torch.float32
):
    if quant_min != -8 or q.shape[-1] % 2:  # int4 weights only: two to a byte
        return NotImplemented
    pairs = q[..., torch.arange(q.shape[-1]) ^ 1]
    return _dequantize(
        pairs, block_size, scale, zero_point, input_dtype, quant_min, quant_max, output_dtype=output_dtype
    )


def _group_of_64(
    q, block_size, scale, zero_point, input_dtype, quant_min=None, quant_max=None, output_dtype=torch.float32
):
    if list(block_size)[-1] != 32 or q.dim() != 2:
        return NotImplemented
    index = torch.arange(q.shape[-1]) // 64
    centered = q.to(torch.float32)
    if zero_point is not None:
        centered = centered - zero_point[:, index].to(torch.float32)
    return (centered * scale[:, index]).to(output_dtype)


def _without_zero_point(
    q, block_size, scale, zero_point, input_dtype, quant_min=None, quant_max=None, output_dtype=torch.float32
):
    return _dequantize(q, block_size, scale, None, input_dtype, quant_min, quant_max, output_dtype=output_dtype)


def _per_tensor(
    x,
    mapping_type,
    block_size,
    target_dtype,
    quant_min=None,
    quant_max=None,
    eps=None,
    scale_dtype=None,
    zero_point_dtype=None,
    keepdim=False,
):
    per_token = ao.choose_qparams_affine.default(
        x, mapping_type, block_size, target_dtype, quant_min, quant_max, eps, scale_dtype, zero_point_dtype, keepdim
    )
    whole = ao.choose_qparams_affine.default(
        x, mapping_type, list(x.shape), target_dtype, quant_min, quant_max, eps, scale_dtype, zero_point_dtype, keepdim
    )
    return tuple(w.reshape(-1)[0].expand_as(t).clone() for w, t in zip(whole, per_token))


class SwappedNibbles(EagerBackend):
    name = "swapped_nibbles"
    calls = {ao.dequantize_affine.default: _swapped_nibbles}


class GroupOf64(EagerBackend):
    name = "group_of_64"
    calls = {ao.dequantize_affine.default: _group_of_64}


class IgnoredZeroPoint(EagerBackend):
    name = "ignored_zero_point"
    calls = {ao.dequantize_affine.default: _without_zero_point}


class PerTensorActivations(EagerBackend):
    name = "per_tensor_activations"
    calls = {ao.choose_qparams_affine.default: _per_tensor}


@bc.hookimpl
def backendconf_register_backends(register):
    for backend in (EagerBackend, SwappedNibbles, GroupOf64, IgnoredZeroPoint, PerTensorActivations):
        register(backend())
