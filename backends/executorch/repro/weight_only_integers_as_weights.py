"""XNNPACK takes a weight-only quantized linear's integers as its float weights: scales, zero points and bias dropped.

torchao's weight-only configs leave the activations in float and
dequantize the weight inside ``F.linear``. The linear reaches XNNPACK's
partitioner decomposed: ``Int8WeightOnlyConfig`` writes
``mm(x, qdata.T.to(float)) * scale + bias`` (per row) or
``mm(x, dequantize_affine(qdata, scale, zero_point).T) + bias`` (in groups);
``IntxWeightOnlyConfig`` writes ``linear(x, dequantize_affine(...), bias)``,
which XNNPACK's ``LinearConfig`` declines ("Expected act input to be dequant
node": a dequantized weight with float activations is no precision it
knows), so ExecuTorch decomposes it into ``permute`` + ``addmm``. XNNPACK's
``AddmmConfig``/``MMConfig`` then take the whole ``nn.Linear`` source
partition as an fp32 linear, finding its weight by walking the
``mm``/``addmm``'s weight argument back to the first static parameter: the
int8 ``qdata``. ``ConvertToLinearPass`` rebuilds ``linear(x, qdata)`` the same
way and replaces the partition's output with it, so the cast, the
dequantization (scales, zero points) and, in the ``mm`` forms, the bias are
gone. The program lowers and runs, and its outputs are ``x @ qdata.T``: no
error, no warning.

Unit inputs read the weights back: ExecuTorch's weight matrix is the
integers exactly. With no partitioner, ExecuTorch's portable kernels run
the per-row int8 program right, and cannot run the grouped ones at all
(``torchao::dequantize_affine`` has no out variant). 8da4w, whose linear
XNNPACK takes as a dynamically quantized one, is right to within its
activation quantization. Nor does a setting of the partitioner help (the last
cases): with ``force_non_static_weights_for_f32_linear`` the per-row program
fails in ``ConvertToLinearPass``; restricted to its quantized precisions (no
fp32 at all), XNNPACK still takes the linear and drops the scale.
"""

import torch
from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    MappingType,
)
from torchao.quantization.granularity import PerGroup

from executorch_alone import compare, quantized

CONFIGS = {
    "Int8WeightOnlyConfig() (one scale per row)": Int8WeightOnlyConfig(),
    "Int8WeightOnlyConfig(granularity=PerGroup(32))": Int8WeightOnlyConfig(granularity=PerGroup(32)),
    "IntxWeightOnlyConfig(int4, PerGroup(32))": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    "IntxWeightOnlyConfig(int4, PerGroup(32), ASYMMETRIC)": IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(32), mapping_type=MappingType.ASYMMETRIC
    ),
}
UNIT = torch.eye(128)  # row i of the output is column i of the weight matrix (no bias below)

for name, config in CONFIGS.items():
    torch.manual_seed(0)
    layer = quantized(torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False)), config)
    qdata = layer[0].weight.qdata.float()
    got = compare(f"{name}: Linear(128, 64) on unit inputs", layer, UNIT)
    if got is not None:
        print(f"  ExecuTorch's weights == qdata, the integers: {torch.equal(got.T, qdata)}")
    compare(f"{name}: Linear(128, 64) on unit inputs", layer, UNIT, xnnpack=False)

torch.manual_seed(0)
layer = quantized(torch.nn.Sequential(torch.nn.Linear(128, 64)), Int8WeightOnlyConfig())
x = torch.randn(4, 128)
got = compare("Int8WeightOnlyConfig(): Linear(128, 64) with bias, random inputs", layer, x)
if got is not None:
    qdata = layer[0].weight.qdata.float()
    print(f"  ExecuTorch's output == x @ qdata.T (no scale, no bias): {torch.allclose(got, x @ qdata.T, atol=1e-3)}")

torch.manual_seed(0)
config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32))
compare(
    "8da4w, PerGroup(32), for comparison: Linear(128, 64), random inputs",
    quantized(torch.nn.Linear(128, 64), config),
    x,
)

torch.manual_seed(0)
layer = quantized(torch.nn.Sequential(torch.nn.Linear(128, 64)), Int8WeightOnlyConfig())
compare("Int8WeightOnlyConfig()", layer, x, force_non_static_weights_for_f32_linear=True)
quantized_only = [ConfigPrecisionType.DYNAMIC_QUANT, ConfigPrecisionType.STATIC_QUANT]
compare("Int8WeightOnlyConfig()", layer, x, config_precisions=quantized_only)
