"""Reference kernels of torchao's affine quantization ops, the ones LLM-quantized programs hold.

``torchao.quantization.quantize_`` stores a weight as integers, a scale and a
zero point per *block* (``block_size``: ``[1, 32]`` is a group of 32 columns
of one row, ``[1, K]`` one scale per row, the whole shape one per tensor), and
quantizes activations at run time per token (``choose_qparams_affine`` with
``block_size [1, K]``). After the lowering unwraps torchao's tensor
subclasses, a program calls three ops, run here without torchao:

- ``torchao.dequantize_affine(q, block_size, scale, zero_point, input_dtype,
  quant_min, quant_max, *, output_dtype)``: ``(q - zero_point) * scale`` per
  block. The subtraction is done in int32 (exact), the product in float as
  eager does it, so a dequantized weight equals eager's to the bit.
- ``torchao.quantize_affine(x, block_size, scale, zero_point, output_dtype,
  quant_min, quant_max)``: ``clamp(round(x * (1 / scale)) + zero_point)``,
  rounding half to even, as eager does.
- ``torchao.choose_qparams_affine(x, mapping_type, block_size, target_dtype,
  quant_min, quant_max, eps, scale_dtype, zero_point_dtype, keepdim)``: per
  block min and max (0 always inside the range); ``SYMMETRIC``: scale
  ``max(|min|, max) / ((quant_max - quant_min) / 2)`` and the middle zero point,
  ``ASYMMETRIC``: scale ``(max - min) / (quant_max - quant_min)`` and zero point
  ``quant_min - round(min / scale)``, clamped; scales at least ``eps``.

int4 values are int8 tensors in ``[-8, 7]`` (torchao's ``IntxUnpackedToInt8Tensor``
stores them unpacked, one per byte). A block size that does not divide the
tensor's size is refused with a ``ValueError`` naming both.

Target side: imports torch only.
"""

from __future__ import annotations

from typing import Sequence

import torch

#: Integer ranges of the dtypes the ops take when quant_min/quant_max are not given.
_RANGES = {
    torch.int8: (-128, 127),
    torch.uint8: (0, 255),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
}
#: choose_qparams_affine's mapping types (torchao's MappingType names).
SYMMETRIC, ASYMMETRIC, SYMMETRIC_NO_CLIPPING_ERR = "SYMMETRIC", "ASYMMETRIC", "SYMMETRIC_NO_CLIPPING_ERR"


def blocks(block_size: Sequence[int], shape: Sequence[int], what: str) -> tuple[list[int], list[int]]:
    """``(shape_for_reduction, reduction_dims)``: ``shape`` with every blocked dim split in (blocks, block).

    torchao's own layout: a dim whose block is neither 1 nor the whole dim becomes two (the
    number of blocks, then the block), and the dims a block spans are the ones to reduce.
    """
    if len(block_size) != len(shape):
        raise ValueError(f"{what}: block_size {list(block_size)} has {len(block_size)} dims, the tensor {len(shape)}")
    split: list[int] = []
    reduced: list[int] = []
    for size, block in zip(shape, block_size):
        if block != size and block > 1:
            if block <= 0 or size % block:
                raise ValueError(
                    f"{what}: block size {block} does not divide the tensor's size {size} (shape {list(shape)}, "
                    f"block_size {list(block_size)})"
                )
            split += [size // block, block]
            reduced.append(len(split) - 1)
        else:
            split.append(size)
            if block != 1:
                reduced.append(len(split) - 1)
    return split, reduced


def _per_block(parameter: torch.Tensor, split: list[int], reduced: list[int]) -> torch.Tensor:
    shape = [1 if i in reduced else s for i, s in enumerate(split)]
    return parameter.reshape(shape)


def _range(dtype: torch.dtype, quant_min: object, quant_max: object) -> tuple[int, int]:
    low, high = _RANGES.get(dtype, (None, None))
    low = int(quant_min) if quant_min is not None else low  # type: ignore[call-overload]
    high = int(quant_max) if quant_max is not None else high  # type: ignore[call-overload]
    if low is None or high is None or low > high:
        raise ValueError(f"quantization range [{quant_min}, {quant_max}] of {dtype} is not an integer range")
    return low, high


def dequantize_affine(
    q: torch.Tensor,
    block_size: Sequence[int],
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    input_dtype: torch.dtype,
    quant_min: int | None = None,
    quant_max: int | None = None,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``(q - zero_point) * scale`` per block, in ``output_dtype``."""
    if q.dtype != input_dtype:
        raise ValueError(f"torchao.dequantize_affine: the input is {q.dtype}, the op says {input_dtype}")
    split, reduced = blocks(block_size, q.shape, "torchao.dequantize_affine")
    centered = q.reshape(split).to(torch.int32)
    if zero_point is not None:
        centered = centered - _per_block(zero_point, split, reduced).to(torch.int32)
    wide = torch.promote_types(output_dtype, scale.dtype)
    return (centered.to(wide) * _per_block(scale, split, reduced)).reshape(q.shape).to(output_dtype)


def quantize_affine(
    x: torch.Tensor,
    block_size: Sequence[int],
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    output_dtype: torch.dtype,
    quant_min: int | None = None,
    quant_max: int | None = None,
) -> torch.Tensor:
    """``clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max)`` per block, as ``output_dtype``."""
    low, high = _range(output_dtype, quant_min, quant_max)
    split, reduced = blocks(block_size, x.shape, "torchao.quantize_affine")
    levels = torch.round(x.reshape(split) * (1.0 / _per_block(scale, split, reduced))).to(torch.int64)
    if zero_point is not None and zero_point.numel():
        levels = levels + _per_block(zero_point, split, reduced).to(torch.int64)
    return torch.clamp(levels, low, high).reshape(x.shape).to(output_dtype)


def choose_qparams_affine(
    x: torch.Tensor,
    mapping_type: str,
    block_size: Sequence[int],
    target_dtype: torch.dtype,
    quant_min: int | None = None,
    quant_max: int | None = None,
    eps: float | None = None,
    scale_dtype: torch.dtype | None = None,
    zero_point_dtype: torch.dtype | None = None,
    keepdim: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale and zero point of each block of ``x`` (module docstring)."""
    low, high = _range(target_dtype, quant_min, quant_max)
    if mapping_type not in (SYMMETRIC, ASYMMETRIC, SYMMETRIC_NO_CLIPPING_ERR):
        raise ValueError(f"torchao.choose_qparams_affine: mapping type {mapping_type!r} is not supported")
    split, reduced = blocks(block_size, x.shape, "torchao.choose_qparams_affine")
    grouped = x.reshape(split)
    low_value = torch.clamp(torch.amin(grouped, dim=reduced, keepdim=keepdim), max=0)
    high_value = torch.clamp(torch.amax(grouped, dim=reduced, keepdim=keepdim), min=0)
    eps = torch.finfo(x.dtype).smallest_normal if eps is None else eps
    if mapping_type == ASYMMETRIC:
        scale = torch.clamp((high_value - low_value) / float(high - low), min=eps)
        zero_point = torch.clamp(low - torch.round(low_value / scale), low, high)
        zero_point_dtype = zero_point_dtype or torch.int32
    else:
        if mapping_type == SYMMETRIC:
            scale = torch.max(-low_value, high_value) / (float(high - low) / 2)
        else:
            below, above = low_value / float(low), high_value / float(high)
            scale = torch.where(below > above, below, above)
        zero_point = torch.full_like(scale, int((high + low + 1) / 2))
        scale = torch.clamp(scale, min=eps)
    if keepdim:
        shape = [size // block for size, block in zip(x.shape, block_size)]
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    return scale.to(scale_dtype or x.dtype), zero_point if zero_point_dtype is None else zero_point.to(zero_point_dtype)
