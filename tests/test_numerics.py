"""The numerics verdict: three-way comparison, writes, ties, long reductions, with eager backends.

The backends are in eager_backends.py: eager PyTorch itself (every node
through torch.ops), and one defect or virtue each. Suite runs use pytester
in-process with ``--backendconf-select`` narrowed; the eager backend through
the whole default ``parity``/``ops``/``delegation`` suite is the slow test
at the end (``make test-slow``).
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from pytest_backendconf.conformance.ops import discovery
from pytest_backendconf.conformance.ops import long_samples
from pytest_backendconf.conformance.ops import InvalidIndices, settle_ties
from pytest_backendconf.numerics import Tolerance, compare_outputs, summary_json

SHIPPED = discovery.load(discovery.DATA_DIR, discovery.release())
needs_data = pytest.mark.skipif(SHIPPED is None, reason=f"no ops data shipped for torch {torch.__version__}")
TOL = Tolerance(1e-3, 1e-5, "default")


# --- the rule ---------------------------------------------------------------------------------


def test_out_of_tolerance_but_no_worse_than_eager_passes():
    truth = torch.tensor([100.0, 1.0], dtype=torch.float16)
    eager = torch.tensor([100.5, 1.0], dtype=torch.float16)  # eager itself is 0.5% off
    backend = torch.tensor([100.0, 1.001], dtype=torch.float16)
    (same,) = compare_outputs([eager], [truth], TOL, [eager], 2.0)
    assert same.mismatched == 1 and same.passed and same.passed_by_eager
    (closer,) = compare_outputs([backend], [truth], TOL, [eager], 2.0)
    assert closer.passed
    worse = torch.tensor([102.0, 1.0], dtype=torch.float16)  # 4x eager's error
    (far,) = compare_outputs([worse], [truth], TOL, [eager], 2.0)
    assert not far.passed
    text = far.text()
    assert "max abs error 2" in text and "max rel error" in text
    assert "eager PyTorch in float16 against the same reference: max abs error 0.5" in text and "2x eager's" in text


def test_eager_exact_leaves_only_the_tolerance():
    truth = torch.tensor([1.0, 2.0], dtype=torch.float16)
    (result,) = compare_outputs([truth + 0.01], [truth], TOL, [truth.clone()], 2.0)
    assert result.eager is not None and result.eager.closeness == 0 and not result.passed


def test_eager_overflow_is_not_charged_to_a_backend_that_reproduces_it():
    truth = torch.tensor([60000.0, 1.0], dtype=torch.float16)
    eager = torch.tensor([math.inf, 1.0], dtype=torch.float16)
    (same,) = compare_outputs([eager.clone()], [truth], TOL, [eager], 2.0)
    assert same.passed
    (nan,) = compare_outputs([torch.tensor([math.nan, 1.0], dtype=torch.float16)], [truth], TOL, [eager], 2.0)
    assert not nan.passed and nan.closeness == math.inf


def test_sqnr_and_eager_error_in_the_json():
    truth = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float16)
    eager = torch.tensor([1.0, -1.0, 2.002], dtype=torch.float16)
    results = compare_outputs([truth.clone()], [truth], TOL, [eager], 2.0)
    summary = summary_json(results)
    assert summary["sqnr_db"] == "inf" and summary["eager_error"]["closeness"] > 0
    assert isinstance(summary["eager_error"]["sqnr_db"], float) and summary["eager_error"]["sqnr_db"] > 40
    assert summary["outputs"][0]["passed_by"] == "tolerance"
    plain = summary_json(compare_outputs([truth + 0.5], [truth], TOL))
    assert plain["eager_error"] is None and 0 < plain["sqnr_db"] < 20


# --- ties ------------------------------------------------------------------------------------


def _topk_sample(values):
    x = torch.tensor(values)
    return discovery.OpSample("aten.topk.default", "int64", 0, "topk", [{"$input": 0}, 2], {}, [0, 1], [x])


def test_tie_open_indices_are_checked_for_validity():
    sample = _topk_sample([5, 3, 5, 1])
    eager = list(torch.ops.aten.topk.default(sample.inputs[0], 2))
    other = [eager[0], eager[1].flip(0)]  # the tie 5/5 broken the other way
    settled, at = settle_ties(sample, other, eager)
    assert at == [1] and torch.equal(settled[1], eager[1])
    with pytest.raises(InvalidIndices, match="selects 3 where eager's index 0 selects 5"):
        settle_ties(sample, [eager[0], torch.tensor([1, 2])], eager)
    with pytest.raises(InvalidIndices, match="out of range"):
        settle_ties(sample, [eager[0], torch.tensor([0, 4])], eager)
    with pytest.raises(InvalidIndices, match="repeats"):
        settle_ties(sample, [eager[0], torch.tensor([0, 0])], eager)


def test_a_stable_sort_keeps_exact_indices():
    x = torch.tensor([2.0, 2.0, 1.0])
    sample = discovery.OpSample(
        "aten.sort.stable", "float32", 0, "sort", [{"$input": 0}], {"stable": True}, [0, 1], [x]
    )
    eager = list(torch.ops.aten.sort.stable(x, stable=True))
    other = [eager[0], torch.tensor([2, 1, 0])]
    assert settle_ties(sample, other, eager) == (other, [])


# --- data ------------------------------------------------------------------------------------


@needs_data
def test_opinfo_tolerance_overrides_are_in_the_data_and_named_as_the_source():
    from pytest_backendconf.conformance.ops import _category as ops_category

    assert SHIPPED.tolerances["addbmm"]["float16"] == [0.01, 0.006]
    sample = next(s for s in SHIPPED.samples if s.overload == "aten.addbmm.default" and s.dtype == "float16")
    assert sample.opinfo_tolerance == (0.01, 0.006)

    class Ctx:
        class capabilities:
            tolerances = None

    tolerance = ops_category.tolerance_for(Ctx(), sample, True, [torch.float16])
    assert tolerance.source.startswith("OpInfo 'addbmm' toleranceOverride for float16")
    assert (tolerance.rtol, tolerance.atol) == (0.02, 0.012)  # x2 against the float64 reference

    class Declared:
        class capabilities:
            tolerances = {torch.float16: (0.1, 0.1)}

    assert ops_category.tolerance_for(Declared(), sample, False, [torch.float16]).source == "the backend's capabilities"


def test_long_samples_are_seeded_and_long():
    first, again = long_samples(), long_samples()
    assert [s.name for s in first] == [s.name for s in again]
    assert all(torch.equal(a, b) for s, t in zip(first, again) for a, b in zip(s.inputs, t.inputs))
    names = {s.name for s in first}
    assert "aten.sum.dim_IntList[float16-long0]" in names and "aten.mm.default[bfloat16-long0]" in names
    assert all(max(t.numel() for t in s.inputs) >= 4096 for s in first)
    assert {s.dtype for s in first} == {"float16", "bfloat16"}


# --- against eager backends --------------------------------------------------------------------


@pytest.fixture
def eager_pytester(pytester):
    pytester.syspathinsert(pathlib.Path(__file__).parent)
    pytester.makeini("[pytest]\n")
    return pytester


def _run(pytester, backend, *selects, extra=()):
    report = pytester.path / f"report-{backend}.json"
    args = ["-p", "eager_backends", f"--backend={backend}", "-p", "no:cacheprovider", "-p", "no:randomly"]
    args += [f"--backendconf-report={report}", "--backendconf-hypothesis=ci", *extra]
    args += [f"--backendconf-select={s}" for s in selects]
    result = pytester.runpytest(*args)
    tests = json.loads(report.read_text())["tests"]
    return result, {t["id"]: t for t in tests}


REDUCTIONS = ("aten.sum.", "aten.mean.")


@needs_data
def test_a_float16_accumulator_fails_only_long_float16_sums_and_means(eager_pytester):
    result, tests = _run(
        eager_pytester,
        "half_accumulator",
        "backendconf::ops::aten.sum*",
        "backendconf::ops::aten.mean*",
        "backendconf::ops::aten.var*",
        "backendconf::ops::aten.mm*",
        "backendconf::ops::aten.add.Tensor*",
    )
    failed = {i for i, t in tests.items() if t["outcome"] == "failed"}
    assert failed, result.stdout.str()[-3000:]
    for test_id in failed:
        name = test_id.removeprefix("backendconf::ops::")
        assert name.startswith(REDUCTIONS) and ("[float16-" in name or "[bfloat16-" in name), test_id
    assert {
        "backendconf::ops::aten.sum.dim_IntList[float16-long0]",
        "backendconf::ops::aten.mean.dim[bfloat16-long0]",
    } <= failed
    test = tests["backendconf::ops::aten.sum.dim_IntList[float16-long0]"]
    text = test["error"]["message"]
    assert "max abs error" in text and "max rel error" in text and "eager PyTorch in float16" in text
    assert test["numerics"]["eager_error"]["closeness"] < 1 and test["numerics"]["closeness"] > 2
    passed = [t for t in tests.values() if t["outcome"] == "passed"]
    assert any(t["id"].endswith("[float16-long0]") and "aten.var" in t["id"] for t in passed)
    # The float checks; the selection also holds the quantized add program (`[int8-static-per-tensor]`),
    # judged in steps by the quantized verdict, with no float numerics block.
    float_passed = [t for t in passed if "float" in t["id"].partition("[")[2]]
    assert float_passed and all("sqnr_db" in t["numerics"] for t in float_passed)


@needs_data
def test_eager_and_a_more_accurate_backend_pass_ops_and_parity(eager_pytester):
    selects = (
        "backendconf::ops::aten.addbmm*",
        "backendconf::ops::aten.grid_sampler_2d*",
        "backendconf::ops::aten.linalg_matrix_exp*",
        "backendconf::ops::aten._adaptive_avg_pool3d*",
        "backendconf::ops::aten.native_batch_norm*",
        "backendconf::ops::aten.sum*[[]float16-long0]",
        "backendconf::ops::aten.mm*[[]bfloat16-long0]",
        "backendconf::parity::exp_log*",
        "backendconf::parity::small_cnn[[]bfloat16]",
    )
    for backend in ("eager", "float32_compute"):
        result, tests = _run(eager_pytester, backend, *selects)
        outcomes = result.parseoutcomes()
        assert outcomes.get("failed", 0) == 0 and outcomes["passed"] >= 20, (backend, result.stdout.str()[-3000:])
    # Eager writes the running statistics its schema does not declare: reported apart, not judged.
    batch_norm = tests["backendconf::ops::aten.native_batch_norm.default[float16-sample0]"]["details"]
    assert {w["input"] for w in batch_norm["undeclared_writes"]} == {3, 4}
    assert all(w["backend"].startswith("written as eager writes it") for w in batch_norm["undeclared_writes"])
    parity = tests["backendconf::parity::small_cnn[bfloat16]"]["numerics"]
    assert parity["reference"] == "the model in float64, cast back" and parity["eager_error"] is not None


@needs_data
def test_a_corrupted_running_statistic_fails(eager_pytester):
    result, tests = _run(eager_pytester, "corrupt_running_mean", "backendconf::ops::aten.native_batch_norm*")
    failed = sorted(i for i, t in tests.items() if t["outcome"] == "failed")
    assert failed and all("-sample0]" in i for i in failed), result.stdout.str()[-3000:]
    assert "changed input 3 in place to other values than eager's" in tests[failed[0]]["error"]["message"]


@needs_data
def test_ties_broken_otherwise_pass_and_a_wrong_index_fails(eager_pytester):
    from eager_backends import _topk

    # The int64 topk samples do have ties the other backend breaks differently.
    sample = next(s for s in SHIPPED.samples if s.overload == "aten.topk.default" and s.dtype == "int64")
    args = discovery.decode_arg(sample.args, sample.inputs)
    assert not torch.equal(_topk(*args)[1], torch.ops.aten.topk.default(*args)[1])
    selects = ("backendconf::ops::aten.sort*", "backendconf::ops::aten.topk*", "backendconf::ops::aten.max.dim*")
    result, _ = _run(eager_pytester, "other_ties", *selects)
    assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()[-3000:]
    result, tests = _run(eager_pytester, "wrong_topk_index", *selects)
    failed = {i for i, t in tests.items() if t["outcome"] == "failed"}
    assert failed and all(i.startswith("backendconf::ops::aten.topk.") for i in failed)
    assert "(ties may be broken either way, other values may not)" in tests[sorted(failed)[0]]["error"]["message"]


@needs_data
def test_delegation_judges_with_parity_rule(eager_pytester):
    result, tests = _run(eager_pytester, "eager_no_sigmoid", "backendconf::delegation::*[[]encoder_decoder*")
    assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()[-3000:]
    assert any(t["outcome"] == "passed" for t in tests.values())


# Three runs, so that `make test-slow`'s two workers share them (the ops matrix alone takes minutes).
@pytest.mark.slow
@needs_data
@pytest.mark.parametrize(
    "backend, select",
    [
        ("eager", "backendconf::parity::*"),
        ("eager", "backendconf::ops::*"),
        ("eager_no_sigmoid", "backendconf::delegation::*"),
    ],
)
def test_eager_passes_every_parity_ops_and_delegation_check(eager_pytester, backend, select):
    result, tests = _run(eager_pytester, backend, select)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()[-5000:]
    assert tests and all(t["outcome"] in ("passed", "skipped") for t in tests.values())


def test_html_report_shows_the_closeness_distribution_per_category():
    from pytest_backendconf.report._closeness import closeness_table, distribution
    from pytest_backendconf.report._html import render
    from report_records import records, report_of

    entries = [
        {
            "id": "backendconf::ops::a[float16-sample0]",
            "category": "ops",
            "outcome": "passed",
            "numerics": {"closeness": 0.05},
        },
        {
            "id": "backendconf::ops::b[float16-sample0]",
            "category": "ops",
            "outcome": "passed",
            "numerics": {"closeness": 1.5},
        },
        {
            "id": "backendconf::ops::c[float16-sample0]",
            "category": "ops",
            "outcome": "failed",
            "numerics": {"closeness": "inf"},
        },
        {
            "id": "backendconf::parity::m[float32]",
            "category": "parity",
            "outcome": "passed",
            "numerics": {"closeness": 0.7},
        },
        {"id": "backendconf::contract::x", "category": "contract", "outcome": "passed", "numerics": None},
    ]
    tests = records(entries)
    found = distribution(tests)
    assert found["ops"] == {"< 0.1": [1, 0], "0.1 – 0.5": [0, 0], "0.5 – 1": [0, 0], "≥ 1": [1, 1]}
    assert found["parity"]["0.5 – 1"] == [1, 0] and "contract" not in found
    table = closeness_table(tests)
    assert "(1 failed)" in table and '<th scope="row">parity</th>' in table
    page = render([report_of(entries)])
    assert "Closeness to the reference" in page and table in page


class _Chain(torch.nn.Module):
    def forward(self, x):
        y = x + 1.5
        z = y * 2.0
        return z - 0.5


def test_a_group_wrong_only_together_is_named_with_each_source_line():
    from eager_backends import FusedPairsDrift

    from pytest_backendconf.diagnostics import locate_in_program

    x = torch.rand(4, 4) + 1
    program = torch.export.export(_Chain(), (x,))
    found = locate_in_program(program, FusedPairsDrift(), [x], top_class="_Chain")
    assert found is not None and len(found.group) == 2
    assert [i.node for i in found.group] == ["add", "mul"]
    text = found.text()
    assert text.startswith("Diverges first in a group of 2 nodes, each within tolerance alone but not together")
    assert "'add' (aten::add) at " in text and "y = x + 1.5" in text and "z = y * 2.0" in text
