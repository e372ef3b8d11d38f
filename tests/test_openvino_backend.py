"""The openvino backend on its own: conversion, layer → handle table, precision, rejections, target side.

Every model is converted for real (OpenVINO's PyTorch frontend) and run by
OpenVINO's CPU plugin. The whole conformance suite runs against this backend
with ``make suite-openvino`` (see backends/openvino/README.md); these tests
pin what the suite does not see: the pinned static shapes, the explicit
precision, the IR's layer names and their debug handles, a rejection at the
user's line, and a target without the frontend.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from torch import nn

pytest.importorskip("openvino", reason="the openvino backend needs openvino (make .venv/.installed-openvino)")
pytest.importorskip("backendconf_openvino", reason="install the backend: pip install -e backends/openvino")

import pytest_backendconf as bc

from backendconf_openvino import OpenVinoBackend, blob
from backendconf_openvino.conversion import parse_spec
from engine_setup import assert_cache_write_past_the_end_is_clamped, host_only_imports, line_of
from engine_setup import prepared as _prepared

BACKEND = "openvino"


class Lookup(nn.Module):
    def forward(self, table, index):
        return torch.index_select(table, 0, index) * 2  # LOOKUP_LINE


class Gatherer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.lookup = Lookup()

    def forward(self, table, index):
        return torch.sigmoid(self.lookup(self.linear(table), index)) - table.mean()


def _cos(x):
    return x.cos()


def _sin(x):
    return x.sin()


class Branches(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, _cos, _sin, (x,)) + 1


class Mystery(nn.Module):
    def forward(self, x):
        return torch.ops.backendconf_ov_test.mystery(x + 1) * 2  # MYSTERY_LINE


def _line_of(marker: str) -> int:
    return line_of(__name__, marker)


TABLE = torch.randn(3, 4)
INDEX = torch.tensor([0, 2])


@pytest.fixture(scope="module")
def gatherer():
    model = Gatherer().eval()
    return model, bc.to_backend(model, BACKEND, {"forward": {}}, example_inputs=(TABLE, INDEX))


def test_layers_carry_the_debug_handles_of_their_fx_nodes(gatherer):
    model, lowered = gatherer
    torch.testing.assert_close(lowered(TABLE, INDEX), model(TABLE, INDEX), rtol=1e-6, atol=1e-6)
    header, xml, weights = blob.decode(lowered.lowered.blobs["forward"])
    info = bc.debug_info(lowered)
    # The frontend names each layer <FX node>/<ATen op>/<OpenVINO op>.
    assert header.nodes["index_select/aten.index_select.default/Gather"] in info
    by_layer = {name: info[h] for name, h in header.nodes.items()}
    assert by_layer["index_select/aten.index_select.default/Gather"].node == "index_select"
    assert by_layer["sigmoid/aten.sigmoid.default/Sigmoid"].op == "aten::sigmoid"
    assert {i.node for i in by_layer.values()} >= {"linear", "index_select", "mul", "sigmoid", "mean", "sub"}
    # The linear layer's weights travel as float32 (save_model would halve them by default).
    assert len(weights) >= 4 * (16 + 4)


def test_the_blob_is_deterministic_and_has_no_counter_names():
    backend = OpenVinoBackend()
    prepared = _prepared(Gatherer().eval(), (TABLE, INDEX))
    first = backend.preprocess(*prepared)
    # A second conversion in the same process: OpenVINO's own counters have moved on.
    assert backend.preprocess(*prepared) == first
    _, xml, _ = blob.decode(first)
    names = re.findall(r'<layer id="\d+" name="([^"]*)"', xml.decode())
    assert not [name for name in names if re.fullmatch(r"[A-Z]\w*_\d+", name)]
    assert "Result#0" in names


def test_static_shapes_are_pinned_and_symbolic_ones_stay_dynamic():
    _, xml, _ = blob.decode(OpenVinoBackend().preprocess(*_prepared(Gatherer().eval(), (TABLE, INDEX))))
    parameter = re.search(r'name="table" type="Parameter".*?shape="([^"]*)"', xml.decode(), re.S)
    assert parameter is not None and parameter.group(1) == "3,4"

    class Scores(nn.Module):
        def forward(self, x):
            return (x @ x.transpose(-1, -2)).softmax(-1)

    batch = torch.export.Dim("batch", min=1, max=8)
    lowered = bc.to_backend(
        Scores(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3, 4),), dynamic_shapes={"x": {0: batch}}
    )
    _, xml, _ = blob.decode(lowered.lowered.blobs["forward"])
    parameter = re.search(r'name="x" type="Parameter".*?shape="([^"]*)"', xml.decode(), re.S)
    assert parameter is not None and parameter.group(1) == "?,3,4"
    for size in (1, 5, 8):
        x = torch.randn(size, 3, 4)
        torch.testing.assert_close(lowered(x), Scores()(x))


def test_precision_is_explicit_per_dtype_and_can_be_overridden():
    class Exp(nn.Module):
        def forward(self, x):
            return torch.exp(x).sum(-1) / 3

    x = torch.randn(8, 16)
    lowered = bc.to_backend(Exp(), BACKEND, {"forward": {}}, example_inputs=(x,))
    method = lowered.lowered.handles["forward"]
    assert str(method.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    torch.testing.assert_close(lowered(x), Exp()(x), rtol=1e-6, atol=1e-6)
    # bfloat16 programs compute in float32 between their bfloat16 inputs and outputs:
    # no further from the float64 truth than eager's bfloat16.
    xb = x.to(torch.bfloat16)
    low = bc.to_backend(Exp(), BACKEND, {"forward": {}}, example_inputs=(xb,))
    assert blob.decode(low.lowered.blobs["forward"])[0].precision == "f32"
    truth = Exp()(xb.double())
    got = low(xb)
    assert got.dtype == torch.bfloat16
    assert (got.double() - truth).abs().max() <= (Exp()(xb).double() - truth).abs().max()
    # The compile-spec key asks for another precision (bfloat16: coarser).
    coarse = bc.to_backend(Exp(), BACKEND, {"forward": {"inference_precision": "bf16"}}, example_inputs=(x,))
    method = coarse.lowered.handles["forward"]
    assert blob.decode(coarse.lowered.blobs["forward"])[0].precision == "bf16"
    # OpenVINO's CPU plugin computes in bfloat16 only where the CPU has it (AVX512-BF16, AMX, Arm BF16);
    # elsewhere (an AVX2 machine) it keeps float32 whatever the hint asked.
    import openvino

    capable = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    hint = "<Type: 'bfloat16'>" if capable else "<Type: 'float32'>"
    assert str(method.compiled.get_property("INFERENCE_PRECISION_HINT")) == hint


def test_an_index_copy_past_the_end_is_clamped_not_written_past_the_tensor():
    # ScatterUpdate has no bounds check: unclamped, position 4 of a 4-row
    # cache wrote past the buffer and crashed later calls of the process.
    assert_cache_write_past_the_end_is_clamped(BACKEND)


class IntegerMatmul(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)


def test_an_ir_the_cpu_plugin_cannot_compile_is_a_compiler_error_at_its_node():
    # The frontend converts an int64 mm (OpenVINO claims it); the CPU plugin cannot compile it when a
    # dimension is empty ("object is not initialized"): a compiler failure, not "unsupported".
    a, b = torch.zeros(0, 4, dtype=torch.int64), torch.ones(4, 5, dtype=torch.int64)
    with pytest.raises(bc.CompilerError) as caught:
        bc.to_backend(IntegerMatmul(), BACKEND, {"forward": {}}, example_inputs=(a, b))
    assert caught.value.node.name == "mm"
    assert "OpenVINO's CPU plugin cannot compile the IR: object is not initialized" in caught.value.reason


def test_cond_branches_are_converted_and_their_layers_have_handles():
    lowered = bc.to_backend(Branches(), BACKEND, {"forward": {}}, example_inputs=(TABLE,))
    for x in (TABLE.abs(), -TABLE.abs()):
        torch.testing.assert_close(lowered(x), Branches()(x))
    header, _, _ = blob.decode(lowered.lowered.blobs["forward"])
    info = bc.debug_info(lowered)
    assert {info[h].node for h in header.nodes.values()} >= {"cos", "sin", "cond", "add"}


@pytest.fixture(scope="module")
def mystery_op():
    name = "backendconf_ov_test::mystery"
    if not hasattr(torch.ops.backendconf_ov_test, "mystery"):

        @torch.library.custom_op(name, mutates_args=())
        def mystery(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @mystery.register_fake
        def _(x):
            return torch.empty_like(x)


def test_an_op_without_conversion_rule_is_rejected_at_its_node(mystery_op):
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(Mystery(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3),))
    assert caught.value.node.name == "mystery"
    text = str(caught.value)
    assert text.startswith("The node of backendconf_ov_test::mystery is not supported in this compiler. Source code:")
    assert f"line {_line_of('MYSTERY_LINE')}, in forward" in text
    assert "OpenVINO's PyTorch frontend has no conversion rule for backendconf_ov_test.mystery.default" in text


class TwoFailures(nn.Module):
    def forward(self, x, s):
        return torch.ops.backendconf_ov_test.mystery(x), torch.argmax(s, 0)  # a 0-d argmax: TopK refuses rank 0


def test_every_failing_node_is_named_with_its_own_reason(mystery_op):
    # Each node's text must not depend on the rest of the program (batched ops checks compare it with
    # the text alone), nor on what the process converted before (OpenVINO numbers its nodes per process).
    reasons = []
    for _ in range(2):
        with pytest.raises(bc.UnsupportedNodeError) as caught:
            bc.to_backend(
                TwoFailures(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3), torch.tensor(1.5))
            )
        reasons.append({r.node.name: r.reason for r in caught.value.rejections})
    assert reasons[0] == reasons[1]
    assert list(reasons[0]) == ["mystery", "argmax"]
    assert (
        reasons[0]["mystery"]
        == "OpenVINO's PyTorch frontend has no conversion rule for backendconf_ov_test.mystery.default"
    )
    argmax = reasons[0]["argmax"]
    assert argmax.startswith("OpenVINO's PyTorch frontend cannot convert it:") and "TopK_#" in argmax
    assert not re.search(r"[A-Z][A-Za-z]*_\d", argmax) and "mystery" not in argmax


class Divisors(nn.Module):
    def forward(self, x, y):
        return torch.gcd(x, y) + torch.gcd(y, x).abs()  # GCD_LINE


class NormStatistics(nn.Module):
    def forward(self, x):
        return torch.native_layer_norm(x, [3], None, None, 1e-5)  # the mean and rstd outputs too


def test_a_half_converted_multi_output_op_is_named_not_its_getitem():
    # The frontend fails at the getitem of output 2, numbered across the program ("getitem_7"): the
    # rejection names the op that produced it, in words that do not depend on the numbering.
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(NormStatistics(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3),))
    assert [r.node.name for r in caught.value.rejections] == ["native_layer_norm"]
    reason = caught.value.rejections[0].reason
    assert reason.startswith("OpenVINO's PyTorch frontend cannot convert its output ")
    assert "getitem" not in reason


def test_gcd_is_declined_at_every_gcd_node_before_converting():
    # OpenVINO converts it, but its Loop on the CPU plugin corrupts the process (README.md, Known failures).
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(
            Divisors(), BACKEND, {"forward": {}}, example_inputs=(torch.tensor([-8, 6, 9, 0, 0]), torch.tensor(5))
        )
    assert [r.node.name for r in caught.value.rejections] == ["gcd", "gcd_1"]
    text = str(caught.value)
    assert "returns uninitialised memory and corrupts the process's heap" in text
    assert f"line {_line_of('GCD_LINE')}, in forward" in text


def test_conversions_send_no_telemetry(monkeypatch):
    # openvino_telemetry sends each event from a forked process; without network those never end.
    tm = pytest.importorskip("openvino_telemetry")
    monkeypatch.delenv("CI", raising=False)  # where telemetry would be on (no consent file declines it)
    sent = []
    monkeypatch.setattr(tm.Telemetry, "send_event", lambda self, *a, **k: sent.append(a), raising=False)
    program, spec, handles = _prepared(Gatherer().eval(), (TABLE, INDEX))
    OpenVinoBackend().preprocess(program, spec, handles)
    assert sent == []
    from openvino.tools.ovc import convert_impl, telemetry_stub

    assert convert_impl.tm is telemetry_stub


def test_compile_spec_mistakes_name_the_key():
    assert parse_spec({}) == (None, None)
    assert parse_spec({"inference_precision": "bf16"}) == ("bf16", None)
    with pytest.raises(ValueError, match="unknown compile-spec key 'precision' for the openvino backend"):
        parse_spec({"precision": "f32"})
    with pytest.raises(ValueError, match=r"'inference_precision' must be one of \['bf16', 'f16', 'f32'\]"):
        parse_spec({"inference_precision": "fp32"})
    with pytest.raises(ValueError, match="fault injection names node 'nope'"):
        OpenVinoBackend().preprocess(
            *_prepared(Gatherer().eval(), (TABLE, INDEX), {"__backendconf_fault__": {"node": "nope"}})
        )


def test_an_openvino_error_naming_a_layer_maps_to_its_handle(gatherer):
    _, lowered = gatherer
    method = lowered.lowered.handles["forward"]
    layer = "index_select/aten.index_select.default/Gather"
    error = method._runtime_error(
        RuntimeError(f"Exception from src/plugins/intel_cpu: node with name '{layer}' failed")
    )
    assert error.debug_handle == method.header.nodes[layer]
    assert error.message.startswith(f"OpenVINO failed at IR layer {layer!r}")
    unknown = method._runtime_error(RuntimeError("out of memory"))
    assert unknown.debug_handle is None and "out of memory" in unknown.message


def test_a_bad_blob_is_refused_by_name(gatherer):
    _, lowered = gatherer
    good = lowered.lowered.blobs["forward"]
    with pytest.raises(
        ValueError, match=r"method 'forward': openvino backend blob is corrupt: CRC-32 checksum mismatch"
    ):
        OpenVinoBackend().compile({"forward": good[:-10] + bytes(10)}, {"forward": {}})
    with pytest.raises(ValueError, match="not a valid openvino backend blob"):
        OpenVinoBackend().compile({"forward": b"\x89BCORT\r\n" + good[8:]}, {"forward": {}})
    header, xml, weights = blob.decode(good)
    with pytest.raises(ValueError, match="OpenVINO cannot compile the IR on CPU"):
        OpenVinoBackend().compile({"forward": blob.encode(header, b"<net>", weights)}, {"forward": {}})


def test_unavailable_without_openvino(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # makes `import openvino` fail
    backend = OpenVinoBackend()
    assert backend.is_available() is False
    assert "openvino cannot be imported" in backend.unavailable_reason()
    assert "pip install openvino==2026.4.1 packaging" in backend.unavailable_reason()


def test_the_target_runs_the_archive_with_the_frontend_blocked(gatherer, tmp_path):
    model, lowered = gatherer
    path = tmp_path / "gatherer.bcpt"
    bc.save(lowered, path)
    result = bc.run_on_target(path, {"forward": [(TABLE, INDEX)]}, plugins=[])
    assert result["loaded"], result["error"]
    assert {"openvino.frontend.pytorch", "openvino.tools.ovc"} <= set(result["blocked"])
    torch.testing.assert_close(result["outputs"]["forward"][0], model(TABLE, INDEX), rtol=1e-6, atol=1e-6)


def test_a_fault_on_the_target_shows_the_users_source(tmp_path):
    spec = {"forward": {"__backendconf_fault__": {"node": "index_select"}}}
    lowered = bc.to_backend(Gatherer().eval(), BACKEND, spec, example_inputs=(TABLE, INDEX))
    path = tmp_path / "fault.bcpt"
    bc.save(lowered, path)
    result = bc.run_on_target(path, {"forward": [(TABLE, INDEX)]}, plugins=[])
    error = result["errors"]["forward"][0]
    assert error["type"] == "BackendRuntimeError"
    assert error["message"].startswith("injected fault at node 'index_select' (aten::index_select)")
    assert "Module hierarchy:top(Gatherer)::forward.lookup(Lookup)::forward.aten::index_select" in error["message"]
    assert f"line {_line_of('LOOKUP_LINE')}, in forward" in error["message"]


def test_the_runtime_never_imports_the_frontend():
    # What compile and execute import, in a fresh interpreter.
    done = host_only_imports("backendconf_openvino", "OpenVinoBackend", "backendconf_openvino.runtime.core()")
    assert done.returncode == 0, done.stderr
    # `import openvino` itself imports openvino.tools.ovc (for convert_model) when it can;
    # the frontend and our conversion are never imported.
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [m for m in imported if not m.startswith("openvino.tools.ovc")]
