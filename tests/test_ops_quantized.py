"""The ops category's quantized operators: the Q/DQ overloads and single-op quantized programs.

Eager PyTorch running the programs node by node passes every check, and so
does a backend that rounds ties away from zero; a truncating quantize, a
dequantize without its zero point, per-channel scales on the wrong axis and
a dynamic quantization that takes every activation for non-negative each
fail the checks of the operator they break (broken_backends_quantized.py).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("torchao", reason="the broken backends import torchao's PT2E package (the [quant] extra)")

from pytest_backendconf.quant import SCHEMES, reference_quantizer, torchao_missing

# Imported once, before the in-process pytester runs (see test_quantized.py).
assert torchao_missing() is None
reference_quantizer(SCHEMES[0])
import broken_backends_quantized  # noqa: E402, F401

from pytest_backendconf.conformance.ops import _quantized as _ops_quantized  # noqa: E402
from pytest_backendconf.checks import CheckFailed  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
QDQ = [f"backendconf::ops::{s.name}" for s in _ops_quantized.qdq_samples()]
PROGRAMS = [f"backendconf::ops::{p.name}" for p in _ops_quantized.PROGRAMS]
EVERY = QDQ + PROGRAMS


def run(pytester, backend: str, *select: str) -> tuple[dict, pytest.RunResult]:
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    report = pytester.path / f"report-{backend}.json"
    args = ["-p", "broken_backends_quantized", f"--backend={backend}", "-p", "no:cacheprovider", "-m", "ops"]
    args += ["-p", "no:randomly", "--backendconf-in-process", "--backendconf-minify=off"]
    args += [f"--backendconf-report={report}", *(f"--backendconf-select={s.replace('[', '[[]')}" for s in select)]
    result = pytester.runpytest(*args)
    tests = {t["id"]: t for t in json.loads(report.read_text())["tests"]}
    return tests, result


def test_the_ids_name_each_overload_and_dtype_and_each_program_and_scheme():
    assert QDQ[:2] == [
        "backendconf::ops::quantized_decomposed.quantize_per_tensor.default[int8-sample0]",
        "backendconf::ops::quantized_decomposed.quantize_per_tensor.default[uint8-sample0]",
    ]
    assert len(QDQ) == 12 and len(set(QDQ)) == 12
    assert "backendconf::ops::aten.conv2d.default[int8-static-per-channel]" in PROGRAMS
    assert "backendconf::ops::aten.linear.default[int8-dynamic]" in PROGRAMS


@pytest.mark.parametrize("backend", ["eager_qdq", "other_tie_rule"])
def test_eager_qdq_and_another_tie_rule_pass_every_quantized_op(pytester, backend):
    tests, result = run(pytester, backend, *EVERY)
    assert set(tests) == set(EVERY), result.stdout.str()[-2000:]
    assert {t["outcome"] for t in tests.values()} == {"passed"}, result.stdout.str()[-3000:]
    quantizes = [t["details"]["quantize"] for t in tests.values() if "quantize" in (t.get("details") or {})]
    assert len(quantizes) == 6 and all(q["ties"] > 0 for q in quantizes)
    # Rounding ties away from zero moves exactly the tie elements, and only those pass one step off.
    moved = sum(q["off_at_ties"] for q in quantizes)
    assert moved > 0 if backend == "other_tie_rule" else moved == 0


@pytest.mark.parametrize(
    ("backend", "failing"),
    [
        (
            "truncating_quantize",
            {
                "quantized_decomposed.quantize_per_tensor.default",
                "quantized_decomposed.quantize_per_tensor.tensor",
                "quantized_decomposed.quantize_per_channel.default",
                "aten.conv2d.default",
                "aten.linear.default",
                "aten.add.Tensor",
            },
        ),
        (
            "dropped_zero_point",
            {
                "quantized_decomposed.dequantize_per_tensor.default",
                "quantized_decomposed.dequantize_per_tensor.tensor",
                "aten.conv2d.default",
                "aten.linear.default",
                "aten.add.Tensor",
            },
        ),
        (
            "wrong_channel_axis",
            {
                "quantized_decomposed.quantize_per_channel.default",
                "quantized_decomposed.dequantize_per_channel.default",
                "aten.conv2d.default",
                "aten.linear.default",
            },
        ),
        ("unsigned_dynamic_range", {"aten.linear.default"}),
    ],
)
def test_each_broken_kernel_fails_the_checks_of_what_it_breaks(pytester, backend, failing):
    tests, result = run(pytester, backend, *EVERY)
    failed = {i for i, t in tests.items() if t["outcome"] == "failed"}
    assert {i.removeprefix("backendconf::ops::").partition("[")[0] for i in failed} == failing, result.stdout.str()[
        -3000:
    ]
    assert {t["outcome"] for i, t in tests.items() if i not in failed} == {"passed"}
    for test_id in failed:
        text = tests[test_id]["error"]["message"]
        name = test_id.removeprefix("backendconf::ops::")
        if test_id in QDQ:
            overload, _, dtype = name.partition("[")
            assert text.startswith(f"{overload} in {dtype.partition('-')[0]} (the suite's own sample 0, "), text
        else:
            assert text.startswith(f"{name}: the backend's quantized output differs from eager PyTorch"), text
    if backend == "unsigned_dynamic_range":
        # Only the dynamic scheme quantizes at run time; its failure is judged by SQNR.
        (dynamic,) = failed
        assert dynamic.endswith("[int8-dynamic]")
        text = tests[dynamic]["error"]["message"]
        assert (
            "or, for an output no dequantize produces (a float output, as run-time quantization gives), an SQNR" in text
        )
        assert text.splitlines()[1].endswith(" dB below, quantized at run time)")


def _sample(overload: str, dtype: str = "int8"):
    (sample,) = [s for s in _ops_quantized.qdq_samples() if s.overload == overload and s.dtype == dtype]
    return sample


def test_a_quantize_may_be_one_step_off_at_a_tie_only():
    sample = _sample("quantized_decomposed.quantize_per_tensor.default")
    want = torch.ops.quantized_decomposed.quantize_per_tensor.default(*_ops_quantized._call_args(sample))
    quotient = _ops_quantized._quotient(sample)
    at_tie = ((quotient - quotient.floor() - 0.5).abs() < 1e-4) & (want > -128) & (want < 127)
    off_tie = ~at_tie & (want > -128) & (want < 127)
    tie_moved = want.clone()
    tie_moved[at_tie] += 1
    found = _ops_quantized._judge_quantize(sample, tie_moved, want, "q")["quantize"]
    assert found["wrong"] == 0 and found["off_at_ties"] == int(at_tie.sum()) > 0
    elsewhere = want.clone()
    first = off_tie.nonzero()[0]
    elsewhere[tuple(first)] += 1
    with pytest.raises(CheckFailed, match=r"^q: 1 of 120 quantized elements differ .* max 1 steps; first at"):
        _ops_quantized._judge_quantize(sample, elsewhere, want, "q")
    two = want.clone()
    two[tuple(at_tie.nonzero()[0])] += 2
    with pytest.raises(CheckFailed, match="max 2 steps"):
        _ops_quantized._judge_quantize(sample, two, want, "q")


def test_the_samples_are_the_same_every_time_and_hold_saturation():
    first, second = _ops_quantized.qdq_samples(), _ops_quantized.qdq_samples()
    assert all(torch.equal(a, b) for x, y in zip(first, second) for a, b in zip(x.inputs, y.inputs))
    sample = _sample("quantized_decomposed.quantize_per_tensor.default", "uint8")
    quantized = torch.ops.quantized_decomposed.quantize_per_tensor.default(*_ops_quantized._call_args(sample))
    assert int(quantized.min()) == 0 and int(quantized.max()) == 255  # both ends saturate
    assert first[0].inputs[0] is not second[0].inputs[0]  # a backend writing its inputs spoils no later check


def test_the_ops_matrix_has_integer_columns_and_counts_the_programs_outside_it():
    from pytest_backendconf.report._ops import ops_matrix
    from report_records import records

    entries = [
        {"id": "backendconf::ops::aten.add.Tensor[float32-sample0]", "outcome": "passed"},
        {"id": "backendconf::ops::quantized_decomposed.quantize_per_tensor.default[int8-sample0]", "outcome": "passed"},
        {
            "id": "backendconf::ops::quantized_decomposed.quantize_per_tensor.default[uint8-sample0]",
            "outcome": "failed",
        },
        {"id": "backendconf::ops::aten.conv2d.default[int8-static-per-tensor]", "outcome": "passed"},
    ]
    tests = records(entries)
    matrix = ops_matrix(tests)
    assert matrix["dtypes"] == ["float32", "float16", "bfloat16", "int64", "bool", "int8", "uint8"]
    row = matrix["overloads"]["quantized_decomposed.quantize_per_tensor.default"]
    assert (row["int8"], row["uint8"], row["float32"]) == ("passed", "failed", "not under test")
    assert "aten.conv2d.default" not in matrix["overloads"] and matrix["checks"]["total"] == 4
    assert matrix["fully_supported"] == ["aten.add.Tensor"]
    assert ops_matrix(tests[:1])["dtypes"] == ["float32", "float16", "bfloat16", "int64", "bool"]
