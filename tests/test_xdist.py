"""pytest-xdist: the checks of one model go to one worker, and a distributed run gives a serial run's
outcomes, report, summary and JUnit file.

The speed of `-n 2` against a serial run is measured by
benchmarks/bench_xdist.py, never asserted here.
"""

from __future__ import annotations

import json
import re
import zlib
import xml.etree.ElementTree as ET

import pytest

from pytest_backendconf.suite._xdist import OPS_GROUPS, model_of, scope_of

from test_gating import ARITHMETIC, AVAILABLE, CONFTEST, LINEAR, MLP, expect, write

pytest.importorskip("xdist")


@pytest.mark.parametrize(
    ("nodeid", "model"),
    [
        ("backendconf::parity::small_cnn[float16]", "small_cnn"),
        ("backendconf::parity::encoder_decoder.decode[float32]", "encoder_decoder"),
        ("backendconf::parity::integer_arithmetic[fixed]", "integer_arithmetic"),
        ("backendconf::contract::preprocess_returns_bytes[mlp]", "mlp"),
        ("backendconf::serialization::round_trip[resnet18]", "resnet18"),
        ("backendconf::symbolication::runtime_fault_is_symbolicated[nested_nml:cos]", "nested_nml"),
        (
            "backendconf::symbolication::runtime_fault_is_symbolicated[encoder_decoder.decode:sigmoid]",
            "encoder_decoder",
        ),
        # A dtype's overloads in OPS_GROUPS groups, every sample of an overload in its one group.
        ("backendconf::ops::aten.add.Tensor[float16]", f"ops:float16:{zlib.crc32(b'aten.add.Tensor') % OPS_GROUPS}"),
        ("backendconf::ops::aten.add.Tensor[float16-sample1]", f"ops:float16:{zlib.crc32(b'aten.add.Tensor') % 4}"),
        ("backendconf::ops::aten.add.Tensor[int64-sample0]", f"ops:int64:{zlib.crc32(b'aten.add.Tensor') % 4}"),
        ("backendconf::contract::is_available_is_a_stable_bool", None),
        ("backendconf::availability::host-compile_no-execute_no", None),
        ("tests/test_mine.py::test_it[small_cnn]", None),
    ],
)
def test_the_model_of_a_check_is_read_from_its_id(nodeid, model):
    assert model_of(nodeid) == model
    if model is not None:
        assert scope_of(nodeid) == f"backendconf::model::{model}"
    elif "::availability::" in nodeid:  # the rows share the target process's loads: one worker
        assert scope_of(nodeid) == "backendconf::availability"
    else:
        assert scope_of(nodeid) == nodeid


SELECTION = [
    "--backendconf-select=contract::*[[]mlp]",
    "--backendconf-select=contract::*[[]linear]",
    "--backendconf-select=contract::*[[]arithmetic_tensors]",
    "--backendconf-select=parity::mlp[[]float32]",
    "--backendconf-select=parity::linear[[]float32]",
    "--backendconf-select=parity::arithmetic_tensors[[]float32]",
    f"--backendconf-select={AVAILABLE}",
    "--backendconf-select=delegation::linear[[]float32]",  # lowered whole: not needed
]


def run(pytester, *args):
    # In-process: the pytest run itself cannot crash (the workers are processes of their own), and
    # a pytest subprocess would cost a torch import per run.
    return pytester.runpytest(
        "--backend=no_mul_wrong_dtype",
        "--backendconf-hypothesis=ci",
        "-p",
        "no:cacheprovider",
        "-v",
        "-rs",
        "--backendconf-known-failures=known.toml",
        *SELECTION,
        *args,
    )


# One distributed run (two workers, each a fresh pytest process with a torch import) serves
# everything xdist changes: the outcomes, the workers' grouping, and the report, summary, JUnit
# file and seed, which the controller builds from what the workers send.
@pytest.mark.slow
def test_under_xdist_the_outcomes_report_summary_junit_and_seed_are_a_serial_runs_with_each_model_on_one_worker(
    pytester,
):
    pytester.makeconftest(CONFTEST)
    write(pytester.path / "known.toml", f'"{LINEAR}" = {{ reason = "float64 outputs" }}\n')
    serial = run(pytester, "--backendconf-report=serial.json")
    distributed = run(
        pytester, "--tx", "2*popen", "--dist", "load", "--backendconf-report=tx.json", "--junitxml=junit.xml"
    )
    assert serial.ret == distributed.ret == 1, serial.stdout.str() + distributed.stdout.str()
    one, two = (json.loads((pytester.path / name).read_text()) for name in ("serial.json", "tx.json"))
    outcomes = lambda report: {t["id"]: (t["outcome"], (t["error"] or {}).get("type")) for t in report["tests"]}  # noqa: E731
    assert outcomes(one) == outcomes(two)
    assert len(outcomes(one)) == 20
    # The check's own verdict (`CheckOutcome`) reaches the controller on each worker's test report.
    verdicts = lambda report: {t["id"]: t["check_outcome"] for t in report["tests"]}  # noqa: E731
    assert verdicts(one) == verdicts(two)
    assert {o for o, _ in outcomes(one).values()} >= {"passed", "failed", "unsupported", "known_failure"}
    assert one["summary"] == two["summary"] and one["errors"] == two["errors"]
    assert two["run"]["xdist_workers"] == 2 and one["run"]["xdist_workers"] == 0

    # "[gw0] [ 5%] PASSED backendconf::contract::…[mlp]": every model's checks on one worker, both workers busy.
    workers: dict[str, set[str]] = {}
    for worker, nodeid in re.findall(
        r"\[(gw\d+)\][^\n]*?(?:PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR) (backendconf::\S+)", distributed.stdout.str()
    ):
        workers.setdefault(model_of(nodeid) or nodeid, set()).add(worker)
    assert {m for m in workers if not m.startswith("backendconf::")} == {"mlp", "linear", "arithmetic_tensors"}
    assert all(len(found) == 1 for found in workers.values()), workers
    assert len(set().union(*workers.values())) == 2

    # The summary and the report: built by the controller from the workers' results.
    counts = {"passed": 0, "failed": 0, "unsupported": 0, "known_failure": 0, "skipped": 0}
    for outcome, _ in outcomes(two).values():
        counts[outcome] += 1
    distributed.assert_outcomes(
        passed=counts["passed"],
        xfailed=counts["known_failure"],
        skipped=counts["unsupported"] + counts["skipped"],
        failed=counts["failed"],
    )
    assert verdicts(two)["backendconf::delegation::linear[float32]"] == "not_needed"
    assert two["summary"]["delegation"]["not_needed"] == 1 and two["summary"]["delegation"]["scored"] == 0
    expect(
        distributed.stdout,
        ["parity         0/3 passed (0.0%); 1 unsupported, 1 known failure, 1 failed — score = passed / all 3"],
    )
    parity = [(t["id"], t["outcome"]) for t in two["tests"] if t["id"] in (AVAILABLE, ARITHMETIC, LINEAR, MLP)]
    assert parity == [(AVAILABLE, "passed"), (ARITHMETIC, "unsupported"), (LINEAR, "known_failure"), (MLP, "failed")]
    # A known failure is the report's word; the check itself failed.
    assert [verdicts(two)[i] for i in (AVAILABLE, ARITHMETIC, LINEAR, MLP)] == [
        "passed",
        "unsupported",
        "failed",
        "failed",
    ]
    mlp = next(t for t in two["tests"] if t["id"] == MLP)
    assert mlp["error"]["type"] == "OutputSpecError"
    assert two["summary"]["parity"]["score"] == 0.0
    contract = two["summary"]["contract"]
    # is_available, and mlp's and linear's checks but their float64 outputs; arithmetic's need aten.mul.
    assert (contract["passed"], contract["failed"], contract["unsupported"]) == (9, 2, 5)
    assert contract["score"] == 9 / 16
    # The header's seed is the workers' seed.
    seed = two["hypothesis"]["seed"]
    expect(distributed.stdout, [f"backendconf: hypothesis profile 'ci', seed {seed} *"])

    cases = {
        f"{case.get('classname')}.{case.get('name')}": case
        for case in ET.parse(pytester.path / "junit.xml").iter("testcase")
    }
    dropout = cases["backendconf.parity.mlp[float32]"]
    properties = {p.get("name"): p.get("value") for p in dropout.iter("property")}
    assert properties == {
        "category": "parity",
        "stage": "execute",
        "case": "mlp",
        "reproduce": f"pytest --backend=no_mul_wrong_dtype '--backendconf-select={MLP}' --backendconf-hypothesis=ci",
    }
    linear = {p.get("name"): p.get("value") for p in cases["backendconf.parity.linear[float32]"].iter("property")}
    assert linear["known_failure"] == LINEAR
    failure = dropout.find("failure")
    assert failure is not None
    assert failure.text.rstrip().endswith(f"reproduce: {properties['reproduce']}")
    # An unsupported check's skip text points at the check's code, never "<id>:None:".
    skipped = cases["backendconf.parity.arithmetic_tensors[float32]"].find("skipped")
    assert skipped is not None and ":None:" not in skipped.text
    assert re.match(r"pytest_backendconf/conformance/parity\.py:\d+: unsupported: ", skipped.text), skipped.text
    # The terminal still names the check by its id.
    expect(distributed.stdout, [f"SKIPPED [1] {ARITHMETIC}: unsupported: *"])
