"""The ops category, the numerics of parity-type failures, divergence localisation, failure groups.

Suite runs use pytester with ``--backendconf-select`` narrowed to a few
overloads and models, and the backends of broken_backends_ops.py: one whose
only defect is float16 ``aten.sub.Tensor``, one more accurate than eager.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf import _compat
from pytest_backendconf.report._failure_groups import group_failures, template
from pytest_backendconf.numerics._numerics import Tolerance, compare_outputs, resolve_tolerance, ulp_distance
from pytest_backendconf.report._ops import capabilities_text, ops_matrix, parse_id, summary_line
from pytest_backendconf.archive._tensorfile import TensorFileError, read_tensors, write_tensors
from pytest_backendconf.conformance.ops import discovery
from pytest_backendconf.conformance.ops import _category as ops_category
from pytest_backendconf.conformance.ops import OpCall, build_program
from report_records import records

SHIPPED = discovery.load(discovery.DATA_DIR, discovery.release())
needs_data = pytest.mark.skipif(SHIPPED is None, reason=f"no ops data shipped for torch {torch.__version__}")


# --- data and programs -------------------------------------------------------------------


@needs_data
def test_shipped_data_covers_enough_overloads():
    assert SHIPPED is not None
    overloads = {s.overload for s in SHIPPED.samples}
    assert len(overloads) >= 150, len(overloads)
    assert len(SHIPPED.samples) >= 300
    per_cell: dict = {}
    for s in SHIPPED.samples:
        per_cell.setdefault((s.overload, s.dtype), []).append(s.index)
    assert all(sorted(v) == list(range(len(v))) and len(v) <= discovery.DEFAULT_SAMPLES for v in per_cell.values())


@needs_data
@pytest.mark.parametrize("overload", ["aten.add.Tensor", "aten.max.dim", "aten.cat.default", "aten.where.self"])
def test_rebuilt_program_is_what_torch_export_makes(overload):
    """The program an ops check lowers equals a fresh torch.export of the same call."""
    assert SHIPPED is not None
    sample = next((s for s in SHIPPED.samples if s.overload == overload and s.dtype == "float32"), None)
    if sample is None:  # discovery kept no sample of aten.cat under torch 2.10 (its shipped data has none)
        pytest.skip(f"torch {torch.__version__}'s shipped samples have no float32 {overload}")
    rebuilt = build_program(sample, sample.inputs)
    exported = torch.export.export(OpCall(sample), tuple(sample.inputs), strict=False)

    def shape(program):
        nodes = [n for n in program.graph_module.graph.nodes if n.op == "call_function"]
        return [(str(n.target), str(torch.fx.node.map_arg(n.args, lambda a: "input")), n.kwargs.keys()) for n in nodes]

    assert shape(rebuilt) == shape(exported)
    out_rebuilt = [n.meta["val"] for n in rebuilt.graph_module.graph.output_node().args[0]]
    out_exported = [n.meta["val"] for n in exported.graph_module.graph.output_node().args[0]]
    assert [(t.dtype, t.shape) for t in out_rebuilt] == [(t.dtype, t.shape) for t in out_exported]


def test_discovery_finds_single_op_samples_and_skips_the_rest():
    op_db, reason = _compat.opinfo_database()
    if op_db is None:
        pytest.skip(reason)
    chosen = [o for o in op_db if o.name in ("sub", "nn.functional.linear", "bernoulli")]
    data = discovery.discover(chosen, max_samples=1, tries=3)
    overloads = {s.overload for s in data.samples}
    assert "aten.sub.Tensor" in overloads
    assert not any("bernoulli" in o for o in overloads)  # random: never a check
    assert not any(o.startswith("aten.linear") for o in overloads)  # decomposes into several ops


def test_without_data_or_opinfo_the_category_is_skipped_with_a_notice(tmp_path, monkeypatch):
    monkeypatch.setattr(discovery, "DATA_DIR", tmp_path / "none")
    monkeypatch.setenv("BACKENDCONF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_compat, "opinfo_database", lambda: (None, "OpInfo moved in this torch"))

    class Ctx:
        ops_mode = "default"
        notices: list = []

        def memo(self, key, make):
            return make()

    ctx = Ctx()
    assert ops_category._load_or_discover(ctx, "default") is None
    assert ctx.notices == [
        f"ops category skipped: no ops data for torch {discovery.release()} and OpInfo moved in this torch"
    ]


def test_each_ops_mode_selects_its_samples():
    from pytest_backendconf.capabilities import Capabilities

    class Ctx:
        capabilities = Capabilities()  # every dtype declared
        notices: list = []

        def __init__(self, mode):
            self.ops_mode = mode
            self._memo = {}

        def memo(self, key, make):
            return self._memo.setdefault(key, make())

    def selection(mode):
        every = [c.name for c in ops_category.checks(Ctx(mode))]
        # The quantized operators (test_ops_quantized.py) come last, the same in every mode.
        names = [c.name for c in ops_category._opinfo_checks(Ctx(mode))]
        assert every[: len(names)] == names and len(every) - len(names) == 18
        dtypes = {n.rpartition("[")[2].split("-")[0] for n in names}
        samples = {n.rpartition("-")[2].rstrip("]") for n in names}
        return len(names), dtypes, samples

    quick, default = selection("quick"), selection("default")
    assert quick[1:] == ({"float32", "float16"}, {"sample0"})  # no long-reduction samples
    assert default[1] == {"float32", "float16", "bfloat16", "int64", "bool"}
    assert default[2] == {"sample0", "sample1", "long0"}
    assert 300 <= quick[0] < default[0]


# --- tensor files ---------------------------------------------------------------------------


def test_tensor_file_round_trip_and_errors(tmp_path):
    tensors = {
        "a": torch.arange(6, dtype=torch.float16).reshape(2, 3),
        "b": torch.tensor([True, False]),
        "c": torch.empty(0, 3),
    }
    path = tmp_path / "x.safetensors"
    write_tensors(path, tensors, {"kind": "ops"})
    back, meta = read_tensors(path)
    assert meta == {"kind": "ops"}
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(TensorFileError, match="truncated or not a tensor file"):
        read_tensors(path)
    with pytest.raises(TensorFileError, match="complex128"):
        write_tensors(tmp_path / "y", {"z": torch.zeros(2, dtype=torch.complex128)})


# --- numerics ---------------------------------------------------------------------------------


def test_closeness_statistics_name_the_worst_element():
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float16)
    actual = expected.clone()
    actual[1, 0] = 3.0 + 0.03125  # 16 ULP at 3.0 in float16
    (result,) = compare_outputs([actual], [expected], Tolerance(1e-3, 1e-5))
    assert not result.passed and result.mismatched == 1
    assert result.index == (1, 0) and result.actual == pytest.approx(3.03125) and result.expected == 3.0
    assert result.ulp == 16
    assert result.max_abs == pytest.approx(0.03125)
    assert result.closeness == pytest.approx(0.03125 / (1e-5 + 3e-3))
    assert "max abs error 0.03125" in result.text() and "16 ULP apart" in result.text()


def test_nan_inf_and_integers():
    (same,) = compare_outputs(
        [torch.tensor([math.nan, math.inf])], [torch.tensor([math.nan, math.inf])], Tolerance(0, 0)
    )
    assert same.passed and same.closeness == 0
    (one_nan,) = compare_outputs([torch.tensor([math.nan])], [torch.tensor([1.0])], Tolerance(1, 1))
    assert not one_nan.passed and one_nan.closeness == math.inf
    (ints,) = compare_outputs([torch.tensor([1, 5])], [torch.tensor([1, 4])], Tolerance(1, 1))
    assert not ints.passed and ints.ulp is None  # integers are exact, whatever the tolerance
    assert ulp_distance(torch.tensor(-0.0), torch.tensor(0.0)) == 0
    assert ulp_distance(torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor(1.0078125, dtype=torch.bfloat16)) == 1


def test_tolerance_lookup_is_most_specific_first():
    defaults = {"float16": [1e-3, 1e-5]}
    declared = {
        "aten.exp.default": (0.01, 0.001),
        "small_cnn": {torch.float16: (0.02, 0.002)},
        torch.float16: (0.005, 0.0),
    }
    assert resolve_tolerance(torch.float16, ["aten.exp.default"], declared, defaults).rtol == 0.01
    by_model = resolve_tolerance(torch.float16, ["small_cnn"], declared, defaults)
    assert (by_model.rtol, by_model.source) == (0.02, "override 'small_cnn' in the backend's capabilities")
    assert resolve_tolerance(torch.float16, ["other"], declared, defaults).source == "the backend's capabilities"
    assert resolve_tolerance(torch.float16, ["other"], {}, defaults) == Tolerance(1e-3, 1e-5, "default")
    # cos of an int64 tensor is a float32 tensor: float32's tolerance, not int64's exactness
    sample = next(s for s in SHIPPED.samples if s.overload == "aten.cos.default" and s.dtype == "int64")
    program = build_program(sample, sample.inputs)

    class Ctx:
        capabilities = bc.Capabilities()

    assert ops_category.output_dtypes(program) == [torch.float32]
    assert ops_category.tolerance_for(Ctx(), sample, False, [torch.float32]) == Tolerance(1.3e-6, 1e-5, "default")
    assert ops_category.tolerance_for(Ctx(), sample, False, [torch.int64]) == Tolerance(0.0, 0.0, "default")


def test_capabilities_accept_per_op_and_per_model_tolerances():
    assert (
        bc.Capabilities(
            tolerances={"aten.exp.default": (1e-2, 1e-3), "small_cnn": {torch.float16: (1e-2, 0.0)}}
        ).problems()
        == []
    )
    problems = bc.Capabilities(tolerances={"aten.exp.default": (1e-2,)}).problems()
    assert problems and "aten.exp.default" in problems[0]
    # and the report records them as declared
    from pytest_backendconf.report._report import declared

    caps = bc.Capabilities(tolerances={"aten.exp.default": {torch.float32: (1e-2, 1e-3)}, torch.float16: (1e-3, 0)})
    assert declared(caps)["tolerances"] == {"aten.exp.default": {"float32": [1e-2, 1e-3]}, "float16": [1e-3, 0.0]}


# --- the matrix, grouping ------------------------------------------------------------------


def test_matrix_summary_and_capabilities():
    tests = [
        {"id": "backendconf::ops::aten.add.Tensor[float32-sample0]", "outcome": "passed"},
        {"id": "backendconf::ops::aten.add.Tensor[float16-sample0]", "outcome": "passed"},
        {"id": "backendconf::ops::aten.sub.Tensor[float32-sample0]", "outcome": "passed"},
        {"id": "backendconf::ops::aten.sub.Tensor[float16-sample0]", "outcome": "failed"},
        {"id": "backendconf::ops::aten.gather.default[float32-sample0]", "outcome": "unsupported"},
        {"id": "backendconf::parity::x[float32]", "outcome": "failed"},
    ]
    matrix = ops_matrix(records(tests), declared={"aten.sub.Tensor", "aten.add.Tensor"})
    assert matrix is not None
    assert matrix["overloads"]["aten.sub.Tensor"] == {
        "float32": "passed",
        "float16": "failed",
        "bfloat16": "not under test",
        "int64": "not under test",
        "bool": "not under test",
    }
    assert (
        summary_line(matrix)
        == "ops  3/5 passed; 1 unsupported, 0 known failures, 1 failed — 1 of 3 overloads fully supported"
    )
    assert matrix["declared_but_not_passing"] == ["aten.sub.Tensor"]
    text = capabilities_text(matrix)
    assert text.startswith('Capabilities(supported_ops={\n    "aten.add.Tensor",\n})')
    assert "#   aten.sub.Tensor: not in float16" in text
    assert parse_id("backendconf::ops::aten.add.Tensor[float16-sample1]") == ("aten.add.Tensor", "float16", 1)


def test_failures_sharing_a_template_form_one_group():
    failures = [
        {
            "id": f"backendconf::ops::aten.sub.Tensor[float16-sample{k}]",
            "error": {
                "type": "CheckFailed",
                "message": f"aten.sub.Tensor in float16 (sample {k}): max abs error 0.0{k}1",
            },
        }
        for k in range(4)
    ] + [{"id": "backendconf::parity::x[float32]", "error": {"type": "ValueError", "message": "bad blob 'x'"}}]
    groups = group_failures(records(failures))
    assert [len(g.ids) for g in groups] == [4, 1]
    assert groups[0].template == "CheckFailed: <op> in float16 (sample <n>): max abs error <n>"
    assert template("ValueError", "bad blob 'x'") == "ValueError: bad blob <name>"


# --- against real backends --------------------------------------------------------------------


def _run(pytester, backend, *selects, extra=()):
    args = ["-p", "broken_backends_ops", f"--backend={backend}", "-p", "no:cacheprovider", "-p", "no:randomly", *extra]
    args += [f"--backendconf-select={s}" for s in selects]
    return pytester.runpytest(*args)


@pytest.fixture
def ops_pytester(pytester):
    import pathlib

    pytester.syspathinsert(pathlib.Path(__file__).parent)
    pytester.makeini("[pytest]\n")
    return pytester


@pytest.mark.slow
@needs_data
def test_wrong_float16_sub_fails_exactly_its_checks_and_names_the_node(ops_pytester, monkeypatch):
    # In the backend host (as users run it), which must know the -p modules for the rerun commands.
    monkeypatch.delenv("BACKENDCONF_IN_PROCESS", raising=False)
    report = ops_pytester.path / "report.json"
    result = _run(
        ops_pytester,
        "wrong_half_sub",
        "backendconf::ops::aten.sub.Tensor*",
        "backendconf::ops::aten.add.Tensor*",
        "backendconf::parity::nested_nml*",
        "backendconf::parity::small_cnn*",
        "backendconf::parity::arithmetic_tensors[[]float16-dynamic]",
        extra=[f"--backendconf-report={report}", "--backendconf-hypothesis=ci"],
    )
    document = json.loads(report.read_text())
    failed = sorted(t["id"] for t in document["tests"] if t["outcome"] == "failed")
    subs = sorted(
        t["id"] for t in document["tests"] if t["id"].startswith("backendconf::ops::aten.sub.Tensor[float16-")
    )
    assert len(subs) == 2  # up to two samples per (overload, dtype) by default
    dynamic = "backendconf::parity::arithmetic_tensors[float16-dynamic]"
    assert failed == sorted(subs + ["backendconf::parity::nested_nml[float16]", dynamic])
    # a dynamic-shape failure carries the same numerics as a static one
    numbers = next(t for t in document["tests"] if t["id"] == dynamic)["error"]["message"]
    assert "max abs error" in numbers and "ULP apart" in numbers and "closeness" in numbers
    section = result.stdout.str().split("arithmetic_tensors[float16-dynamic] ___", 1)[1].split("\n___", 1)[0]
    assert "Diverges first at node 'sub' (aten::sub)" in section and "(x - y)" in section
    text = result.stdout.str()
    assert "Diverges first at node 'sub' (aten::sub): max abs error" in text
    assert "return self.l(x) - 2" in text  # the user's source line of the subtraction
    assert "max abs error" in text and "max rel error" in text and "ULP apart" in text
    assert "rerun this comparison: python -m pytest_backendconf.rerun" in text
    assert "declared in Capabilities.supported_ops but failed or rejected: aten.sub.Tensor" in text
    # each failure group once, before pytest's own list
    assert text.index("failures grouped by message") < text.index("short test summary info")
    # the saved inputs rerun the comparison alone, from the file
    saved = next(line.split("inputs: ", 1)[1].strip() for line in text.splitlines() if "  inputs: " in line)
    command = next(
        line.split("rerun this comparison: ", 1)[1] for line in text.splitlines() if "rerun this comparison: " in line
    )
    assert command.endswith("--backend=wrong_half_sub -p broken_backends_ops")
    assert saved in command
    parity = next(
        line.split("rerun this comparison: ", 1)[1]
        for line in text.splitlines()
        if "rerun this comparison: " in line and "nested_nml.forward-float16.safetensors" in line
    )
    at_sizes = next(
        line.split("rerun this comparison: ", 1)[1]
        for line in text.splitlines()
        if "rerun this comparison: " in line and "-dynamic.safetensors" in line
    )
    assert at_sizes.endswith("--backend=wrong_half_sub -p broken_backends_ops")
    (op, model, dynamic) = rerun_commands([command, parity, at_sizes])
    assert op["code"] == 1 and "FAILED" in op["stdout"] and "max abs error" in op["stdout"], op["stderr"]
    assert model["code"] == 1 and "nested_nml.forward in float16" in model["stdout"], model["stderr"]
    assert dynamic["code"] == 1 and "lowered with dynamic shapes, at rows=" in dynamic["stdout"], dynamic["stderr"]


# Runs printed `python -m pytest_backendconf.rerun ...` commands one after the other in one fresh
# process, each as `python -m` runs it (runpy, sys.argv, its exit status): one torch import for all.
_RERUN = """
import contextlib, io, json, runpy, sys
done = []
for module, args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [module, *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    done.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(done))
"""


def rerun_commands(commands: list[str]) -> list[dict]:
    """The exit status and output of each printed rerun command."""
    calls = []
    for command in commands:
        python, dash_m, module, *args = shlex.split(command)
        assert (python, dash_m, module) == ("python", "-m", "pytest_backendconf.rerun"), command
        calls.append([module, args])
    done = subprocess.run(
        [sys.executable, "-c", _RERUN, json.dumps(calls)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_data
def test_report_schema_of_the_ops_matrix_and_numerics(ops_pytester):
    report = ops_pytester.path / "report.json"
    result = _run(
        ops_pytester,
        "reference",
        "backendconf::ops::aten.add.Tensor*",
        "backendconf::ops::aten.rsqrt*",
        extra=[f"--backendconf-report={report}"],
    )
    result.assert_outcomes(passed=result.parseoutcomes()["passed"])
    document = json.loads(report.read_text())
    ops = document["ops"]
    assert set(ops) == {
        "dtypes",
        "checks",
        "overloads_total",
        "overloads_fully_supported",
        "fully_supported",
        "declared_but_not_passing",
        "overloads",
        "samples",
    }
    # The sample set the checks were made from: the shipped one for this torch.
    assert ops["samples"]["source"] == "shipped" and ops["samples"]["digest"].startswith("sha256:")
    assert ops["samples"]["count"] >= len({t["id"] for t in document["tests"] if t["category"] == "ops"})
    assert ops["dtypes"] == ["float32", "float16", "bfloat16", "int64", "bool"]
    assert ops["checks"] == document["summary"]["ops"]  # one count for the matrix and the summary
    assert set(ops["overloads"]["aten.add.Tensor"].values()) <= {"passed", "unsupported", "failed", "not under test"}
    test = next(t for t in document["tests"] if t["id"] == "backendconf::ops::aten.rsqrt.default[float16-sample0]")
    numerics = test["numerics"]
    assert set(numerics) == {
        "closeness",
        "max_abs_error",
        "max_rel_error",
        "sqnr_db",
        "eager_error",
        "outputs",
        "reference",
    }
    assert numerics["reference"] == "eager in float64, cast back"
    assert set(numerics["eager_error"]) == {"max_abs_error", "max_rel_error", "closeness", "sqnr_db"}
    assert set(numerics["outputs"][0]) == {
        "output",
        "dtype",
        "numel",
        "mismatched",
        "max_abs_error",
        "max_rel_error",
        "index",
        "actual",
        "expected",
        "ulp",
        "closeness",
        "tolerance",
        "sqnr_db",
        "eager_error",
        "passed_by",
    }
    assert numerics["outputs"][0]["passed_by"] in ("tolerance", "eager")
    assert set(numerics["outputs"][0]["tolerance"]) == {"rtol", "atol", "source"}
    assert "ops  " in result.stdout.str() and "overloads fully supported" in result.stdout.str()
    cli = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "report", "ops", str(report), "--capabilities"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith("Capabilities(supported_ops={\n") and '"aten.add.Tensor",' in cli.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "report", "ops", str(ops_pytester.path / "nope.json")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "cannot read report" in bad.stderr


@pytest.mark.slow
@needs_data
def test_a_backend_more_accurate_than_eager_passes_float16_ops(ops_pytester):
    report = ops_pytester.path / "report.json"
    result = _run(
        ops_pytester, "accurate_half", "backendconf::ops::*[[]float16-*", extra=[f"--backendconf-report={report}"]
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] >= 50, result.stdout.str()[-3000:]
    passed = {t["id"] for t in json.loads(report.read_text())["tests"] if t["outcome"] == "passed"}
    assert "backendconf::ops::aten.rsqrt.default[float16-sample0]" in passed


class _Scaled(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x) * 2
        z = y - x
        return torch.sigmoid(z).sum()


def test_locate_divergence_public_api():
    from broken_backends_ops import WrongHalfSub

    x = torch.randn(3, 4, dtype=torch.float16)
    info = bc.locate_divergence(_Scaled(), WrongHalfSub(), (x,))
    assert info is not None and info.op == "aten::sub" and info.node == "sub"
    assert "z = y - x" in str(info)
    assert bc.locate_divergence(_Scaled(), "reference", (x,)) is None


@needs_data
def test_an_ops_failure_text_names_the_ops_other_arguments():
    sample = next(s for s in SHIPPED.samples if s.overload == "aten.avg_pool2d.default")
    text = ops_category._headline(sample, False)
    assert "divisor_override=2" in text and "kernel_size=[" in text
    assert "self=" not in text  # the input tensor is in the saved file, not in the text
    sub = next(s for s in SHIPPED.samples if s.overload == "aten.sub.Tensor")
    assert ops_category._headline(sub, False).endswith("from OpInfo 'sub')")  # nothing but tensors: nothing added
