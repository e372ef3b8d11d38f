"""The compiler's pattern pass: ``dequantize -> op [-> relu] -> quantize`` chains become integer kernels (host only).

A PT2E program holds its quantized ops as float ops between
``quantized_decomposed`` nodes::

    x_q --dequantize_per_tensor--> x --+
    w_q --dequantize_per_channel--> w --+-- aten.conv2d(x, w, bias) --[aten.relu]-- quantize_per_tensor --> y_q

An NPU runs such a chain as one integer kernel, and so does the reference
backend (the kernels are ``qkernels``): `find_chains` finds every chain of
``aten.conv1d``/``conv2d``, ``aten.linear``, ``aten.matmul``/``mm``/``bmm``
and ``aten.add.Tensor`` whose

- activations are ``dequantize_per_tensor.default`` of int8 or uint8 values
  (scale and zero point fixed in the program);
- weights (convolutions, linear layers) are ``dequantize_per_tensor`` or
  ``dequantize_per_channel`` (axis 0, the output channels) of an int8 or
  uint8 constant, and the bias a float constant or none (it is quantized
  to int32 with scale ``input_scale * weight_scale`` here);
- result is quantized by one ``quantize_per_tensor.default`` to int8 or
  uint8, optionally through an ``aten.relu`` (the kernel raises its lower
  clamp to the output zero point);
- intermediate values (the float op's result, the ReLU's) have no other use;
- int32 accumulator cannot overflow for any input, and requantization
  multipliers fit the fixed-point format.

Everything else stays as it is and runs literally: dynamic quantization
(``choose_qparams`` and the ``.tensor`` overloads), int16 activations,
other ops, a chain whose float result is also an output, a chain holding
the node of an injected fault. A dequantize node is left out of the blob
when integer kernels consume all its uses; each kernel's instruction lists
the debug handles of every node it covers (the dequantizes it absorbed, the
op, the ReLU, the quantize), so errors and profiles still name the nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx

from .. import _compat
from . import qkernels

_Q = "quantized_decomposed.quantize_per_tensor.default"
_DQ = "quantized_decomposed.dequantize_per_tensor.default"
_DQ_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
_RELU = "aten.relu.default"
_CONVOLUTIONS = ("aten.conv1d.default", "aten.conv2d.default")
_LINEAR = "aten.linear.default"
_MATMULS = ("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
_ADD = "aten.add.Tensor"
#: The integer types of activations and weights the kernels take.
_INTEGERS = {torch.int8: (-128, 127), torch.uint8: (0, 255)}
#: The accumulator is int32: a chain is fused only if no input can make it overflow.
_ACCUMULATOR_LIMIT = 2**31

#: Opcodes of the integer kernels (``ops.INTEGER_KERNELS``).
CONVOLUTION, LINEAR, MATMUL, ADD = 500, 501, 502, 503


@dataclasses.dataclass
class Chain:
    """One fused chain: the kernel's opcode and arguments, and the nodes it covers."""

    opcode: int
    #: Arguments: FX nodes (their registers or constants), tensors (new constants), immediates.
    args: list
    #: The op node (conv2d, linear, ...): the instruction carries its name and debug handle.
    anchor: torch.fx.Node
    #: Every node the kernel covers, in program order (filled in by `find_chains`).
    nodes: list[torch.fx.Node] = dataclasses.field(default_factory=list)
    #: The dequantize nodes it reads through.
    dequantizes: list[torch.fx.Node] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Plan:
    """What the compiler writes for a graph: chains by their quantize node, and the nodes to leave out."""

    chains: dict[torch.fx.Node, Chain]
    skipped: set[torch.fx.Node]


class _NoMatch(Exception):
    """This chain is not fused (the reason is for readers of this module; the float program runs)."""


def find_chains(
    graph: torch.fx.Graph,
    constant: Callable[[torch.fx.Node], torch.Tensor | None],
    avoid: torch.fx.Node | None = None,
) -> Plan:
    """The chains of ``graph`` to run as integer kernels.

    :param constant: a node's tensor if it is a constant of the program (a weight), else None.
    :param avoid: a node that must run as itself (an injected fault's): no chain covers it.
    """
    chains: dict[torch.fx.Node, Chain] = {}
    for node in graph.nodes:
        if node.op == "call_function" and _name(node) == _Q:
            try:
                chain = _chain(node, constant)
            except _NoMatch:
                continue
            if avoid is None or avoid not in (*chain.nodes, *chain.dequantizes):
                chains[node] = chain
    fused_ops = {n for chain in chains.values() for n in chain.nodes}
    skipped = set(fused_ops) - set(chains)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for chain in chains.values():
        for dq in chain.dequantizes:
            if all(user in fused_ops for user in dq.users):
                skipped.add(dq)
                chain.nodes.append(dq)
        chain.nodes = sorted(set(chain.nodes), key=order.__getitem__)
    return Plan(chains, skipped)


# --- matching one chain -----------------------------------------------------------------------


def _chain(q: torch.fx.Node, constant: Callable) -> Chain:
    value, scale, zero_point, quant_min, quant_max, dtype = _qparams(q, _Q)
    relu = None
    if _name(value) == _RELU and len(value.users) == 1:
        relu, value = value, value.args[0]
        quant_min = max(quant_min, zero_point)  # relu(y) quantized: the zero point is the least value
    op = value
    if not isinstance(op, torch.fx.Node) or op.op != "call_function" or len(op.users) != 1:
        raise _NoMatch("the float result has other uses")
    output = (scale, zero_point, quant_min, quant_max, dtype)
    name = _name(op)
    if name in _CONVOLUTIONS or name == _LINEAR:
        chain = _weighted(op, name, output, constant)
    elif name in _MATMULS:
        chain = _matmul(op, output)
    elif name == _ADD:
        chain = _add(op, output)
    else:
        raise _NoMatch(f"{name} has no integer kernel")
    chain.nodes = [n for n in (op, relu, q) if n is not None]
    return chain


def _weighted(op: torch.fx.Node, name: str, output: tuple, constant: Callable) -> Chain:
    """A convolution or linear layer: int8 activations, int8 constant weights, float bias."""
    args = _bound(op)
    x, x_scale, x_zero, x_type = _activation(args["input"])
    weight_dq = args["weight"]
    weight, w_scale, w_zero = _weight(weight_dq, constant)
    if weight.dim() != (2 if name == _LINEAR else len(_shape(x))):
        raise _NoMatch("an unbatched convolution input, or a linear weight that is not a matrix")
    bias = args.get("bias")
    bias_value = None
    if bias is not None:
        bias_value = constant(bias) if isinstance(bias, torch.fx.Node) else None
        if bias_value is None or not bias_value.is_floating_point():
            raise _NoMatch("the bias is not a float constant")
    out_scale, out_zero, quant_min, quant_max, dtype = output
    channels = weight.shape[0]
    accumulator_scale = (x_scale * w_scale).expand(channels)  # float64, one per output channel
    bias_q = None
    if bias_value is not None:
        bias_q = torch.round(bias_value.double().reshape(-1) / accumulator_scale)
    # The largest accumulator any input reaches: |x - x_zero| at most `reach`, per channel.
    reach = _reach(x_type, x_zero)
    centered = (weight.to(torch.float64) - w_zero.reshape(-1, *[1] * (weight.dim() - 1))).abs()
    most = centered.reshape(channels, -1).sum(1) * reach + (bias_q.abs() if bias_q is not None else 0)
    if most.max().item() >= _ACCUMULATOR_LIMIT:
        raise _NoMatch("the int32 accumulator could overflow")
    multipliers = [_multiplier(float(s) / out_scale) for s in accumulator_scale]
    per_channel = w_scale.numel() > 1
    if per_channel:
        multiplier: torch.Tensor | int = torch.tensor([m for m, _ in multipliers], dtype=torch.int32)
        shift: torch.Tensor | int = torch.tensor([s for _, s in multipliers], dtype=torch.int32)
    else:
        multiplier, shift = multipliers[0]
    w_zero_arg: torch.Tensor | int = int(w_zero[0]) if bool((w_zero == w_zero[0]).all()) else w_zero.to(torch.int32)
    bias_arg = bias_q.to(torch.int32) if bias_q is not None else None
    head = [
        x,
        x_zero,
        weight_dq.args[0],
        w_zero_arg,
        bias_arg,
        multiplier,
        shift,
        out_zero,
        quant_min,
        quant_max,
        dtype,
    ]
    chain = Chain(LINEAR, head, op, dequantizes=[args["input"], weight_dq])
    if name in _CONVOLUTIONS:
        chain.opcode = CONVOLUTION
        chain.args = head + [_ints(args[k]) for k in ("stride", "padding", "dilation")] + [int(args["groups"])]
    return chain


def _matmul(op: torch.fx.Node, output: tuple) -> Chain:
    args = list(op.args)
    if len(args) != 2 or op.kwargs:
        raise _NoMatch("unexpected arguments")
    a, a_scale, a_zero, a_type = _activation(args[0])
    b, b_scale, b_zero, b_type = _activation(args[1])
    depth = _shape(args[0])[-1] if _shape(args[0]) else None
    if type(depth) is not int or depth * _reach(a_type, a_zero) * _reach(b_type, b_zero) >= _ACCUMULATOR_LIMIT:
        raise _NoMatch("the int32 accumulator could overflow (or the inner size is dynamic)")
    out_scale, out_zero, quant_min, quant_max, dtype = output
    multiplier, shift = _multiplier(a_scale * b_scale / out_scale)
    head = [a, b, a_zero, b_zero, multiplier, shift, out_zero, quant_min, quant_max, dtype]
    # _activation took both for dequantize nodes.
    return Chain(MATMUL, head, op, dequantizes=[cast(torch.fx.Node, args[0]), cast(torch.fx.Node, args[1])])


def _add(op: torch.fx.Node, output: tuple) -> Chain:
    """TFLite's int8 add: both inputs to twice the larger scale, summed, requantized."""
    args = list(op.args)
    if len(args) != 2 or any(k != "alpha" or v != 1 for k, v in op.kwargs.items()):
        raise _NoMatch("an add with alpha")
    a, a_scale, a_zero, a_type = _activation(args[0])
    b, b_scale, b_zero, b_type = _activation(args[1])
    if max(_reach(a_type, a_zero), _reach(b_type, b_zero)) * 2**qkernels.ADD_LEFT_SHIFT >= _ACCUMULATOR_LIMIT // 2:
        raise _NoMatch("a zero point too far from the integer range")
    out_scale, out_zero, quant_min, quant_max, dtype = output
    twice = 2 * max(a_scale, b_scale)
    a_mult = _multiplier(a_scale / twice)
    b_mult = _multiplier(b_scale / twice)
    out_mult = _multiplier(twice / (2**qkernels.ADD_LEFT_SHIFT * out_scale))
    head = [a, b, a_zero, b_zero, *a_mult, *b_mult, *out_mult, out_zero, quant_min, quant_max, dtype]
    # _activation took both for dequantize nodes.
    return Chain(ADD, head, op, dequantizes=[cast(torch.fx.Node, args[0]), cast(torch.fx.Node, args[1])])


# --- the pieces of a chain ------------------------------------------------------------------------


def _multiplier(real: float) -> tuple[int, int]:
    try:
        return qkernels.quantize_multiplier(float(real))
    except ValueError as exc:
        raise _NoMatch(str(exc)) from None


def _qparams(node: object, name: str) -> tuple:
    """(input, scale, zero point, quant_min, quant_max, dtype) of a per-tensor quantize or dequantize."""
    if not isinstance(node, torch.fx.Node) or _name(node) != name:
        raise _NoMatch(f"not a {name}")
    if len(node.args) != 6 or any(v is not None for v in node.kwargs.values()):
        raise _NoMatch("unexpected arguments")
    value, scale, zero_point, quant_min, quant_max, dtype = node.args
    if not (type(scale) is float and scale > 0 and all(type(v) is int for v in (zero_point, quant_min, quant_max))):
        raise _NoMatch("quantization parameters not fixed in the program")
    if dtype not in _INTEGERS or not isinstance(value, torch.fx.Node):
        raise _NoMatch(f"{dtype} has no integer kernel")
    return value, scale, zero_point, quant_min, quant_max, dtype


def _activation(node: object) -> tuple[torch.fx.Node, float, int, torch.dtype]:
    """An activation's integers, scale, zero point and dtype: the input of its dequantize."""
    value, scale, zero_point, _, _, dtype = _qparams(node, _DQ)
    found = value.meta.get("val")
    if not isinstance(found, torch.Tensor) or found.dtype != dtype:
        raise _NoMatch("the dequantized value is not of the declared dtype")
    return value, scale, zero_point, dtype


def _weight(
    node: object, constant: Callable[[torch.fx.Node], torch.Tensor | None]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight's integers (a constant) and its scales and zero points (float64, int64; one per output channel)."""
    if not isinstance(node, torch.fx.Node):
        raise _NoMatch("the weight is not dequantized")
    if _name(node) == _DQ:
        value, scale, zero_point, _, _, dtype = _qparams(node, _DQ)
        scales, zeros = torch.tensor([scale], dtype=torch.float64), torch.tensor([zero_point])
    elif _name(node) == _DQ_CHANNEL:
        if len(node.args) != 7 or any(v is not None for v in node.kwargs.values()):
            raise _NoMatch("unexpected arguments")
        value, scale_node, zero_node, axis, _, _, dtype = node.args
        found = [constant(n) if isinstance(n, torch.fx.Node) else None for n in (scale_node, zero_node)]
        if axis != 0 or found[0] is None or found[1] is None:
            raise _NoMatch("per-channel parameters are not constants along the output channels")
        scales, zeros = found[0].to(torch.float64).reshape(-1), found[1].to(torch.int64).reshape(-1)
    else:
        raise _NoMatch("the weight is not dequantized")
    weight = constant(value) if isinstance(value, torch.fx.Node) else None
    if weight is None or weight.dtype != dtype or dtype not in _INTEGERS or weight.dim() < 2:
        raise _NoMatch("the weight is not an integer constant")
    if scales.numel() not in (1, weight.shape[0]) or zeros.numel() != scales.numel() or not bool((scales > 0).all()):
        raise _NoMatch("per-channel parameters do not match the weight's output channels")
    return weight, scales, zeros.expand(weight.shape[0])


def _reach(dtype: torch.dtype, zero_point: int) -> int:
    """The largest ``|q - zero_point|`` of any value ``q`` of ``dtype``."""
    low, high = _INTEGERS[dtype]
    return max(abs(low - zero_point), abs(high - zero_point))


def _bound(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = _compat.op_schema(node.target)
    if schema is None:
        raise _NoMatch("not an operator overload")
    bound: dict[str, Any] = {}
    for i, argument in enumerate(schema.arguments):
        if i < len(node.args):
            bound[argument.name] = node.args[i]
        elif argument.name in node.kwargs:
            bound[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
        else:
            raise _NoMatch(f"argument {argument.name!r} is missing")
    return bound


def _ints(value: object) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    ints = [v for v in values if type(v) is int]
    if len(ints) != len(values):
        raise _NoMatch("sizes that are not fixed integers")
    return ints


def _shape(node: object) -> tuple:
    found = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(found.shape) if isinstance(found, torch.Tensor) else ()


def _name(node: object) -> str:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return ""
    return str(node.target) if _compat.is_op_overload(node.target) else ""
