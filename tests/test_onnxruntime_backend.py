"""The onnxruntime backend on its own: export, node → handle mapping, ORT errors, target side.

Every model is exported for real (``torch.onnx``) and run by ONNX Runtime on
the CPU. The whole conformance suite runs against this backend with
``pytest --backend=onnxruntime`` (see backends/onnxruntime/README.md); these
tests pin what the suite cannot see: that an ONNX Runtime failure inside the
engine comes back as the user's own source line.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime", reason="the onnxruntime backend needs onnxruntime (pip install onnxruntime)")
pytest.importorskip("onnxscript", reason="the onnxruntime backend exports with torch.onnx, which needs onnxscript")
pytest.importorskip("backendconf_onnxruntime", reason="install the backend: pip install -e backends/onnxruntime")

import pytest_backendconf as bc

from backendconf_onnxruntime import OnnxRuntimeBackend, blob
from engine_setup import host_only_imports, line_of
from engine_setup import prepared as _prepared

BACKEND = "onnxruntime"


# --- models --------------------------------------------------------------------------


class Lookup(nn.Module):
    def forward(self, table, index):
        return torch.index_select(table, 0, index) * 2  # LOOKUP_LINE


class Gatherer(nn.Module):
    """Fails inside ONNX Runtime (a Gather) when an index is out of range."""

    def __init__(self):
        super().__init__()
        self.lookup = Lookup()

    def forward(self, table, index):
        return self.lookup(table, index) + 1  # GATHERER_LINE


def _gather_when_positive(table, index):
    return torch.index_select(table, 0, index).cos()


def _gather_otherwise(table, index):
    return table[:2].sin()


class GatherInBranch(nn.Module):
    """The failing Gather sits in a torch.cond branch (an ONNX If subgraph)."""

    def forward(self, table, index):
        return torch.cond(table.sum() > 0, _gather_when_positive, _gather_otherwise, (table, index))


class Chain(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x * 3 + 1) - x.mean()


def _line_of(marker: str) -> int:
    return line_of(__name__, marker)


TABLE = torch.arange(12, dtype=torch.float32).reshape(3, 4)
INDEX = torch.tensor([0, 2])
BAD_INDEX = torch.tensor([0, 7])


@pytest.fixture(scope="module")
def gatherer():
    return bc.to_backend(Gatherer(), BACKEND, {"forward": {}}, example_inputs=(TABLE, INDEX))


# --- runtime failures come back as the user's source ---------------------------------------


def test_runtime_failure_shows_module_hierarchy_and_source_line(gatherer):
    torch.testing.assert_close(gatherer(TABLE, INDEX), Gatherer()(TABLE, INDEX))
    with pytest.raises(bc.BackendRuntimeError) as caught:
        gatherer(TABLE, BAD_INDEX)
    text = str(caught.value)
    # ONNX Runtime's own message first, naming the node it failed in.
    assert text.startswith("ONNX Runtime failed at ONNX node 'index_select#")
    assert "Gather" in text and "out of data bounds" in text
    assert "  Module hierarchy:top(Gatherer)::forward.lookup(Lookup)::forward.aten::index_select\n" in text
    assert "Traceback of model source (most recent call last):" in text
    here = __file__
    assert f'File "{here}", line {_line_of("GATHERER_LINE")}, in forward' in text
    assert f'File "{here}", line {_line_of("LOOKUP_LINE")}, in forward' in text
    assert "    return torch.index_select(table, 0, index) * 2  # LOOKUP_LINE\n" in text
    assert "~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE" in text
    # The handle is the index_select node's, found again offline.
    info = bc.debug_info(gatherer)[caught.value.debug_handle]
    assert (info.node, info.op) == ("index_select", "aten::index_select")


def test_runtime_failure_inside_a_cond_branch_points_at_the_branch_node():
    lowered = bc.to_backend(GatherInBranch(), BACKEND, {"forward": {}}, example_inputs=(TABLE, INDEX))
    with pytest.raises(bc.BackendRuntimeError) as caught:
        lowered(TABLE, BAD_INDEX)  # the sum is positive: the gathering branch runs
    info = bc.debug_info(lowered)[caught.value.debug_handle]
    assert info.op == "aten::index_select"
    assert "Module hierarchy:top(GatherInBranch)::forward.aten::index_select" in str(caught.value)
    # The other branch does not gather: no error.
    torch.testing.assert_close(lowered(-TABLE, BAD_INDEX), (-TABLE)[:2].sin())


def test_an_error_naming_no_known_node_still_raises_backend_error():
    method = OnnxRuntimeBackend().compile(
        {"forward": OnnxRuntimeBackend().preprocess(*_prepared(Chain(), (torch.randn(2, 3),)))}, {"forward": {}}
    )["forward"]
    error = method._runtime_error(RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : out of memory"))
    assert isinstance(error, bc.BackendError) and error.debug_handle is None
    assert "out of memory" in error.message


# --- preprocess ------------------------------------------------------------------------


def test_blob_is_deterministic_and_carries_no_exporter_metadata():
    backend = OnnxRuntimeBackend()
    prepared = _prepared(Chain(), (torch.randn(2, 3),))
    first = backend.preprocess(*prepared)
    assert backend.preprocess(*prepared) == first
    header, model = blob.decode(first)
    # Stack traces, file names and Python object names are dropped.
    assert __file__.encode() not in model and b"pkg.torch.onnx" not in model
    program, _, handles = prepared
    by_name = {node.name: handles[node] for node in program.graph_module.graph.nodes}
    # Every ONNX node carries the handle of the FX node it was exported from.
    assert set(header.nodes.values()) <= set(by_name.values())
    assert {name.split("#")[0] for name in header.nodes} == {"mul", "add", "sigmoid", "mean", "sub"}
    assert all(header.nodes[name] == by_name[name.split("#")[0]] for name in header.nodes)


class Mystery(nn.Module):
    def forward(self, x):
        return torch.ops.backendconf_ort_test.mystery(x + 1) * 2  # MYSTERY_LINE


@pytest.fixture(scope="module")
def mystery_op():
    name = "backendconf_ort_test::mystery"
    if not hasattr(torch.ops.backendconf_ort_test, "mystery"):

        @torch.library.custom_op(name, mutates_args=())
        def mystery(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @mystery.register_fake
        def _(x):
            return torch.empty_like(x)


def test_an_op_without_onnx_translation_is_rejected_at_its_node(mystery_op):
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(Mystery(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3),))
    assert caught.value.node.name == "mystery"
    text = str(caught.value)
    assert text.startswith("The node of backendconf_ort_test::mystery is not supported in this compiler. Source code:")
    assert f"line {_line_of('MYSTERY_LINE')}, in forward" in text
    assert "torch.onnx has no ONNX translation of backendconf_ort_test.mystery.default" in text


class TwoGaps(nn.Module):
    def forward(self, x):
        return torch.median(x) + torch.special.airy_ai(x)  # TWO_GAPS_LINE


def test_every_op_without_onnx_translation_is_named_at_once_before_decomposing(monkeypatch):
    from backendconf_onnxruntime import exporter

    decomposed = []
    decompose = exporter._decompose
    monkeypatch.setattr(exporter, "_decompose", lambda *a: (decomposed.append(a), decompose(*a))[1])
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(TwoGaps(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3),))
    exc = caught.value
    assert [r.node.name for r in exc.rejections] == ["median", "special_airy_ai"]
    assert exc.rejections[1].reason == (
        "torch.onnx has no ONNX translation of aten.special_airy_ai.default (from FX node 'special_airy_ai', "
        "aten.special_airy_ai.default): No decompositions registered for the real-valued input"
    )
    assert all(isinstance(r.debug_handle, int) for r in exc.rejections)
    text = str(exc)
    assert text.startswith("The node of aten::median is not supported in this compiler. Source code:")
    assert text.count(f"line {_line_of('TWO_GAPS_LINE')}, in forward") >= 2
    assert not decomposed  # known from torchlib's registry alone: the costly decomposition never ran


class Casts(nn.Module):
    def forward(self, x):
        return x.to(torch.float16).to(torch.float32) * 2


def test_what_the_exporter_drops_is_not_rejected_early():
    # torch.export writes aten._assert_tensor_metadata before a cast; torchlib has no function for it, but
    # the exporter removes it after decomposing: the early rejection must leave it alone.
    program = torch.export.export(Casts(), (torch.randn(3),))
    assert any("_assert_tensor_metadata" in str(n.target) for n in program.graph.nodes)
    lowered = bc.to_backend(Casts(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(3),))
    x = torch.randn(3)
    torch.testing.assert_close(lowered(x), Casts()(x))


def test_compile_spec_keys_are_checked():
    with pytest.raises(ValueError, match="unknown compile-spec key 'fast' for the onnxruntime backend"):
        OnnxRuntimeBackend().preprocess(*_prepared(Chain(), (torch.randn(2, 3),), {"fast": True}))
    with pytest.raises(ValueError, match="fault injection names node 'nope'"):
        spec = {"__backendconf_fault__": {"node": "nope"}}
        OnnxRuntimeBackend().preprocess(*_prepared(Chain(), (torch.randn(2, 3),), spec))


# --- dtypes and faults ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_runs_in_float32_rounded_per_op(dtype):
    # ONNX Runtime's CPU provider has no bfloat16 Add or Mul kernels at all.
    class Affine(nn.Module):
        def forward(self, x):
            return (x * 3 + 1) / 7, x.sum()

    x = torch.randn(4, 8).to(dtype)
    lowered = bc.to_backend(Affine(), BACKEND, {"forward": {}}, example_inputs=(x,))
    got, expected = lowered(x), Affine()(x)
    for a, e in zip(got, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
    # Add, mul and div are correctly rounded in both: bit for bit, as eager
    # rounds after every op (only the sum's accumulation order may differ).
    assert torch.equal(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1], rtol=2e-2, atol=1e-2)


def test_fault_in_a_cond_branch_fires_only_when_the_branch_runs():
    spec = {"forward": {"__backendconf_fault__": {"node": "cos"}}}
    lowered = bc.to_backend(GatherInBranch(), BACKEND, spec, example_inputs=(TABLE, INDEX))
    torch.testing.assert_close(lowered(-TABLE, INDEX), (-TABLE)[:2].sin())  # the other branch
    with pytest.raises(bc.BackendRuntimeError, match=r"^injected fault at node 'cos' \(aten::cos\)") as caught:
        lowered(TABLE, INDEX)
    assert bc.debug_info(lowered)[caught.value.debug_handle].node == "cos"


# --- compile, availability, target ---------------------------------------------------------


def test_a_corrupt_blob_is_a_value_error_naming_the_method():
    good = OnnxRuntimeBackend().preprocess(*_prepared(Chain(), (torch.randn(2, 3),)))
    bad = good[:-10] + bytes(10)
    with pytest.raises(
        ValueError, match=r"method 'forward': onnxruntime backend blob is corrupt: CRC-32 checksum mismatch"
    ):
        OnnxRuntimeBackend().compile({"forward": bad}, {"forward": {}})
    with pytest.raises(ValueError, match="not a valid onnxruntime backend blob"):
        OnnxRuntimeBackend().compile({"forward": b"\x89BCREF\r\n" + bytes(40)}, {"forward": {}})


def test_unavailable_without_onnxruntime(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    backend = OnnxRuntimeBackend()
    assert backend.is_available() is False
    assert "onnxruntime cannot be imported" in backend.unavailable_reason()
    assert "pip install onnxruntime" in backend.unavailable_reason()


def test_target_runs_the_archive_with_the_exporter_blocked(gatherer, tmp_path):
    path = tmp_path / "gatherer.bcpt"
    bc.save(gatherer, path)
    blocked = set(OnnxRuntimeBackend.capabilities.host_only_modules)
    result = bc.run_on_target(path, {"forward": [(TABLE, INDEX), (TABLE, BAD_INDEX)]}, plugins=[])
    assert result["loaded"], result["error"]
    assert blocked <= set(result["blocked"])
    torch.testing.assert_close(result["outputs"]["forward"][0], Gatherer()(TABLE, INDEX))
    error = result["errors"]["forward"][1]
    assert error["type"] == "BackendRuntimeError"
    assert "Module hierarchy:top(Gatherer)::forward.lookup(Lookup)::forward.aten::index_select" in error["message"]


def test_the_runtime_module_never_imports_the_exporter():
    # What compile and execute import, in a fresh interpreter.
    done = host_only_imports("backendconf_onnxruntime", "OnnxRuntimeBackend")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_dynamic_shapes_export_named_onnx_dimensions_and_run_any_size_in_the_range():
    import onnx

    from pytest_backendconf.conformance import zoo

    model = zoo.build(zoo.TinyAttention)
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=1, max=16)
    lowered = bc.to_backend(
        model,
        BACKEND,
        {"forward": {}},
        example_inputs=(torch.randn(2, 5, 8),),
        dynamic_shapes={"x": {0: batch, 1: seq}},
    )
    header, data = blob.decode(lowered.lowered.blobs["forward"])
    (x,) = [slot for slot in header.inputs if slot is not None]
    assert x.shape == (None, None, 8)
    dims = onnx.load_from_string(data).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param != "" for d in dims] == [True, True, False]
    for b, s in [(1, 1), (4, 16), (3, 7)]:
        x = torch.randn(b, s, 8)
        torch.testing.assert_close(lowered(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(bc.InputSpecError, match=r"input 'x': dimension 1 is 17, outside the range \[1, 16\]"):
        lowered(torch.randn(2, 17, 8))


class Running(nn.Module):
    """A running sum in a buffer: its state reaches the backend as an input and an output."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.register_buffer("total", torch.zeros(4, dtype=dtype))

    def forward(self, x):
        self.total.add_(x)
        return self.total * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_stateful_program_keeps_its_state_names_and_low_precision(dtype):
    # torch.onnx's retrace names `b_total, x` after forward's one parameter: `arg_0, arg_1`; the
    # backend gives the names back by position, before widening the bfloat16 state to float32.
    lowered = bc.to_backend(
        Running(dtype), "onnxruntime", {"forward": {}}, example_inputs=(torch.ones(4, dtype=dtype),)
    )
    eager = Running(dtype)
    for step in range(3):
        x = torch.full((4,), float(step + 1), dtype=dtype)
        torch.testing.assert_close(lowered(x), eager(x))
    torch.testing.assert_close(bc.state(lowered)["total"], eager.total)
    header, _ = blob.decode(lowered.lowered.blobs["forward"])
    assert [slot.name for slot in header.inputs if slot is not None] == ["b_total", "x"]


class PartitionedState(nn.Module):
    """Its partitions' inputs are named as the retrace names its own values (`mul`, `mul_1`)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        y = x * 2
        self.total.add_(torch.ops.backendconf_ort_test.mystery(y * 3))
        return self.total * 4 + y


def test_a_partition_whose_input_names_clash_with_the_retraces_runs(mystery_op):
    lowered = bc.to_backend(
        PartitionedState(), "onnxruntime", {"forward": {}}, example_inputs=(torch.ones(4),), partition="supported"
    )
    assert bc.delegation(lowered)["forward"].partitions >= 2
    eager = PartitionedState()
    for step in range(3):
        x = torch.full((4,), float(step))
        torch.testing.assert_close(lowered(x), eager(x))


class MeanOfOne(nn.Module):
    def forward(self, x):
        return x.mean(dim=[0])  # the mean of a 0-d tensor: the exporter emits no node at all


def test_a_program_without_ops_loads_and_runs():
    x = torch.randn(())
    lowered = bc.to_backend(MeanOfOne(), BACKEND, {"forward": {}}, example_inputs=(x,))
    torch.testing.assert_close(lowered(x), x)
