"""pytest-xdist: the checks of one model go to one worker, and a distributed run gives a serial run's outcomes.

The speed of `-n 2` against a serial run is measured by
benchmarks/bench_xdist.py, never asserted here.
"""

from __future__ import annotations

import json
import re

import pytest

from pytest_backendconf._xdist import model_of, scope_of

from test_gating import AVAILABLE, CONFTEST

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
        ("backendconf::ops::aten.add.Tensor[float16]", "aten.add.Tensor"),
        ("backendconf::ops::aten.add.Tensor[float16-sample1]", "aten.add.Tensor"),
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
        *SELECTION,
        *args,
    )


def test_a_tx_popen_run_gives_the_serial_outcomes_with_each_model_on_one_worker(pytester):
    pytester.makeconftest(CONFTEST)
    serial = run(pytester, "--backendconf-report=serial.json")
    distributed = run(pytester, "--tx", "2*popen", "--dist", "load", "--backendconf-report=tx.json")
    assert serial.ret == distributed.ret == 1, serial.stdout.str() + distributed.stdout.str()
    one, two = (json.loads((pytester.path / name).read_text()) for name in ("serial.json", "tx.json"))
    outcomes = lambda report: {t["id"]: (t["outcome"], (t["error"] or {}).get("type")) for t in report["tests"]}  # noqa: E731
    assert outcomes(one) == outcomes(two)
    assert len(outcomes(one)) == 19 and {o for o, _ in outcomes(one).values()} >= {"passed", "failed", "unsupported"}
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
