"""Partial delegation: to_backend(partition=...), the CPU fallback, delegation records, errors."""

from __future__ import annotations

import pytest
import torch
from partition_models import (
    DropsPartitionOutput,
    EncoderWithHead,
    RejectsSub,
    SupportedNodesMethod,
    ThreeParts,
    WithCustomOp,
)

import pytest_backendconf as bc
from lowering_models import N
from pytest_backendconf.lowering import _partition, to_bytes

SPEC = {"forward": {}}


def lower(model, backend="reference", spec=SPEC, *, x=None, partition="supported"):
    x = torch.randn(2, 4) if x is None else x
    return bc.to_backend(model.eval(), backend, spec, example_inputs=(x,), partition=partition), x


def assert_outputs_match(lowered, model, x):
    got, want = lowered(x), model(x)
    for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (got, want))):
        torch.testing.assert_close(g, w)


def test_custom_op_runs_on_the_fallback_and_outputs_match_eager():
    model = WithCustomOp().eval()
    lowered, x = lower(model)
    assert_outputs_match(lowered, model, x)
    record = bc.delegation(lowered)["forward"]
    assert record.fallback == ("scale",)
    assert record.partitions == 2
    assert record.partition_nodes == (("linear", "relu"), ("sum_1", "add", "sub"))
    assert repr(lowered) == "WrapperModule(backend='reference'; forward: 2 partitions, 5/6 nodes delegated)"
    assert "\n" not in repr(lowered.lowered)


def test_selective_lowering_delegates_exactly_the_nodes_of_the_named_submodule():
    model = N().eval()
    x = torch.randn(2, 3)
    lowered, _ = lower(model, x=x, partition=["m"])
    record = bc.delegation(lowered)["forward"]
    assert record.delegated == ("mul", "sub")  # m's sub and m.l's mul
    assert record.fallback == ("add",)  # N's own add stays on the CPU
    torch.testing.assert_close(lowered(x), model(x))
    lowered, _ = lower(model, x=x, partition=["m.l"])
    assert bc.delegation(lowered)["forward"].delegated == ("mul",)


def test_composing_an_encoder_into_a_parent_is_one_lowered_module():
    model = EncoderWithHead().eval()
    lowered, x = lower(model, partition=["encoder"])
    record = bc.delegation(lowered)["forward"]
    assert record.delegated == ("linear", "tanh") and record.partitions == 1
    assert set(record.fallback) == {"linear_1", "softmax"}
    assert_outputs_match(lowered, model, x)


def test_a_partition_function_picks_nodes():
    model = ThreeParts().eval()
    lowered, x = lower(model, partition=lambda node: node.target is torch.ops.aten.sigmoid.default)
    assert bc.delegation(lowered)["forward"].delegated == ("sigmoid",)
    assert_outputs_match(lowered, model, x)


def test_three_partitions_around_a_rejected_op_found_by_asking_preprocess():
    model = ThreeParts().eval()
    backend = RejectsSub()
    lowered, x = lower(model, backend)
    record = bc.delegation(lowered)["forward"]
    assert record.fallback == ("sub", "sub_1")
    assert record.partitions == 3
    assert_outputs_match(lowered, model, x)
    asked = backend.preprocessed
    lower(model, backend)  # the same ops again: answered from the per-session cache
    assert backend.preprocessed == asked + 3  # only the three partitions' own preprocess calls


def test_the_partitions_and_fallback_segments_share_one_numbering_and_a_relowering_is_byte_identical():
    model = ThreeParts().eval()
    lowered, _ = lower(model, RejectsSub())
    infos = bc.debug_info(lowered)
    assert sorted(infos) == list(range(len(infos)))  # every node once, delegated or not
    assert len({info.node for info in infos.values()}) == len(infos)
    again, _ = lower(model, RejectsSub())
    assert to_bytes(again) == to_bytes(lowered)


def test_supported_nodes_method_decides_before_supported_ops():
    model = ThreeParts().eval()
    lowered, x = lower(model, SupportedNodesMethod())
    record = bc.delegation(lowered)["forward"]
    assert set(record.fallback) == {"mul", "mul_1"}
    assert_outputs_match(lowered, model, x)


def test_supported_ops_decide_without_asking_preprocess():
    class NoSigmoid(RejectsSub):
        name = "no_sigmoid"
        capabilities = bc.Capabilities(supported_ops={"aten.mul.Tensor", "aten.relu.default", "aten.sub.Tensor"})

        def preprocess(self, program, compile_spec, debug_handles):
            self.preprocessed += 1
            return super(RejectsSub, self).preprocess(program, compile_spec, debug_handles)

    backend = NoSigmoid()
    lowered, x = lower(ThreeParts(), backend)
    assert backend.preprocessed == bc.delegation(lowered)["forward"].partitions  # one call per partition
    assert "sigmoid" in bc.delegation(lowered)["forward"].fallback


class CastsItsInput(torch.nn.Module):
    def forward(self, x, scale):
        return x * scale.to(torch.float32)  # an `_assert_tensor_metadata` node that nothing reads


@pytest.mark.parametrize("asks", [True, False], ids=["asked", "supported_ops"])
def test_a_node_nobody_reads_is_never_a_partition_of_its_own(asks):
    from backendconf_reference import ReferenceBackend

    class NoEmptyPrograms(ReferenceBackend):
        """An engine that cannot load a model without outputs (ONNX Runtime's 'Missing opset')."""

        name = "no_empty_programs"
        capabilities = bc.Capabilities(supported_ops=None if asks else {"aten._assert_tensor_metadata.default"})

        def preprocess(self, program, compile_spec, debug_handles):
            if not program.graph_signature.output_specs:
                raise RuntimeError("cannot load a model without outputs")
            return super().preprocess(program, compile_spec, debug_handles)

    x, scale = torch.randn(3), torch.tensor([2.0])
    lowered = bc.to_backend(
        CastsItsInput(), NoEmptyPrograms(), {"forward": {}}, example_inputs=(x, scale), partition="supported"
    )
    record = bc.delegation(lowered)["forward"]
    assert any("assert_tensor_metadata" in name for name in record.fallback)
    torch.testing.assert_close(lowered(x, scale), x * 2)


def test_debug_info_covers_every_node_delegated_or_not():
    lowered, _ = lower(WithCustomOp())
    nodes = {info.node for info in bc.debug_info(lowered).values()}
    record = bc.delegation(lowered)["forward"]
    assert set(record.delegated) | set(record.fallback) <= nodes
    assert "scale" in nodes


@pytest.mark.parametrize("node", ["mul", "sub", "add"])  # in m.l, in m, and on the fallback
def test_a_runtime_error_in_any_part_symbolicates_to_the_source_line(node):
    spec = {"forward": {"__backendconf_fault__": {"node": node}}}
    lowered, x = lower(N(), spec=spec, x=torch.randn(2, 3), partition=["m"])
    with pytest.raises(bc.BackendRuntimeError) as info:
        lowered(x)
    text = str(info.value)
    assert text.startswith(f"injected fault at node '{node}'")
    assert "Traceback of model source (most recent call last):" in text
    line = {"mul": "return x * 5", "sub": "return self.l(x) - 2", "add": "return self.m(x) + 3"}[node]
    assert line in text
    assert f"(method 'forward', node '{node}'" in text


def test_a_failure_inside_the_fallback_names_the_custom_op_and_its_line():
    lowered, x = lower(WithCustomOp())
    with pytest.raises(bc.BackendRuntimeError) as info:
        lowered(torch.full_like(x, float("inf")))
    text = str(info.value)
    assert text.startswith("bcpartition::scale at node 'scale' failed: ValueError: bcpartition::scale needs finite")
    assert "  Module hierarchy:top(WithCustomOp)::forward.bcpartition::scale" in text
    assert "h = torch.ops.bcpartition.scale(h, 2.0)" in text


def test_a_partition_that_drops_an_output_is_a_contract_error_naming_it():
    lowered, x = lower(WithCustomOp(), DropsPartitionOutput())  # its second partition gives two values
    with pytest.raises(
        bc.OutputSpecError,
        match=r"partition 'forward\.partition1': execute\(\) of backend 'drops_output' must return a list of 2 outputs",
    ):
        lowered(x)


def test_bad_partition_arguments_name_the_fix():
    with pytest.raises(bc.LoweringError, match="partition='everything' is not understood"):
        lower(N(), x=torch.randn(2, 3), partition="everything")
    with pytest.raises(bc.LoweringError, match=r"names submodule\(s\) \['k'\].*calls: m, m.l"):
        lower(N(), x=torch.randn(2, 3), partition=["k"])
    with pytest.raises(bc.LoweringError, match="returned 1 for node 'mul'; it must return a bool"):
        lower(N(), x=torch.randn(2, 3), partition=lambda node: 1)
    with pytest.raises(bc.LoweringError, match="non-empty list of submodule names"):
        lower(N(), x=torch.randn(2, 3), partition=[])


def test_selecting_a_node_the_backend_rejects_is_the_usual_unsupported_error():
    with pytest.raises(bc.UnsupportedNodeError) as info:
        lower(N(), RejectsSub(), x=torch.randn(2, 3), partition=["m"])
    assert str(info.value).startswith("The node of aten::sub is not supported in this compiler. Source code:")
    assert "return self.l(x) - 2" in str(info.value)


def test_whole_method_lowering_reports_one_partition():
    lowered, _ = lower(N(), x=torch.randn(2, 3), partition=None)
    assert bc.delegation(lowered) == {"forward": bc.Delegation(1, ("mul", "sub", "add"), (), (("mul", "sub", "add"),))}
    assert "1 partition, 3/3 nodes delegated" in repr(lowered)


def test_format_delegation_is_a_table_per_method():
    lowered, _ = lower(N(), x=torch.randn(2, 3), partition=["m"])
    assert _partition.format_delegation(bc.delegation(lowered)).splitlines() == [
        "method forward: 1 partition, 2/3 nodes delegated",
        "  partition 0     2 nodes  mul, sub",
        "  fallback        1 nodes  add",
    ]


# --- archives, fresh processes, the target ------------------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from test_archive import entries_of, repack  # noqa: E402

from pytest_backendconf.lowering import _saving  # noqa: E402
from pytest_backendconf.cli._main import main as cli_main  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_python(code: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_saved_partitions_load_and_resave_byte_identical():
    model = WithCustomOp().eval()
    lowered, x = lower(model)
    data = _saving.to_bytes(lowered)
    loaded = bc.load(data)
    assert bc.delegation(loaded) == bc.delegation(lowered)
    assert repr(loaded) == repr(lowered)
    assert_outputs_match(loaded, model, x)
    assert _saving.to_bytes(loaded) == data
    names = set(entries_of(data))
    assert {"blobs/forward.partition0.bin", "blobs/forward.partition1.bin", "fallback/forward.fallback0.bin"} <= names
    assert "blobs/forward.bin" not in names


def test_a_schema_1_0_archive_still_loads():
    lowered, x = lower(N(), x=torch.randn(2, 3), partition=None)
    entries = entries_of(_saving.to_bytes(lowered))
    manifest = json.loads(entries["manifest.json"])
    from test_archive_structure import as_schema_1_0

    as_schema_1_0(manifest)  # treespec strings, as 0.1 wrote
    del manifest["op_nodes"]  # what 0.1 wrote
    entries["manifest.json"] = json.dumps(manifest).encode()
    old = bc.load(repack(entries))
    torch.testing.assert_close(old(x), N()(x))
    assert bc.delegation(old)["forward"].delegated == ("mul", "sub", "add")


def test_a_missing_fallback_blob_is_an_archive_error_naming_it():
    lowered, _ = lower(WithCustomOp())
    entries = entries_of(_saving.to_bytes(lowered))
    del entries["fallback/forward.fallback0.bin"]
    with pytest.raises(bc.ArchiveError, match=r"entry 'fallback/forward\.fallback0\.bin'.*missing"):
        bc.load(repack(entries))


@pytest.mark.slow
def test_loading_where_the_custom_op_is_not_registered_names_it_and_its_line(tmp_path):
    lowered, x = lower(WithCustomOp())
    path = tmp_path / "custom.bcpt"
    bc.save(lowered, path)
    # A fresh process that never imports partition_models: bcpartition::scale does not exist there.
    done = run_python(f"import pytest_backendconf as bc\nbc.load({str(path)!r})", tmp_path)
    assert done.returncode != 0
    assert (
        "OperatorNotRegisteredError: operator bcpartition::scale (bcpartition.scale.default) is not registered"
        in done.stderr
    )
    assert 'partition_models.py", line' in done.stderr
    assert "h = torch.ops.bcpartition.scale(h, 2.0)" in done.stderr
    # With the op registered, the same archive loads and matches eager.
    done = run_python(
        "import torch, partition_models, pytest_backendconf as bc\n"
        f"m = bc.load({str(path)!r}); x = torch.ones(2, 4)\n"
        "print(bc.delegation(m)['forward'].fallback)",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "('scale',)" in done.stdout


@pytest.mark.slow
def test_selective_nml_in_a_fresh_process_and_on_the_target(tmp_path, capsys):
    model = N().eval()
    x = torch.randn(2, 3)
    lowered, _ = lower(model, x=x, partition=["m"])
    path = tmp_path / "nml.bcpt"
    bc.save(lowered, path)
    torch.save(x, tmp_path / "x.pt")
    done = run_python(
        "import torch, pytest_backendconf as bc\n"
        f"m = bc.load({str(path)!r}); x = torch.load('x.pt')\n"
        "print(bc.delegation(m)['forward'].delegated, m(x).tolist())",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"('mul', 'sub') {model(x).tolist()}"
    target = bc.run_on_target(path, {"forward": [(x,)]})
    assert target["ok"], target["error"]
    torch.testing.assert_close(target["outputs"]["forward"][0], model(x))
    # The command line, called in this process (the target it starts is a process of its own; a
    # `backendconf` process would only add a torch import).
    capsys.readouterr()
    code = cli_main(["run-target", str(path), "--example-inputs"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "target: ok" in out
    assert cli_main(["inspect", str(path)]) == 0
    assert "  method forward: 1 partition, 2/3 nodes delegated\n    partition 0     2 nodes  mul, sub\n" in (
        capsys.readouterr().out
    )


def test_hooks_on_the_lowered_module_still_run_despite_the_fast_call_path():
    lowered, x = lower(N(), x=torch.randn(2, 3), partition=None)
    seen = []
    handle = lowered.register_forward_hook(lambda module, args, output: seen.append(output))
    out = lowered(x)
    handle.remove()
    assert len(seen) == 1 and seen[0] is out
    lowered(x)
    assert len(seen) == 1
