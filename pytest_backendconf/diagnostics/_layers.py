"""A quantized program judged layer by layer: each requantization against eager, fed the same integers.

A static Q/DQ program is a chain of layers, each ending in a
``quantize_per_tensor`` with fixed parameters: ``dequantize -> conv2d ->
relu -> quantize``, ``dequantize -> add -> quantize``, ... A backend that
runs each layer as an integer kernel (int32 accumulation, a fixed-point
multiplier) lands on the neighbouring integer now and then, where eager's
float arithmetic is within a hair of a half step; the next layer takes
that integer as input and carries the difference on, and twenty layers
later the model's output can be a step off on a third of its elements,
while no layer is wrong.

So when a quantized model's outputs are off by more than rounding
explains, each layer runs alone on the backend (`piece_program`: the
layer's nodes, the program's weights as constants, the integers entering
it fed from eager), and its integers are compared with eager's in steps:
the outputs' difference is rounding carried through the network only if
every layer is within the rule. A backend that truncates, drops a zero
point or scales the wrong channel axis moves a large share of the first
layer it touches, and that layer is named with its source line.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram

from ..debuginfo import DebugHandleRecorder, DebugInfo, build_debug_infos
from ..quant import QuantizedRule
from ..quant import DEQUANTIZE, RUNTIME_QPARAMS, errors_in_steps, implied_step, steps_off, within
from ._divergence import _where, eager_intermediates, run_on_backend

if TYPE_CHECKING:
    pass

#: A layer ends where its result is requantized with parameters fixed in the program.
_QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer run alone on the backend: where it ends and how far its result is from eager's."""

    node: str
    ops: tuple[str, ...]
    max_steps: float
    share_off: float
    numel: int
    passed: bool
    info: DebugInfo | None

    def text(self) -> str:
        chain = " -> ".join(self.ops)
        where = f" at {_where(self.info)}" if self.info is not None and self.info.frames else ""
        return (
            f"layer ending at node '{self.node}' ({chain}){where}: max {self.max_steps:.3g} steps, "
            f"{self.share_off:.1%} of {self.numel} elements off by >= 1 step"
        )


@dataclasses.dataclass(frozen=True)
class LayerVerdict:
    """Every layer of a program judged alone (``layers``), or why they could not be (``reason``)."""

    layers: tuple[Layer, ...] = ()
    reason: str = ""

    @property
    def judged(self) -> bool:
        return not self.reason

    @property
    def failing(self) -> Layer | None:
        return next((layer for layer in self.layers if not layer.passed), None)

    @property
    def passed(self) -> bool:
        return self.judged and self.failing is None

    def summary(self) -> str:
        """One line: how many layers, the worst of them."""
        if not self.judged:
            return f"the layers could not be judged alone: {self.reason}"
        worst = max(self.layers, key=lambda layer: (layer.max_steps, layer.share_off))
        return (
            f"each of its {len(self.layers)} layers, run alone on eager's integers, is within the rule "
            f"(the worst, '{worst.node}': max {worst.max_steps:.3g} steps, {worst.share_off:.1%} of elements "
            "off): the outputs' difference is rounding carried through the layers"
        )

    def json(self) -> dict[str, Any]:
        if not self.judged:
            return {"judged": False, "reason": self.reason}
        return {
            "judged": True,
            "layers": len(self.layers),
            "max_steps": max((layer.max_steps for layer in self.layers), default=0.0),
            "max_share_off": max((layer.share_off for layer in self.layers), default=0.0),
            "failing": self.failing.node if self.failing else None,
        }


def judge_layers(
    program: ExportedProgram,
    backend: Any,
    user_inputs: list,
    rule: QuantizedRule,
    *,
    top_class: str,
    method: str = "forward",
) -> LayerVerdict:
    """Each layer of a static Q/DQ program on the backend against eager, fed eager's own integers."""
    graph = program.graph_module.graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    if any(RUNTIME_QPARAMS in str(n.target) for n in calls):
        return LayerVerdict(reason="quantization parameters are chosen at run time (a dynamic scheme)")
    if any(a.op == "get_attr" for n in calls for a in n.all_input_nodes):
        return LayerVerdict(reason="the program holds control flow (subgraphs), which is not cut into layers")
    ends = [n for n in calls if str(n.target) == _QUANTIZE]
    if not ends:
        return LayerVerdict(reason="no quantize node with fixed parameters ends a layer")
    boundary = set(ends)
    output = next(n for n in graph.nodes if n.op == "output")
    # The outputs' own tails (the last dequantize, a float op after it) are layers too.
    ends += [n for n in output.all_input_nodes if n.op == "call_function" and n not in boundary]
    env = eager_intermediates(program, user_inputs)
    handles = DebugHandleRecorder().assign(program.graph_module)
    infos = {
        i.node: i for i in build_debug_infos(program.graph_module, handles, method=method, top_class=top_class).values()
    }
    order = {n: i for i, n in enumerate(graph.nodes)}
    layers = []
    for end in ends:
        nodes = sorted(_layer_nodes(end, boundary), key=order.__getitem__)
        try:
            [(_, actual, expected)] = run_on_backend(nodes, env, backend, program=program, outputs=[end])
        except Exception as exc:  # the backend cannot run this layer alone: no verdict on any
            return LayerVerdict(
                reason=f"the layer ending at '{end.name}' does not run alone: {type(exc).__name__}: {exc}"
            )
        got, want = (actual[0], expected[0]) if len(actual) == 1 else (None, None)
        if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or got.shape != want.shape:
            return LayerVerdict(reason=f"the layer ending at '{end.name}' gives another structure alone")
        most, off = _steps(end, got, want)
        numel = want.numel()
        layers.append(
            Layer(
                node=end.name,
                ops=tuple(_op_name(n) for n in nodes if not _is_dequantize(n) or n is end),
                max_steps=most,
                share_off=off / numel if numel else 0.0,
                numel=numel,
                passed=within(rule, most, off, numel),
                info=infos.get(end.name),
            )
        )
    return LayerVerdict(layers=tuple(layers))


def _layer_nodes(end: torch.fx.Node, boundary: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """``end`` and the nodes it is computed from, back to the quantize nodes ending earlier layers."""
    found: set[torch.fx.Node] = set()
    pending = [end]
    while pending:
        node = pending.pop()
        if node in found or node.op != "call_function" or (node in boundary and node is not end):
            continue
        found.add(node)
        pending.extend(node.all_input_nodes)
    return found


def _steps(end: torch.fx.Node, actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """The largest difference in steps and how many elements are off by a step or more."""
    if not expected.is_floating_point():  # a layer's integers: one step is one
        error = (actual.long() - expected.long()).abs().double()
    else:
        scale = end.args[1] if str(end.target) == DEQUANTIZE and isinstance(end.args[1], float) else None
        error = errors_in_steps(actual, expected, scale if scale is not None else implied_step(expected))
    if not error.numel():
        return 0.0, 0
    return error.max().item(), steps_off(error)


def _is_dequantize(node: torch.fx.Node) -> bool:
    return "dequantize" in str(node.target)


def _op_name(node: torch.fx.Node) -> str:
    """``aten.conv2d.default`` -> ``conv2d``."""
    if node.target is operator.getitem:
        return "getitem"
    parts = str(node.target).split(".")
    return parts[-2] if len(parts) > 1 else parts[0]
