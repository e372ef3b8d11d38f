"""judge_layers: a static Q/DQ program's layers, each run alone on the backend against eager fed the same integers.

The reference backend's integer kernels land on a neighbouring step now and
then in each layer and pass; a backend that truncates, drops a zero point or
scales the wrong channel axis fails at the first layer it touches, named. A
piece keeps the program's weights as constants, so a compiler that fuses a
quantized convolution over a constant weight fuses it in the piece too.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao", reason="quantizing needs the [quant] extra (torchao)")

from backendconf_reference import ReferenceBackend
from broken_backends_quantized import DroppedZeroPoint, EagerQDQ, TruncatingQuantize, WrongChannelAxis
from torch.export.graph_signature import InputKind

from pytest_backendconf.diagnostics import judge_layers
from pytest_backendconf.diagnostics._divergence import eager_intermediates, piece_program
from pytest_backendconf.diagnostics._layers import _layer_nodes
from pytest_backendconf.quant import QuantizedRule, quantize, reference_quantizer
from pytest_backendconf.reference import bytecode, ops


class Deep(torch.nn.Module):
    """Four convolutions with ReLUs, a residual add and a linear layer: eleven requantizations."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, 8, 3, padding=1) for c in (3, 8, 8, 8))
        self.linear = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.convs[0](x))
        y = torch.relu(self.convs[1](x))
        y = torch.relu(self.convs[2](y)) + x
        y = torch.relu(self.convs[3](y))
        return self.linear(y.mean((2, 3)))


def _program(scheme: str):
    torch.manual_seed(0)
    model = Deep().eval()
    x = torch.randn(4, 3, 12, 12)
    calibration = [((torch.randn(4, 3, 12, 12),), {}) for _ in range(4)]
    converted = quantize(torch.export.export(model, (x,)).module(), reference_quantizer(scheme), calibration)
    return torch.export.export(converted, (x,)), torch.randn(4, 3, 12, 12)


def _quantize_nodes(program) -> list:
    return [
        n
        for n in program.graph_module.graph.nodes
        if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default
    ]


@pytest.mark.parametrize("scheme", ["int8-static-per-tensor", "int8-static-per-channel"])
def test_the_reference_backends_integer_kernels_pass_layer_by_layer(scheme):
    program, x = _program(scheme)
    verdict = judge_layers(program, ReferenceBackend(), [x], QuantizedRule(), top_class="Deep")
    assert verdict.judged and verdict.passed, verdict.summary()
    quantizes = [n.name for n in _quantize_nodes(program)]
    assert [layer.node for layer in verdict.layers][: len(quantizes)] == quantizes
    assert all(layer.max_steps <= 1 for layer in verdict.layers)
    assert "is within the rule" in verdict.summary() and f"{len(verdict.layers)} layers" in verdict.summary()
    # Eager running the Q/DQ program node by node is each layer's reference itself.
    exact = judge_layers(program, EagerQDQ(), [x], QuantizedRule(), top_class="Deep")
    assert exact.passed and all(layer.max_steps == 0 for layer in exact.layers)


def test_a_piece_keeps_the_programs_weights_so_the_kernels_fuse():
    program, x = _program("int8-static-per-channel")
    graph = program.graph_module.graph
    conv = next(n for n in graph.nodes if n.target == torch.ops.aten.conv2d.default)
    (quantize_node,) = conv.users  # dequantize x, dequantize w -> conv2d -> quantize
    layer = [n for n in graph.nodes if n in _layer_nodes(quantize_node, set(_quantize_nodes(program)))]
    assert len(layer) == 4, layer
    env = eager_intermediates(program, [x])
    piece, inputs, _ = piece_program(layer, env, program=program, outputs=[quantize_node])
    kinds = [spec.kind for spec in piece.graph_signature.input_specs]
    assert kinds.count(InputKind.USER_INPUT) == len(inputs) == 1
    # The weights are the program's own, of the same kinds and names (a parameter stays a parameter).
    weights = {(s.kind, s.target) for s in piece.graph_signature.input_specs if s.kind != InputKind.USER_INPUT}
    assert weights and weights <= {(s.kind, s.target) for s in program.graph_signature.input_specs}
    from pytest_backendconf.debuginfo import DebugHandleRecorder

    blob = ReferenceBackend().preprocess(piece, {}, DebugHandleRecorder().assign(piece.graph_module))
    names = [ops.BY_OPCODE[i.opcode].name for i in bytecode.decode(blob).blocks[0].instructions]
    assert names == ["reference.quantized_convolution"], names
    # Without the program, the weights are inputs: the chain runs literally.
    literal, _, _ = piece_program(layer, env, outputs=[quantize_node])
    blob = ReferenceBackend().preprocess(literal, {}, DebugHandleRecorder().assign(literal.graph_module))
    assert "aten.conv2d.default" in [ops.BY_OPCODE[i.opcode].name for i in bytecode.decode(blob).blocks[0].instructions]


@pytest.mark.parametrize(
    ("backend", "scheme", "first_op"),
    [
        # Truncation is wrong from the first requantization on: the input's own quantize.
        (TruncatingQuantize, "int8-static-per-tensor", "quantize_per_tensor"),
        # Without the zero point the first convolution's input is off by it.
        (DroppedZeroPoint, "int8-static-per-tensor", "conv2d"),
        # Per-channel scales along the input axis: the first convolution's weights are wrong.
        (WrongChannelAxis, "int8-static-per-channel", "conv2d"),
    ],
)
def test_a_broken_backend_fails_at_the_first_layer_it_touches(backend, scheme, first_op):
    program, x = _program(scheme)
    verdict = judge_layers(program, backend(), [x], QuantizedRule(), top_class="Deep")
    assert verdict.judged and not verdict.passed
    failing = verdict.failing
    assert failing is verdict.layers[0 if first_op == "quantize_per_tensor" else 1], [
        lay.text() for lay in verdict.layers
    ]
    assert first_op in failing.ops and failing.share_off > QuantizedRule().max_share
    text = failing.text()
    assert text.startswith(f"layer ending at node '{failing.node}' (") and "elements off by >= 1 step" in text
    if first_op == "conv2d":  # the input's quantize has no source line of the model
        assert "test_quantized_layers.py:" in text and "self.convs[0](x)" in text, text


def test_a_dynamic_program_is_not_cut_into_layers():
    program, x = _program("int8-dynamic")
    verdict = judge_layers(program, ReferenceBackend(), [x], QuantizedRule(), top_class="Deep")
    assert not verdict.judged and not verdict.passed and "run time" in verdict.reason
    assert verdict.summary().startswith("the layers could not be judged alone: ")
