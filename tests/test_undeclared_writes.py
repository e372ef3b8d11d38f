"""An op whose eager kernel writes an input its schema does not declare: outputs judged, the write reported apart.

``aten.native_batch_norm`` in training mode updates its running statistics in
eager PyTorch; its schema declares no write, and the contract forbids
``execute`` to change its inputs. A functional backend (right outputs, inputs
untouched) passes, with the write it did not make reported in the check's
details; a backend that changes the statistics to other values fails.
"""

from __future__ import annotations

import json
import pathlib

CHECK = "backendconf::ops::aten.native_batch_norm.default[float32-sample0]"


def _run(pytester, backend):
    pytester.syspathinsert(pathlib.Path(__file__).parent)
    pytester.makeini("[pytest]\n")
    report = pytester.path / f"{backend}.json"
    result = pytester.runpytest(
        "-p",
        "backends_undeclared_writes",
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        f"--backendconf-select={CHECK}",
        f"--backendconf-report={report}",
    )
    (test,) = [t for t in json.loads(report.read_text())["tests"] if t["id"] == CHECK]
    return result, test


def test_a_functional_backend_passes_and_the_undeclared_write_is_reported_apart(pytester):
    _, test = _run(pytester, "functional_copies")
    assert test["outcome"] == "passed", test
    # The sample is a training one: eager writes running_mean (input 3) and running_var (input 4).
    assert test["details"]["undeclared_writes"] == [
        {"input": 3, "backend": "left unchanged (eager writes it; the schema declares no write)"},
        {"input": 4, "backend": "left unchanged (eager writes it; the schema declares no write)"},
    ]


def test_the_reference_backend_passes_leaving_its_inputs_unchanged(pytester):
    _, test = _run(pytester, "reference")
    assert test["outcome"] == "passed", test
    assert {(w["input"], w["backend"].split(" (")[0]) for w in test["details"]["undeclared_writes"]} == {
        (3, "left unchanged"),
        (4, "left unchanged"),
    }


def test_a_backend_writing_other_statistics_fails_naming_the_input(pytester):
    _, test = _run(pytester, "writes_stats_wrong")
    assert test["outcome"] == "failed"
    assert "execute() changed input 3 in place to other values than eager's" in test["error"]["message"]
    assert "schema declares no write" in test["error"]["message"]
