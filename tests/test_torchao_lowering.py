"""torchao's LLM quantization (``quantize_``: int8 and int4 weight-only, 8da4w) lowers, whole and in partitions.

The weights are tensor subclasses; the lowering unwraps them into plain
parameters (``l.weight.qdata``, ``.scale``, ``.zero_point``) before
partitioning, and the reference backend runs ``torchao.dequantize_affine``,
``quantize_affine`` and ``choose_qparams_affine`` with kernels of its own,
which must equal torchao's on every block layout the configs make.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchao", reason="torchao's quantize_ needs the [quant] extra")

import pytest_backendconf as bc
from pytest_backendconf.errors import LoweringError
from pytest_backendconf.lowering._subclasses import ACCESS, unwrap_tensor_subclasses
from pytest_backendconf.reference import affine

from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerGroup

CONFIGS = {
    "int8-weight-only": lambda: Int8WeightOnlyConfig(),
    "int4-weight-only-g32": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    "8da4w-g32": lambda: Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(32)
    ),
}


class LinearRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(64, 16)

    def forward(self, x):
        return torch.relu(self.l(x))


def quantized(config: str) -> torch.nn.Module:
    torch.manual_seed(0)
    module = LinearRelu().eval()
    quantize_(module, CONFIGS[config]())
    return module


X = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("partition", [None, "supported", "relu-only"])
def test_a_torchao_quantized_module_lowers_and_matches_eager(config, partition):
    module = quantized(config)
    how = (lambda node: node.target is torch.ops.aten.relu.default) if partition == "relu-only" else partition
    lowered = bc.to_backend(module, "reference", {"forward": {}}, example_inputs=(X,), partition=how)
    # The weights are dequantized exactly as torchao does: the same float program, to the bit.
    torch.testing.assert_close(lowered(X), module(X), rtol=0, atol=0)
    records = bc.delegation(lowered)
    if partition == "relu-only":  # the dequantize and the linear layer ran on the CPU fallback
        assert len(records["forward"].delegated) == 1


@pytest.mark.parametrize("config", CONFIGS)
def test_the_backend_receives_plain_integer_weights_named_by_their_parts(config):
    module = quantized(config)
    program = torch.export.export(module, (X,))
    assert any(str(n.target) == ACCESS for n in program.graph.nodes)
    unwrapped = unwrap_tensor_subclasses(program)
    assert not any(str(n.target) == ACCESS for n in unwrapped.graph.nodes)
    state = unwrapped.state_dict
    assert {"l.weight.qdata", "l.weight.scale", "l.weight.zero_point"} <= set(state)
    assert "l.weight" not in state and state["l.weight.qdata"].dtype == torch.int8
    assert type(state["l.weight.qdata"]) is torch.nn.Parameter
    # The caller's program is left as it was: the suite lowers one program many times.
    assert any(str(n.target) == ACCESS for n in program.graph.nodes)
    torch.testing.assert_close(unwrapped.module()(X), module(X), rtol=0, atol=0)


@pytest.mark.slow  # a fresh process
def test_a_saved_archive_runs_without_torchao(tmp_path):
    module = quantized("8da4w-g32")
    path = tmp_path / "q.bcpt"
    bc.save(bc.to_backend(module, "reference", {"forward": {}}, example_inputs=(X,)), path)
    torch.save(X, tmp_path / "x.pt")
    code = (
        "import sys, torch\n"
        "sys.modules['torchao'] = None  # the target has no torchao\n"
        "import pytest_backendconf as bc\n"
        f"y = bc.load({str(path)!r})(torch.load({str(tmp_path / 'x.pt')!r}))\n"
        f"torch.save(y, {str(tmp_path / 'y.pt')!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), module(X), rtol=0, atol=0)


@pytest.mark.slow  # a fresh process
def test_lowering_a_plain_module_does_not_import_torchao():
    code = (
        "import sys, torch\nimport pytest_backendconf as bc\n"
        "m = torch.nn.Linear(4, 2).eval()\n"
        "bc.to_backend(m, 'reference', {'forward': {}}, example_inputs=(torch.randn(1, 4),))\n"
        "print('torchao' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.split()[-1] == "False"


def test_a_subclass_weight_used_whole_is_refused_naming_it():
    program = torch.export.export(quantized("int4-weight-only-g32"), (X,))
    graph = program.graph
    weight = next(n for n in graph.find_nodes(op="placeholder") if n.name == "p_l_weight")
    output = graph.output_node()
    with graph.inserting_before(output):
        whole = graph.call_function(torch.ops.aten.clone.default, (weight,))
    output.args = ((*output.args[0], whole),)
    with pytest.raises(LoweringError) as caught:
        unwrap_tensor_subclasses(program)
    text = str(caught.value)
    assert (
        "parameter 'l.weight' is a IntxUnpackedToInt8Tensor" in text and "'clone_default' (aten.clone.default)" in text
    )
    assert "run_decompositions()" in text


# --- the kernels against torchao's own ops ---------------------------------------------------------

ao = torch.ops.torchao


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("mapping", ["SYMMETRIC", "ASYMMETRIC"])
@pytest.mark.parametrize(("dtype", "low", "high"), [(torch.int8, -8, 7), (torch.int8, -128, 127)])
def test_the_kernels_equal_torchaos_ops_per_group(group, mapping, dtype, low, high):
    w = torch.randn(24, 256, generator=torch.Generator().manual_seed(group))
    block = [1, group]
    expected = ao.choose_qparams_affine.default(w, mapping, block, dtype, low, high, None, None, torch.int8)
    found = affine.choose_qparams_affine(w, mapping, block, dtype, low, high, None, None, torch.int8)
    torch.testing.assert_close(found, expected, rtol=0, atol=0)
    scale, zero = expected
    q = ao.quantize_affine.default(w, block, scale, zero, dtype, low, high)
    torch.testing.assert_close(affine.quantize_affine(w, block, scale, zero, dtype, low, high), q, rtol=0, atol=0)
    if mapping == "ASYMMETRIC":
        assert bool((zero != 0).any())  # the zero point matters in these
    dq = ao.dequantize_affine.default(q, block, scale, zero, dtype, low, high)
    torch.testing.assert_close(affine.dequantize_affine(q, block, scale, zero, dtype, low, high), dq, rtol=0, atol=0)


def test_per_token_activation_parameters_equal_torchaos():
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3)) * torch.arange(1, 11).reshape(2, 5, 1)
    block = [1, 1, 64]
    args = (x, "ASYMMETRIC", block, torch.int8, -128, 127, None, None, torch.int8)
    expected = ao.choose_qparams_affine.default(*args)
    torch.testing.assert_close(affine.choose_qparams_affine(*args), expected, rtol=0, atol=0)
    assert expected[0].shape == (2, 5) and len(set(expected[0].flatten().tolist())) == 10  # one per token


def test_a_block_that_does_not_divide_the_tensor_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"block size 32 does not divide the tensor's size 48"):
        affine.dequantize_affine(torch.zeros(2, 48, dtype=torch.int8), [1, 32], torch.ones(2, 2), None, torch.int8)


def test_torchao_refuses_an_in_features_that_is_not_a_multiple_of_the_group():
    # Why the quantized category has no such layer: torchao 0.18 quantizes none.
    for config in (CONFIGS["int4-weight-only-g32"], CONFIGS["8da4w-g32"]):
        with pytest.raises(AssertionError, match="divisible"):
            quantize_(torch.nn.Sequential(torch.nn.Linear(48, 8)), config())


def test_an_input_named_like_a_builtin_keeps_its_name_through_the_unwrap():
    # A Sequential's forward takes `input`; copying the graph renames that placeholder.
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(128, 8)).eval()
    quantize_(module, Int8WeightOnlyConfig(granularity=PerGroup(32)))
    x = torch.randn(2, 3, 128)
    lowered = bc.to_backend(module, "reference", {"forward": {}}, example_inputs=(x,))
    torch.testing.assert_close(lowered(x), module(x), rtol=0, atol=0)
