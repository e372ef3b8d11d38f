"""The executorch backend on its own: lowering to .pte, kernels the runtime lacks, runtime errors, faults.

The whole suite runs against it with ``make suite-executorch`` (see
backends/executorch/README.md); these tests pin what the suite does not:
the ``aten::sort`` rejection at the user's line, the runtime error text,
the compile spec and the blob reader. Lowering costs seconds, so each model
is lowered once per module.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.runtime", reason="install ExecuTorch: make .venv/.installed-executorch")
pytest.importorskip("backendconf_executorch", reason="install the backend: pip install -e backends/executorch")

import pytest_backendconf as bc
from backendconf_executorch import blob
from backendconf_executorch.lowering import parse_spec

BACKEND = "executorch"


class Sorter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x).relu()
        return torch.sort(y, dim=-1).values + 1


class Gatherer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, table, index):
        picked = torch.index_select(table, 0, index)
        return self.linear(picked).relu()


X = torch.randn(2, 4)
TABLE = torch.randn(5, 3)
INDEX = torch.tensor([0, 4])


@pytest.fixture(scope="module")
def gatherer():
    model = Gatherer().eval()
    return model, bc.to_backend(model, BACKEND, {"forward": {}}, example_inputs=(TABLE, INDEX))


def test_sort_is_rejected_at_lowering_at_the_users_line():
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(Sorter(), BACKEND, {"forward": {}}, example_inputs=(X,))
    text = str(caught.value)
    assert "ExecuTorch's runtime has no kernel 'aten::sort.values'" in text
    assert "return torch.sort(y, dim=-1).values + 1" in text
    assert "top(Sorter)::forward.aten::sort" in text
    assert caught.value.node.name == "sort"


def test_the_lowered_module_matches_eager_and_names_its_instructions(gatherer):
    model, lowered = gatherer
    torch.testing.assert_close(lowered(TABLE, INDEX), model(TABLE, INDEX))
    header, pte = blob.decode(lowered.lowered.blobs["forward"])
    whats = [i.what for i in header.instructions]
    assert "kernel aten::index_select.out" in whats and "delegate XnnpackBackend" in whats
    delegate = header.instructions[whats.index("delegate XnnpackBackend")]
    assert set(delegate.nodes) >= {"linear", "relu"}
    assert pte[4:8] == b"ET12"  # the ExecuTorch flatbuffer's file identifier


def test_a_kernel_failure_names_the_kernel_and_the_users_line(gatherer):
    _, lowered = gatherer
    with pytest.raises(bc.BackendRuntimeError) as caught:
        lowered(TABLE, torch.tensor([0, 7]))
    text = str(caught.value)
    assert "kernel aten::index_select.out (FX node 'index_select')" in text
    assert "picked = torch.index_select(table, 0, index)" in text


def test_portable_kernels_only_has_no_delegate():
    model = Gatherer().eval()
    lowered = bc.to_backend(model, BACKEND, {"forward": {"partitioners": []}}, example_inputs=(TABLE, INDEX))
    header, _ = blob.decode(lowered.lowered.blobs["forward"])
    assert header.partitioners == ()
    assert not any(i.what.startswith("delegate") for i in header.instructions)
    torch.testing.assert_close(lowered(TABLE, INDEX), model(TABLE, INDEX))


def test_compile_spec_mistakes_name_the_key():
    assert parse_spec({}) == (("xnnpack",), None)
    with pytest.raises(ValueError, match="unknown compile-spec key 'partitioner' for the executorch backend"):
        parse_spec({"partitioner": ["xnnpack"]})
    with pytest.raises(ValueError, match=r"'partitioners' must be a list of \['xnnpack'\]"):
        parse_spec({"partitioners": ["qnn"]})
    with pytest.raises(ValueError, match="must be {'node': '<FX node name>'}"):
        parse_spec({"__backendconf_fault__": "mul"})


def test_a_bad_blob_is_refused_by_name():
    header = blob.Header("forward", (True,), (("tensor", "float32"),), (), ("xnnpack",))
    data = blob.encode(header, b"not a program")
    assert blob.decode(data) == (header, b"not a program")
    with pytest.raises(ValueError, match="not a valid executorch backend blob"):
        blob.decode(b"\x89BCORT\r\n" + data[8:])
    with pytest.raises(ValueError, match="CRC-32 checksum mismatch"):
        blob.decode(data[:-1] + b"X")
    with pytest.raises(ValueError, match="truncated or padded"):
        blob.decode(data[:-1])


class SlicedLinear(torch.nn.Module):
    """A linear layer on the first 32 features of its input (backends/executorch/repro/linear_sliced_input_bmm.py)."""

    def __init__(self):
        super().__init__()
        self.square = torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.square(x[..., :32])


def test_a_pass_that_raises_is_reported_with_its_cause():
    # XNNPACK's ConvertToLinearPass fails on a weight-only int4 linear of a sliced 3-d input; ExecuTorch's
    # pass manager wraps the error in one that names the pass only, and the text must carry the cause.
    pytest.importorskip("torchao", reason="install torchao==0.18.0: make .venv/.installed-executorch")
    from pytest_backendconf.quant import quantize_llm

    model = quantize_llm(SlicedLinear().eval(), "int4-weight-only-g32")
    with pytest.raises(bc.CompilerError) as caught:
        bc.to_backend(model, BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3, 64),))
    text = str(caught.value)
    # The error names no node; built node by node, the linear fails alone (its weights kept as they are).
    assert text.startswith("The node of aten::linear failed in this compiler, which claims it.")
    assert "An error occurred when running the 'ConvertToLinearPass' pass" in text
    assert "(caused by RuntimeError: t() expects a tensor with <= 2 dimensions, but self is 3D)" in text


class TrainingBatchNorm(torch.nn.Module):
    def forward(self, x, weight, bias, mean, var):
        return torch.ops.aten.native_batch_norm.default(x, weight, bias, mean, var, True, 0.1, 1e-5)[0]


class UnbindVector(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aten.unbind_copy.int(x, 0)


def test_an_op_the_edge_dialect_refuses_is_unsupported():
    # ExecuTorch's verifier refuses the op it decomposes to (not in the Core ATen opset): not claimed.
    args = (torch.randn(2, 3, 4), torch.randn(3), torch.randn(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(TrainingBatchNorm(), BACKEND, {"forward": {}}, example_inputs=args)
    text = str(caught.value)
    assert text.startswith("The node of aten::native_batch_norm is not supported in this compiler.")
    assert "SpecViolationError: Operator torch._ops.aten._native_batch_norm_legit_functional.default" in text


def test_an_internal_error_of_the_lowering_is_a_compiler_failure_at_the_node():
    with pytest.raises(bc.CompilerError) as caught:
        bc.to_backend(UnbindVector(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(3),))
    text = str(caught.value)
    assert text.startswith("The node of aten::unbind_copy failed in this compiler, which claims it.")
    assert "Diagnostic: ExecuTorch could not lower the program: InternalError: len() of a 0-d tensor" in text
