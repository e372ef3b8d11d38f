"""XNNPACK's ConvertToLinearPass raises on a weight-only int4 linear of a sliced 3-d input.

``IntxWeightOnlyConfig`` writes ``linear(x, dequantize_affine(...), bias)``,
which XNNPACK's ``LinearConfig`` declines (weight_only_integers_as_weights.py),
so ExecuTorch decomposes the linear. When its input is a 3-d tensor that
cannot be viewed as 2-d (``x[..., :128]`` of a ``[2, 5, 256]`` input), torch
decomposes ``linear`` through ``matmul`` into ``expand`` + ``bmm`` with the
weight expanded to ``[2, 128, 128]``. XNNPACK's ``BMMConfig`` takes that
``bmm``, and in its preprocessing ``ConvertToLinearPass``, which turns every
``mm``/``addmm``/``bmm`` of an ``nn.Linear`` source partition into a linear,
builds ``linear(expand(x), expand(weight))``; tracing it fails on the 3-d
weight (``t() expects a tensor with <= 2 dimensions``) and the lowering
raises. The same float linear lowers (``LinearConfig`` takes it whole), and
so does the quantized one on a contiguous input (wrong, as the script beside
this one shows).
"""

import torch
from torchao.quantization import IntxWeightOnlyConfig
from torchao.quantization.granularity import PerGroup

from executorch_alone import compare, quantized


class SlicedLinear(torch.nn.Module):
    """A linear layer on the first 128 features of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.square = torch.nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.square(x[..., :128])


x = torch.randn(2, 5, 256)
torch.manual_seed(0)
compare("float32 Linear(128, 128) on x[..., :128], x of [2, 5, 256]", SlicedLinear().eval(), x)
config = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
torch.manual_seed(0)
compare("IntxWeightOnlyConfig(int4, PerGroup(32)): the same on x[..., :128]", quantized(SlicedLinear(), config), x)
torch.manual_seed(0)
compare(
    "IntxWeightOnlyConfig(int4, PerGroup(32)): the same on a contiguous x[..., :128]",
    quantized(SlicedLinear(), config),
    x[..., :128].contiguous(),
)
