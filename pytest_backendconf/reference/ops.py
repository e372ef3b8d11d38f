"""The op table: every op the reference backend supports, its opcode and its kernel.

The compiler looks ops up by overload name ("aten.mul.Tensor") and writes
the opcode into the blob; the interpreter looks them up by opcode and calls
the kernel. Opcodes are part of the blob format: never renumber or reuse
one, only append (a blob names ops by number, so an old blob must keep
meaning the same thing).

A kernel is called exactly as the ATen schema is: ``kernel(*args,
**kwargs)`` with the node's positional arguments and its keyword-only ones.
Kernels are public torch functions where their signature matches the schema,
because they are several µs faster per call than ``torch.ops.aten.*``
overloads; a small wrapper adapts the others, and an op no public function
matches (``_linalg_svd``, ``adaptive_max_pool2d``) calls its ``torch.ops.aten``
overload (`_aten`). The table covers every overload of the ops category's
data (``conformance/ops_data/``), which ``tests/test_reference_ops.py``
checks against a real ``-m ops`` run. ``kernel=None`` marks a no-op
(an assert that export inserts), which the interpreter drops.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING, Callable, cast

import torch
import torch.nn.functional as F

from . import qkernels

if TYPE_CHECKING:
    from .._compat import OpOverload

#: Tensor dtypes the backend executes; any other dtype is rejected at preprocess.
#: Every kernel is an eager CPU kernel, so every dtype the blob format can name
#: runs (the small integer ones for quantized programs and index tensors;
#: uint64 is what ``aten.hash_tensor`` returns).
SUPPORTED_DTYPES = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.uint64,
        torch.bool,
    }
)


@dataclasses.dataclass(frozen=True)
class Op:
    """One supported op overload."""

    #: Stable number written into blobs.
    opcode: int
    #: Overload name as in ``Capabilities.supported_ops``, e.g. "aten.mul.Tensor".
    name: str
    #: What the interpreter calls; None for a no-op.
    kernel: Callable[..., object] | None
    #: Compile-time check of a node's (args, kwargs): returns why it cannot run, or None.
    check: Callable[[tuple, dict], str | None] | None = None

    @property
    def qualified_name(self) -> str:
        """The op as debug info names it: "aten::mul" for "aten.mul.Tensor"."""
        namespace, op = self.name.split(".")[:2]
        return f"{namespace}::{op}"


# --- kernels whose signature differs from the ATen schema ----------------------
# Each takes the schema's arguments (same order, same keyword-only names).


def _slice(x, dim=0, start=None, end=None, step=1):
    # Basic indexing has Python's clamping rules for start/end, as ATen does,
    # and is faster than the aten.slice overload.
    index = [slice(None)] * (dim % x.dim())
    index.append(slice(start, end, step))
    return x[tuple(index)]


def _expand(x, size, *, implicit=False):
    return x.expand(size)


def _contiguous(x, *, memory_format=torch.contiguous_format):
    return x.contiguous(memory_format=memory_format)


def _to_dtype(x, dtype, non_blocking=False, copy=False, memory_format=None):
    if memory_format is None:
        return x.to(dtype, non_blocking, copy)
    return x.to(dtype, non_blocking, copy, memory_format=memory_format)


def _to_device(x, device, dtype, non_blocking=False, copy=False, memory_format=None):
    if memory_format is None:
        return x.to(device, dtype, non_blocking, copy)
    return x.to(device, dtype, non_blocking, copy, memory_format=memory_format)


def _to_dtype_layout(
    x,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    copy=False,
    memory_format=None,
):
    kwargs = {"dtype": dtype, "device": device, "non_blocking": non_blocking, "copy": copy}
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    return x.to(**{k: v for k, v in kwargs.items() if v is not None})


def _to_copy(
    x,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    # _to_copy always copies, even to the same dtype: callers may rely on
    # the result not aliasing the input.
    return _to_dtype_layout(
        x,
        dtype=dtype,
        device=device,
        non_blocking=non_blocking,
        copy=True,
        memory_format=memory_format,
    )


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale == 1 and input_scale == 1:
        return F.elu(x, alpha)
    # F.elu has no scale arguments; the rare general form takes the slower overload.
    return torch.ops.aten.elu.default(x, alpha, scale, input_scale)


def _elu_(x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale == 1 and input_scale == 1:
        return F.elu_(x, alpha)
    return torch.ops.aten.elu_.default(x, alpha, scale, input_scale)


def _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return torch.native_batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)


def _silu_(x):
    return F.silu(x, inplace=True)


def _hardswish_(x):
    return F.hardswish(x, inplace=True)


def _hardsigmoid_(x):
    return F.hardsigmoid(x, inplace=True)


def _identity_dropout(x, p, train):
    # Only eval-mode dropout is accepted (see _eval_only), where it is the identity.
    return x


def _sym_size(x, dim):
    return x.size(dim)


def _assert_scalar(condition, message):
    if not condition:
        raise RuntimeError(f"runtime assertion failed: {message}")


def _native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    # In training mode eager updates the running statistics in place although the schema declares no
    # write; execute must not change its inputs, so the kernel gets copies and the caller's tensors stay
    # unchanged (the suite judges the outputs and reports the write apart: docs/backend-contract.md).
    # float16/bfloat16 are computed in float32 (eager's CPU kernel accumulates in the low-precision
    # dtype) and rounded back once.
    low = x.dtype in _LOW_PRECISION

    def own(t):
        if t is None:
            return None
        return t.float() if low else t.clone() if training else t

    out = torch.native_batch_norm(
        x.float() if low else x, own(weight), own(bias), own(running_mean), own(running_var), training, momentum, eps
    )
    return tuple(t.to(x.dtype) if low and t.dtype == torch.float32 else t for t in out)


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _in_float32(kernel: Callable[..., object]) -> Callable[..., object]:
    """``kernel`` computed in float32 for float16/bfloat16 tensors, rounded back once.

    For ops whose eager CPU kernels accumulate in the low-precision dtype
    itself (batched matrix products, interpolation weights, the matrix
    exponential's squarings, which overflow float16): their error grows
    with the input far past the rounding of the result. Other dtypes call
    ``kernel`` unchanged.
    """

    def widened(*args: object, **kwargs: object) -> object:
        dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype in _LOW_PRECISION), None)
        if dtype is None:
            return kernel(*args, **kwargs)
        wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype == dtype else a for a in args]
        result = kernel(*wide, **kwargs)
        if isinstance(result, torch.Tensor):
            return result.to(dtype) if result.dtype == torch.float32 else result
        items = cast("tuple[object, ...]", result)  # not a tensor: the op's tuple of results
        return tuple(r.to(dtype) if isinstance(r, torch.Tensor) and r.dtype == torch.float32 else r for r in items)

    return widened


def _unfold(x, dimension, size, step):
    return x.unfold(dimension, size, step)


class _Missing:
    """An overload this torch release does not have: its row is left out of the table."""


def _aten(name: str) -> OpOverload | type[_Missing]:
    """The ``torch.ops.aten`` overload ``name`` ("acos.default"), for ops without a public
    function of the schema's signature; `_Missing` if this torch release lacks it."""
    packet, overload = name.split(".")
    try:
        return getattr(getattr(torch.ops.aten, packet), overload)
    except (AttributeError, RuntimeError):
        return _Missing


def _quantized(name: str) -> Callable[..., object]:
    """The ``quantized_decomposed`` overload ``name`` ("quantize_per_tensor.default"), looked up at its first
    call: PT2E programs quantize and dequantize with these, and a literal Q/DQ node runs exactly as eager
    PyTorch runs it. They are registered on first use, so that a blob without them never pays for it."""
    packet, overload = name.split(".")
    found: list[OpOverload] = []

    def kernel(*args: object, **kwargs: object) -> object:
        if not found:
            from .. import _compat

            _compat.register_quantized_decomposed()
            found.append(getattr(getattr(torch.ops.quantized_decomposed, packet), overload))
        return found[0](*args, **kwargs)

    kernel.__name__ = f"quantized_decomposed_{packet}"
    return kernel


def _cond(pred, true_block, false_block, operands):
    # The interpreter hands nested code blocks over as objects with ``run``.
    return (true_block if pred else false_block).run(operands)


# --- compile-time checks --------------------------------------------------------


def _eval_only(position: int, name: str) -> Callable[[tuple, dict], str | None]:
    """Reject a node whose boolean argument ``name`` (training mode) is true."""

    def check(args: tuple, kwargs: dict) -> str | None:
        value = args[position] if len(args) > position else kwargs.get(name, False)
        if value:
            return f"{name}=True (training mode) is not supported: export the model in eval mode"
        return None

    return check


# --- the table ----------------------------------------------------------------------
# (opcode, overload name, kernel[, check]); grouped by kind. Append only.

_TABLE: list[tuple] = [
    # elementwise arithmetic
    (1, "aten.add.Tensor", torch.add),
    (2, "aten.add.Scalar", torch.add),
    (3, "aten.sub.Tensor", torch.sub),
    (4, "aten.sub.Scalar", torch.sub),
    (5, "aten.rsub.Scalar", torch.rsub),
    (6, "aten.rsub.Tensor", torch.rsub),
    (7, "aten.mul.Tensor", torch.mul),
    (8, "aten.mul.Scalar", torch.mul),
    (9, "aten.div.Tensor", torch.div),
    (10, "aten.div.Scalar", torch.div),
    (11, "aten.div.Tensor_mode", torch.div),
    (12, "aten.floor_divide.default", torch.floor_divide),
    (13, "aten.remainder.Scalar", torch.remainder),
    (14, "aten.remainder.Tensor", torch.remainder),
    (15, "aten.neg.default", torch.neg),
    (16, "aten.abs.default", torch.abs),
    (17, "aten.exp.default", torch.exp),
    (18, "aten.log.default", torch.log),
    (19, "aten.sqrt.default", torch.sqrt),
    (20, "aten.rsqrt.default", torch.rsqrt),
    (21, "aten.reciprocal.default", torch.reciprocal),
    (22, "aten.square.default", torch.square),
    (23, "aten.pow.Tensor_Scalar", torch.pow),
    (24, "aten.pow.Tensor_Tensor", torch.pow),
    (25, "aten.pow.Scalar", torch.pow),
    (26, "aten.maximum.default", torch.maximum),
    (27, "aten.minimum.default", torch.minimum),
    (28, "aten.clamp.default", torch.clamp),
    (29, "aten.clamp.Tensor", torch.clamp),
    (30, "aten.where.self", torch.where),
    (31, "aten.erf.default", torch.erf),
    (32, "aten.sin.default", torch.sin),
    (33, "aten.cos.default", torch.cos),
    (34, "aten.log1p.default", torch.log1p),
    (35, "aten.expm1.default", torch.expm1),
    (36, "aten.floor.default", torch.floor),
    (37, "aten.ceil.default", torch.ceil),
    (38, "aten.round.default", torch.round),
    (39, "aten.sign.default", torch.sign),
    # comparisons and logic
    (40, "aten.eq.Tensor", torch.eq),
    (41, "aten.eq.Scalar", torch.eq),
    (42, "aten.ne.Tensor", torch.ne),
    (43, "aten.ne.Scalar", torch.ne),
    (44, "aten.lt.Tensor", torch.lt),
    (45, "aten.lt.Scalar", torch.lt),
    (46, "aten.le.Tensor", torch.le),
    (47, "aten.le.Scalar", torch.le),
    (48, "aten.gt.Tensor", torch.gt),
    (49, "aten.gt.Scalar", torch.gt),
    (50, "aten.ge.Tensor", torch.ge),
    (51, "aten.ge.Scalar", torch.ge),
    (52, "aten.logical_and.default", torch.logical_and),
    (53, "aten.logical_or.default", torch.logical_or),
    (54, "aten.logical_xor.default", torch.logical_xor),
    (55, "aten.logical_not.default", torch.logical_not),
    (56, "aten.bitwise_and.Tensor", torch.bitwise_and),
    (57, "aten.bitwise_or.Tensor", torch.bitwise_or),
    (58, "aten.bitwise_not.default", torch.bitwise_not),
    (59, "aten.__and__.Tensor", torch.bitwise_and),
    (60, "aten.__or__.Tensor", torch.bitwise_or),
    # activations
    (70, "aten.relu.default", torch.relu),
    (71, "aten.relu6.default", F.relu6),
    (72, "aten.gelu.default", F.gelu),
    (73, "aten.silu.default", F.silu),
    (74, "aten.sigmoid.default", torch.sigmoid),
    (75, "aten.tanh.default", torch.tanh),
    (76, "aten.hardtanh.default", F.hardtanh),
    (77, "aten.leaky_relu.default", F.leaky_relu),
    (78, "aten.elu.default", _elu),
    (79, "aten.softplus.default", F.softplus),
    (80, "aten.hardswish.default", F.hardswish),
    (81, "aten.hardsigmoid.default", F.hardsigmoid),
    # in-place activations, as export keeps them (nn.ReLU(inplace=True)); the
    # compiler accepts in-place ops only on the program's own intermediate tensors
    (82, "aten.relu_.default", torch.relu_),
    (83, "aten.hardtanh_.default", F.hardtanh_),
    (84, "aten.silu_.default", _silu_),
    (85, "aten.hardswish_.default", _hardswish_),
    (86, "aten.hardsigmoid_.default", _hardsigmoid_),
    (87, "aten.leaky_relu_.default", F.leaky_relu_),
    (88, "aten.elu_.default", _elu_),
    (89, "aten.dropout_.default", _identity_dropout, _eval_only(2, "train")),
    # reductions
    (90, "aten.sum.default", torch.sum),
    (91, "aten.sum.dim_IntList", torch.sum),
    (92, "aten.mean.default", torch.mean),
    (93, "aten.mean.dim", torch.mean),
    (94, "aten.amax.default", torch.amax),
    (95, "aten.amin.default", torch.amin),
    (96, "aten.argmax.default", torch.argmax),
    (97, "aten.argmin.default", torch.argmin),
    (98, "aten.max.default", torch.max),
    (99, "aten.min.default", torch.min),
    (100, "aten.max.dim", torch.max),
    (101, "aten.min.dim", torch.min),
    (102, "aten.var.correction", torch.var),
    (103, "aten.var.dim", torch.var),
    (104, "aten.std.correction", torch.std),
    (105, "aten.std.dim", torch.std),
    (106, "aten.cumsum.default", torch.cumsum),
    # linear algebra
    (110, "aten.matmul.default", torch.matmul),
    (111, "aten.mm.default", torch.mm),
    (112, "aten.bmm.default", torch.bmm),
    (113, "aten.linear.default", F.linear),
    (114, "aten.addmm.default", torch.addmm),
    # convolution and pooling
    (120, "aten.conv1d.default", torch.conv1d),
    (121, "aten.conv2d.default", torch.conv2d),
    (122, "aten.convolution.default", torch.convolution),
    (123, "aten.max_pool2d.default", torch.max_pool2d),
    (124, "aten.max_pool2d_with_indices.default", F.max_pool2d_with_indices),
    (125, "aten.avg_pool2d.default", F.avg_pool2d),
    (126, "aten.adaptive_avg_pool2d.default", F.adaptive_avg_pool2d),
    (127, "aten._adaptive_avg_pool2d.default", F.adaptive_avg_pool2d),
    # softmax and normalization
    (130, "aten.softmax.int", torch.softmax),
    (131, "aten.log_softmax.int", torch.log_softmax),
    (132, "aten._softmax.default", torch.ops.aten._softmax),
    (133, "aten._log_softmax.default", torch.ops.aten._log_softmax),
    (134, "aten.layer_norm.default", torch.layer_norm),
    (135, "aten.native_layer_norm.default", torch.native_layer_norm),
    (136, "aten.batch_norm.default", torch.batch_norm, _eval_only(5, "training")),
    (137, "aten._native_batch_norm_legit_no_training.default", _batch_norm_no_training),
    (138, "aten.group_norm.default", torch.group_norm),
    (139, "aten.dropout.default", _identity_dropout, _eval_only(2, "train")),
    # in-place arithmetic (``y += x`` in a residual block), on intermediates only
    (140, "aten.add_.Tensor", torch.Tensor.add_),
    (141, "aten.sub_.Tensor", torch.Tensor.sub_),
    (142, "aten.mul_.Tensor", torch.Tensor.mul_),
    (143, "aten.div_.Tensor", torch.Tensor.div_),
    # shapes and views
    (150, "aten.view.default", torch.Tensor.view),
    (151, "aten._unsafe_view.default", torch.reshape),
    (152, "aten.reshape.default", torch.reshape),
    (153, "aten.permute.default", torch.permute),
    (154, "aten.transpose.int", torch.transpose),
    (155, "aten.t.default", torch.t),
    (156, "aten.cat.default", torch.cat),
    (157, "aten.stack.default", torch.stack),
    (158, "aten.slice.Tensor", _slice),
    (159, "aten.select.int", torch.select),
    (160, "aten.squeeze.default", torch.squeeze),
    (161, "aten.squeeze.dim", torch.squeeze),
    (162, "aten.squeeze.dims", torch.squeeze),
    (163, "aten.unsqueeze.default", torch.unsqueeze),
    (164, "aten.expand.default", _expand),
    (165, "aten.flatten.using_ints", torch.flatten),
    (166, "aten.contiguous.default", _contiguous),
    (167, "aten.clone.default", torch.clone),
    (168, "aten.split.Tensor", torch.split),
    (169, "aten.split_with_sizes.default", torch.split),
    (170, "aten.chunk.default", torch.chunk),
    (171, "aten.unbind.int", torch.unbind),
    (172, "aten.repeat.default", torch.Tensor.repeat),
    (173, "aten.triu.default", torch.triu),
    (174, "aten.tril.default", torch.tril),
    (175, "aten.masked_fill.Scalar", torch.masked_fill),
    (176, "aten.masked_fill.Tensor", torch.masked_fill),
    (177, "aten.embedding.default", torch.embedding),
    (178, "aten.index_select.default", torch.index_select),
    (179, "aten.detach.default", torch.detach),
    # detach_ only drops autograd history; on the fresh copy export feeds it
    # (lift_fresh_copy) the out-of-place form is equivalent.
    (180, "aten.detach_.default", torch.detach),
    (181, "aten.lift_fresh_copy.default", torch.clone),
    # nn.MultiheadAttention splits heads with it (torchvision's ViT, nn.TransformerEncoder)
    (182, "aten.unflatten.int", torch.unflatten),
    (183, "aten.scaled_dot_product_attention.default", F.scaled_dot_product_attention),
    # tensor creation
    (190, "aten.zeros.default", torch.zeros),
    (191, "aten.ones.default", torch.ones),
    (192, "aten.full.default", torch.full),
    (193, "aten.zeros_like.default", torch.zeros_like),
    (194, "aten.ones_like.default", torch.ones_like),
    (195, "aten.full_like.default", torch.full_like),
    (196, "aten.new_zeros.default", torch.Tensor.new_zeros),
    (197, "aten.new_ones.default", torch.Tensor.new_ones),
    (198, "aten.arange.default", torch.arange),
    (199, "aten.arange.start", torch.arange),
    (200, "aten.arange.start_step", torch.arange),
    # dtype casts
    (210, "aten._to_copy.default", _to_copy),
    (211, "aten.to.dtype", _to_dtype),
    (212, "aten.to.dtype_layout", _to_dtype_layout),
    (213, "aten.to.device", _to_device),
    # asserts export inserts: tensor metadata was fixed at export and the lowering
    # checks inputs, so it is a no-op; scalar asserts guard dynamic sizes and run
    (220, "aten._assert_tensor_metadata.default", None),
    (221, "aten._assert_scalar.default", _assert_scalar),
    # symbolic sizes and data-dependent scalars (dynamic shapes)
    (230, "aten.sym_size.int", _sym_size),
    (231, "aten.item.default", torch.Tensor.item),
    (232, "_operator.add", operator.add),
    (233, "_operator.sub", operator.sub),
    (234, "_operator.mul", operator.mul),
    (235, "_operator.floordiv", operator.floordiv),
    (236, "_operator.eq", operator.eq),
    (237, "torch.sym_not", torch.sym_not),
    (238, "_operator.lt", operator.lt),
    (239, "_operator.le", operator.le),
    (240, "_operator.gt", operator.gt),
    (241, "_operator.ge", operator.ge),
    # structure and control flow
    (250, "_operator.getitem", operator.getitem),
    (251, "higher_order.cond", _cond),
    # --- every other overload of the conformance suite's ops data (torch 2.13 and 2.14) ---
    # elementwise math
    (260, "aten.acos.default", torch.acos),
    (261, "aten.acosh.default", torch.acosh),
    (262, "aten.asin.default", torch.asin),
    (263, "aten.asinh.default", torch.asinh),
    (264, "aten.atan.default", torch.atan),
    (265, "aten.atanh.default", torch.atanh),
    (266, "aten.atan2.default", torch.atan2),
    (267, "aten.cosh.default", torch.cosh),
    (268, "aten.sinh.default", torch.sinh),
    (269, "aten.tan.default", torch.tan),
    (270, "aten.angle.default", torch.angle),
    (271, "aten.erfc.default", torch.erfc),
    (272, "aten.erfinv.default", torch.erfinv),
    (273, "aten.exp2.default", torch.exp2),
    (274, "aten.log2.default", torch.log2),
    (275, "aten.log10.default", torch.log10),
    (276, "aten.lgamma.default", torch.lgamma),
    (277, "aten.digamma.default", torch.digamma),
    (278, "aten.polygamma.default", torch.polygamma),
    (279, "aten.i0.default", torch.i0),
    (280, "aten.igamma.default", torch.igamma),
    (281, "aten.igammac.default", torch.igammac),
    (282, "aten.trunc.default", torch.trunc),
    (283, "aten.round.decimals", torch.round),
    (284, "aten.copysign.Tensor", torch.copysign),
    (285, "aten.fmax.default", torch.fmax),
    (286, "aten.fmin.default", torch.fmin),
    (287, "aten.fmod.Tensor", torch.fmod),
    (288, "aten.hypot.default", torch.hypot),
    (289, "aten.nextafter.default", torch.nextafter),
    (290, "aten.frexp.Tensor", torch.frexp),
    (291, "aten.ldexp.Tensor", torch.ldexp),
    (292, "aten.gcd.default", torch.gcd),
    (293, "aten.lcm.default", torch.lcm),
    (294, "aten.isinf.default", torch.isinf),
    (295, "aten.isnan.default", torch.isnan),
    (296, "aten.signbit.default", torch.signbit),
    (297, "aten.bitwise_xor.Tensor", torch.bitwise_xor),
    (298, "aten.bitwise_left_shift.Tensor", torch.bitwise_left_shift),
    (299, "aten.bitwise_right_shift.Tensor", torch.bitwise_right_shift),
    # special functions
    (300, "aten.special_airy_ai.default", torch.special.airy_ai),
    (301, "aten.special_bessel_j0.default", torch.special.bessel_j0),
    (302, "aten.special_bessel_j1.default", torch.special.bessel_j1),
    (303, "aten.special_bessel_y0.default", torch.special.bessel_y0),
    (304, "aten.special_bessel_y1.default", torch.special.bessel_y1),
    (305, "aten.special_chebyshev_polynomial_t.default", torch.special.chebyshev_polynomial_t),
    (306, "aten.special_chebyshev_polynomial_u.default", torch.special.chebyshev_polynomial_u),
    (307, "aten.special_chebyshev_polynomial_v.default", torch.special.chebyshev_polynomial_v),
    (308, "aten.special_chebyshev_polynomial_w.default", torch.special.chebyshev_polynomial_w),
    (309, "aten.special_erfcx.default", torch.special.erfcx),
    (310, "aten.special_hermite_polynomial_h.default", torch.special.hermite_polynomial_h),
    (311, "aten.special_hermite_polynomial_he.default", torch.special.hermite_polynomial_he),
    (312, "aten.special_i0e.default", torch.special.i0e),
    (313, "aten.special_i1.default", torch.special.i1),
    (314, "aten.special_i1e.default", torch.special.i1e),
    (315, "aten.special_laguerre_polynomial_l.default", torch.special.laguerre_polynomial_l),
    (316, "aten.special_legendre_polynomial_p.default", torch.special.legendre_polynomial_p),
    (317, "aten.special_modified_bessel_i0.default", torch.special.modified_bessel_i0),
    (318, "aten.special_modified_bessel_i1.default", torch.special.modified_bessel_i1),
    (319, "aten.special_modified_bessel_k0.default", torch.special.modified_bessel_k0),
    (320, "aten.special_modified_bessel_k1.default", torch.special.modified_bessel_k1),
    (321, "aten.special_ndtri.default", torch.special.ndtri),
    (322, "aten.special_scaled_modified_bessel_k0.default", torch.special.scaled_modified_bessel_k0),
    (323, "aten.special_scaled_modified_bessel_k1.default", torch.special.scaled_modified_bessel_k1),
    (324, "aten.special_shifted_chebyshev_polynomial_t.default", torch.special.shifted_chebyshev_polynomial_t),
    (325, "aten.special_shifted_chebyshev_polynomial_u.default", torch.special.shifted_chebyshev_polynomial_u),
    (326, "aten.special_shifted_chebyshev_polynomial_v.default", torch.special.shifted_chebyshev_polynomial_v),
    (327, "aten.special_shifted_chebyshev_polynomial_w.default", torch.special.shifted_chebyshev_polynomial_w),
    (328, "aten.special_spherical_bessel_j0.default", torch.special.spherical_bessel_j0),
    (329, "aten.special_zeta.default", torch.special.zeta),
    # reductions, scans, sorting and searching
    (340, "aten.any.default", torch.any),
    (341, "aten.any.dim", torch.any),
    (342, "aten.prod.default", torch.prod),
    (343, "aten.prod.dim_int", torch.prod),
    (344, "aten.cumprod.default", torch.cumprod),
    (345, "aten.cummax.default", torch.cummax),
    (346, "aten.cummin.default", torch.cummin),
    (347, "aten.logcumsumexp.default", torch.logcumsumexp),
    (348, "aten.var_mean.correction", torch.var_mean),
    (349, "aten.dist.default", torch.dist),
    (350, "aten.linalg_vector_norm.default", torch.linalg.vector_norm),
    (351, "aten.median.default", torch.median),
    (352, "aten.median.dim", torch.median),
    (353, "aten.nanmedian.default", torch.nanmedian),
    (354, "aten.nanmedian.dim", torch.nanmedian),
    (355, "aten.mode.default", torch.mode),
    (356, "aten.kthvalue.default", torch.kthvalue),
    (357, "aten.topk.default", torch.topk),
    (358, "aten.sort.default", torch.sort),
    (359, "aten.sort.stable", torch.sort),
    (360, "aten.searchsorted.Tensor", torch.searchsorted),
    (361, "aten.bucketize.Tensor", torch.bucketize),
    (362, "aten.histc.default", torch.histc),
    (363, "aten.histogram.bin_ct", torch.histogram),
    (364, "aten.histogram.bins_tensor", torch.histogram),
    (365, "aten.segment_reduce.default", torch.segment_reduce),
    (366, "aten.hash_tensor.default", _aten("hash_tensor.default")),
    # indexing, scatter and gather
    (370, "aten.gather.default", torch.gather),
    (371, "aten.scatter.src", torch.scatter),
    (372, "aten.scatter.reduce", torch.scatter),
    (373, "aten.scatter_add.default", torch.scatter_add),
    (374, "aten.scatter_reduce.two", torch.scatter_reduce),
    (375, "aten.index_put.default", torch.index_put),
    (376, "aten.index_reduce.default", torch.index_reduce),
    (377, "aten.masked_scatter.default", torch.masked_scatter),
    (378, "aten.put.default", torch.put),
    (379, "aten.slice_scatter.default", torch.slice_scatter),
    (380, "aten.diagonal_scatter.default", torch.diagonal_scatter),
    (381, "aten.as_strided_scatter.default", torch.as_strided_scatter),
    (382, "aten.nonzero_static.default", torch.nonzero_static),
    (383, "aten._embedding_bag_forward_only.default", _aten("_embedding_bag_forward_only.default")),
    # shapes, views and their copying forms
    (390, "aten.flip.default", torch.flip),
    (391, "aten.unfold.default", _unfold),
    (392, "aten.diagonal.default", torch.diagonal),
    (393, "aten.as_strided.default", torch.as_strided),
    (394, "aten.as_strided_copy.default", torch.as_strided_copy),
    (395, "aten.permute_copy.default", torch.permute_copy),
    (396, "aten.view_copy.default", torch.view_copy),
    (397, "aten.unbind_copy.int", torch.unbind_copy),
    (398, "aten.narrow_copy.default", torch.narrow_copy),
    (399, "aten.constant_pad_nd.default", torch.constant_pad_nd),
    # linear algebra
    (410, "aten.addbmm.default", _in_float32(torch.addbmm)),
    (411, "aten.addmv.default", torch.addmv),
    (412, "aten._cdist_forward.default", _aten("_cdist_forward.default")),
    (413, "aten._pdist_forward.default", _aten("_pdist_forward.default")),
    (414, "aten._linalg_det.default", _aten("_linalg_det.default")),
    (415, "aten._linalg_eigh.default", _aten("_linalg_eigh.default")),
    (416, "aten._linalg_slogdet.default", _aten("_linalg_slogdet.default")),
    (417, "aten._linalg_solve_ex.default", _aten("_linalg_solve_ex.default")),
    (418, "aten._linalg_svd.default", _aten("_linalg_svd.default")),
    (419, "aten.cholesky.default", _aten("cholesky.default")),
    (420, "aten.cholesky_inverse.default", torch.cholesky_inverse),
    (421, "aten.cholesky_solve.default", torch.cholesky_solve),
    (422, "aten.geqrf.default", torch.geqrf),
    (423, "aten.ormqr.default", torch.ormqr),
    (424, "aten.triangular_solve.default", _aten("triangular_solve.default")),
    (425, "aten.lu_unpack.default", torch.lu_unpack),
    (426, "aten.linalg_cholesky_ex.default", torch.linalg.cholesky_ex),
    (427, "aten.linalg_householder_product.default", torch.linalg.householder_product),
    (428, "aten.linalg_inv_ex.default", torch.linalg.inv_ex),
    (429, "aten.linalg_ldl_factor_ex.default", torch.linalg.ldl_factor_ex),
    (430, "aten.linalg_ldl_solve.default", torch.linalg.ldl_solve),
    (431, "aten.linalg_lu.default", torch.linalg.lu),
    (432, "aten.linalg_lu_factor_ex.default", torch.linalg.lu_factor_ex),
    (433, "aten.linalg_lu_solve.default", torch.linalg.lu_solve),
    (434, "aten.linalg_matrix_exp.default", _in_float32(torch.linalg.matrix_exp)),
    (435, "aten.linalg_pinv.atol_rtol_tensor", torch.linalg.pinv),
    (436, "aten.linalg_qr.default", torch.linalg.qr),
    (437, "aten.linalg_solve_triangular.default", torch.linalg.solve_triangular),
    (438, "aten.linalg_polar.default", _aten("linalg_polar.default")),
    (439, "aten.linalg_matrix_sqrth.default", _aten("linalg_matrix_sqrth.default")),
    # pooling, normalization and sampling
    (450, "aten._adaptive_avg_pool3d.default", _in_float32(F.adaptive_avg_pool3d)),
    (451, "aten.adaptive_max_pool2d.default", _aten("adaptive_max_pool2d.default")),
    (452, "aten.adaptive_max_pool3d.default", _aten("adaptive_max_pool3d.default")),
    (453, "aten.avg_pool3d.default", F.avg_pool3d),
    (454, "aten.max_pool3d_with_indices.default", _aten("max_pool3d_with_indices.default")),
    (455, "aten.native_batch_norm.default", _native_batch_norm),
    (456, "aten.native_group_norm.default", torch.native_group_norm),
    (457, "aten.grid_sampler_2d.default", _in_float32(torch.grid_sampler_2d)),
    (458, "aten.grid_sampler_3d.default", _in_float32(torch.grid_sampler_3d)),
    (459, "aten._upsample_bilinear2d_aa.default", _aten("_upsample_bilinear2d_aa.default")),
    # integer arithmetic with a constant, as quantized and index programs write it (``q & 0x0F``)
    (470, "aten.bitwise_and.Scalar", torch.bitwise_and),
    (471, "aten.bitwise_or.Scalar", torch.bitwise_or),
    (472, "aten.bitwise_xor.Scalar", torch.bitwise_xor),
    (473, "aten.bitwise_left_shift.Tensor_Scalar", torch.bitwise_left_shift),
    (474, "aten.bitwise_right_shift.Tensor_Scalar", torch.bitwise_right_shift),
    (475, "aten.__rshift__.Scalar", torch.bitwise_right_shift),
    (476, "aten.__lshift__.Scalar", torch.bitwise_left_shift),
    (477, "aten.fmod.Scalar", torch.fmod),
    (478, "aten.clamp_min.default", torch.clamp_min),
    (479, "aten.clamp_max.default", torch.clamp_max),
    (480, "aten.__and__.Scalar", torch.bitwise_and),
    (481, "aten.__or__.Scalar", torch.bitwise_or),
    (482, "aten.__xor__.Scalar", torch.bitwise_xor),
    (483, "aten.__xor__.Tensor", torch.bitwise_xor),
    # PT2E quantize/dequantize nodes, run literally (the quantized category's programs; backendconf-reference 0.3.0)
    (490, "quantized_decomposed.quantize_per_tensor.default", _quantized("quantize_per_tensor.default")),
    (491, "quantized_decomposed.dequantize_per_tensor.default", _quantized("dequantize_per_tensor.default")),
    (492, "quantized_decomposed.quantize_per_tensor.tensor", _quantized("quantize_per_tensor.tensor")),
    (493, "quantized_decomposed.dequantize_per_tensor.tensor", _quantized("dequantize_per_tensor.tensor")),
    (495, "quantized_decomposed.dequantize_per_channel.default", _quantized("dequantize_per_channel.default")),
    (496, "quantized_decomposed.choose_qparams.tensor", _quantized("choose_qparams.tensor")),
    # the ops category's per-channel quantize (its Q/DQ operator checks)
    (497, "quantized_decomposed.quantize_per_channel.default", _quantized("quantize_per_channel.default")),
]

OPS: tuple[Op, ...] = tuple(Op(*row) for row in _TABLE if row[2] is not _Missing)
BY_NAME: dict[str, Op] = {op.name: op for op in OPS}

#: Integer kernels of quantized programs (backendconf-reference 0.4.0): no FX node is one of these, the
#: compiler writes them for a whole ``dequantize -> op -> quantize`` chain (``_qpatterns``), so they are
#: not in `BY_NAME` nor `SUPPORTED_OPS`. Their opcodes share the table's numbering (append only).
INTEGER_KERNELS: tuple[Op, ...] = (
    Op(500, "reference.quantized_convolution", qkernels.quantized_convolution),
    Op(501, "reference.quantized_linear", qkernels.quantized_linear),
    Op(502, "reference.quantized_matmul", qkernels.quantized_matmul),
    Op(503, "reference.quantized_add", qkernels.quantized_add),
)
BY_OPCODE: dict[int, Op] = {op.opcode: op for op in (*OPS, *INTEGER_KERNELS)}
INTEGER_OPCODES = frozenset(op.opcode for op in INTEGER_KERNELS)

# A duplicated opcode or name would make blobs ambiguous: fail at import.
if len(BY_NAME) != len(OPS) or len(BY_OPCODE) != len(OPS) + len(INTEGER_KERNELS):
    raise RuntimeError("the reference op table: an opcode or op name appears twice")
if not all(0 < op.opcode < 2**16 for op in BY_OPCODE.values()):
    raise RuntimeError("the reference op table: opcodes must fit in u16 and be positive")

#: Overload names, for ``Capabilities.supported_ops``.
SUPPORTED_OPS = frozenset(BY_NAME)

#: Not a table op: "call this registered operator through torch's dispatcher".
#: Only partial delegation's fallback writes it (``compile_program(...,
#: fallback=True)``), for an operator the table lacks, such as a user's
#: ``torch.library`` custom op. Its first argument is the overload name
#: ("mylib.scale.default"); the interpreter looks the operator up at load.
DISPATCH_OPCODE = 60000
if DISPATCH_OPCODE in BY_OPCODE:
    raise RuntimeError("the reference op table: DISPATCH_OPCODE is taken by a table op")
