"""The reference quantizer: int8 PT2E annotations on torchao's public quantizer API.

It annotates the ops an NPU runs in int8 the way the common delegate
quantizers do (symmetric int8 weights, asymmetric int8 activations, float
bias): convolutions and linear layers (input, weight, output), matmuls
and adds (both inputs, output), and ReLU and pooling (input, output).
The dynamic scheme quantizes only the activations of convolutions, linear
layers and matmuls, at run time (``choose_qparams``), and leaves outputs
float.
Observers are min/max ones: deterministic, and fast enough to calibrate
every model of the zoo in the suite's time budget.

A backend's own ``quantizer(scheme)`` replaces it (docs/writing-a-backend.md).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

#: The pinned schemes, in the order checks are generated.
SCHEMES = ("int8-static-per-tensor", "int8-static-per-channel", "int8-dynamic")

aten = torch.ops.aten
#: (input, weight) ops: the weight gets the weight spec, the input the activation spec.
_WEIGHTED = (aten.conv1d.default, aten.conv2d.default, aten.linear.default)
#: Matmuls: both arguments are activations (quantized dynamically too).
_MATMULS = (aten.matmul.default, aten.bmm.default, aten.mm.default)
#: Ops whose first two arguments are activations (where they are float tensors).
_BINARY = (*_MATMULS, aten.add.Tensor)
#: Ops whose first argument is an activation.
_UNARY = (aten.relu.default, aten.max_pool2d.default, aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default)
#: The smallest scale an observer gives (a constant input would otherwise get scale 0).
_EPS = 2.0**-12


def reference_quantizer(scheme: str) -> Any:
    """The project's PT2E quantizer for ``scheme`` (one of `SCHEMES`); a ValueError names the schemes.

    A torchao ``Quantizer`` (torchao ships no type information: ``Any``).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    return _quantizer_class()(scheme)


@functools.lru_cache(maxsize=1)
def _quantizer_class() -> type:
    from ._flow import _import_pt2e

    _import_pt2e()  # quietly, before the quantizer module imports torchao
    from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver, PlaceholderObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer

    activation = QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=_EPS),
    )
    dynamic = QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        is_dynamic=True,
        observer_or_fake_quant_ctr=PlaceholderObserver.with_args(eps=_EPS),
    )
    per_tensor = QuantizationSpec(
        dtype=torch.int8,
        quant_min=-127,
        quant_max=127,
        qscheme=torch.per_tensor_symmetric,
        observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=_EPS, qscheme=torch.per_tensor_symmetric),
    )
    per_channel = QuantizationSpec(
        dtype=torch.int8,
        quant_min=-127,
        quant_max=127,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(
            eps=_EPS, ch_axis=0, qscheme=torch.per_channel_symmetric
        ),
    )

    class ReferenceQuantizer(Quantizer):
        """int8 PT2E annotations for one scheme of `SCHEMES`."""

        def __init__(self, scheme: str) -> None:
            super().__init__()
            self.scheme = scheme

        def __repr__(self) -> str:
            return f"ReferenceQuantizer({self.scheme!r})"

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            is_dynamic = self.scheme == "int8-dynamic"
            weight = per_tensor if self.scheme == "int8-static-per-tensor" else per_channel
            act = dynamic if is_dynamic else activation
            for node in model.graph.nodes:
                if node.op != "call_function":
                    continue
                if node.target in _WEIGHTED:
                    if not (_float_tensor(node.args[0]) and _float_tensor(node.args[1])):
                        continue
                    inputs = {node.args[0]: act, node.args[1]: weight}
                elif node.target in (_MATMULS if is_dynamic else _BINARY + _UNARY):
                    args = node.args[:2] if node.target in _BINARY else node.args[:1]
                    if not args or not all(_float_tensor(a) for a in args):
                        continue
                    inputs = {a: act for a in args}
                else:
                    continue
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map=inputs, output_qspec=None if is_dynamic else activation, _annotated=True
                )
            return model

        def validate(self, model: torch.fx.GraphModule) -> None:
            pass

    return ReferenceQuantizer


def _float_tensor(arg: object) -> bool:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32
