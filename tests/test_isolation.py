"""A backend that crashes, hangs or leaks fails the checks it was in; the run goes on and reports.

Each run is a real pytest run against a backend of ``broken_backends_isolation.py``, on a few
checks to stay cheap. The backend that ends its process runs in a pytest subprocess, so that a
regression of the isolation could not take this session down; the others run in this process,
which saves a pytest start and a torch import per run: a regressed isolation would hang a pytest
subprocess as surely as this one (neither has a timeout), and a leak kept here is a few MB.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_backendconf.target import _child

TESTS_DIR = Path(__file__).parent
ROOT = TESTS_DIR.parent


@pytest.fixture(autouse=True)
def in_the_host(monkeypatch):
    """These runs test the backend host: undo the project's in-process default (tests/conftest.py)."""
    monkeypatch.delenv("BACKENDCONF_IN_PROCESS", raising=False)


CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
from {module} import {cls}

def backendconf_register_backends(register):
    register({cls}())
"""


def run(pytester, module: str, cls: str, name: str, select: list[str], *more: str, subprocess: bool = True):
    pytester.makeconftest(CONFTEST.format(tests=str(TESTS_DIR), module=module, cls=cls))
    result = (pytester.runpytest_subprocess if subprocess else pytester.runpytest)(
        f"--backend={name}",
        "-p",
        "no:cacheprovider",
        "--backendconf-hypothesis=ci",
        "-rfs",
        "--backendconf-report=report.json",
        "--junitxml=junit.xml",
        *(f"--backendconf-select={s}" for s in select),
        *more,
    )
    report = json.loads((pytester.path / "report.json").read_text())
    assert (pytester.path / "junit.xml").exists()
    result.stdout.fnmatch_lines([f"*backendconf: conformance of backend '{name}'*"])
    return result, {t["id"]: t["outcome"] for t in report["tests"]}


@pytest.mark.slow
def test_a_backend_that_exits_on_its_third_execute_fails_those_checks_and_the_run_goes_on(pytester):
    result, outcomes = run(
        pytester,
        "broken_backends_isolation",
        "ExitsOnThirdExecute",
        "exits_on_third_execute",
        [
            "backendconf::contract::*[[]small_cnn]",
            "backendconf::parity::small_cnn[float32]",
            "backendconf::parity::nested_nml[float32]",
        ],
    )
    # Parity calls execute six times: the host dies in each; the contract checks call it once.
    assert outcomes["backendconf::parity::small_cnn[float32]"] == "failed"
    assert outcomes["backendconf::parity::nested_nml[float32]"] == "failed"
    assert {k: v for k, v in outcomes.items() if "contract" in k} == {
        f"backendconf::contract::{c}[small_cnn]": "passed"
        for c in (
            "preprocess_returns_bytes",
            "preprocess_is_deterministic",
            "preprocess_leaves_the_program_alone",
            "compile_returns_a_handle_per_method",
            "execute_matches_the_output_spec",
            "execute_profiled_events",
        )
    }
    result.stdout.fnmatch_lines(
        [
            "the backend took down the process running parity::nested_nml[[]float32]: it exited with code 3 before "
            "answering — in the pytest process this would have ended the whole run.*",
            "Subject: model nested_nml, dtype float32; the last backend call was execute() of method 'forward', "
            "inputs [[]float32[[]4, 3]] (backend call * of this check).",
            "A fresh process runs the next checks.",
            "the backend took down the process running parity::small_cnn[[]float32]: it exited with code 3*",
            "Subject: model small_cnn, dtype float32; the last backend call was execute() of method 'forward', "
            "inputs [[]float32[[]2, 3, 8, 8]] (backend call * of this check).",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED backendconf::parity::small_cnn[[]float32] - the backend took down*"])


@pytest.mark.slow
def test_a_backend_that_hangs_in_execute_fails_that_check_after_the_timeout(pytester):
    result, outcomes = run(
        pytester,
        "broken_backends_isolation",
        "HangsInExecute",
        "hangs_in_execute",
        [
            "backendconf::contract::preprocess_returns_bytes[nested_nml]",
            "backendconf::parity::nested_nml[float32]",
            "backendconf::symbolication::unsupported_node_is_symbolicated[flat]",
        ],
        "--backendconf-timeout=10",
        subprocess=False,
    )
    assert outcomes == {
        "backendconf::contract::preprocess_returns_bytes[nested_nml]": "passed",
        "backendconf::parity::nested_nml[float32]": "failed",
        "backendconf::symbolication::unsupported_node_is_symbolicated[flat]": "passed",
    }
    result.stdout.fnmatch_lines(
        [
            "parity::nested_nml[[]float32] did not finish within 10 s (--backendconf-timeout); the process running it "
            "was killed.",
            "Subject: model nested_nml, dtype float32; the last backend call was execute() of method 'forward', "
            "inputs [[]float32[[]4, 3]] (backend call * of this check).",
            "its stderr ended with:",
            # faulthandler's dump, asked for before the kill, shows where it hung.
            '*File "*broken_backends_isolation.py", line * in execute',
        ]
    )


@pytest.mark.slow
def test_a_model_that_hung_is_not_waited_for_again(pytester):
    # HangsOnTanh hangs in execute() of any graph with aten.tanh. The contract check that executes
    # smooth_activations hangs first; parity of the same model in the same dtype then fails at once,
    # naming it. The preprocess-only check of that model runs (it never executes), and so does the
    # operator's sample (another lowered model, which hangs too).
    select = [
        "backendconf::contract::preprocess_returns_bytes[[]smooth_activations]",
        "backendconf::contract::execute_matches_the_output_spec[[]smooth_activations]",
        "backendconf::parity::smooth_activations[[]float32]",
        "backendconf::ops::aten.tanh.default[[]float32-sample0]",
    ]
    result, outcomes = run(
        pytester,
        "broken_backends_isolation",
        "HangsOnTanh",
        "hangs_on_tanh",
        select,
        "--backendconf-timeout=10",
        subprocess=False,
    )
    assert outcomes == {
        "backendconf::contract::preprocess_returns_bytes[smooth_activations]": "passed",
        "backendconf::contract::execute_matches_the_output_spec[smooth_activations]": "failed",
        "backendconf::parity::smooth_activations[float32]": "failed",
        "backendconf::ops::aten.tanh.default[float32-sample0]": "failed",
    }, outcomes
    result.stdout.fnmatch_lines(
        [
            "not run: the lowered model smooth_activations in float32 did not finish within 10 s "
            "(--backendconf-timeout) in contract::execute_matches_the_output_spec[[]smooth_activations], during "
            "execute() of method 'forward', inputs [[]float32[[]4, 6]]; this check would run that model again, so "
            "it fails at once instead of waiting for it.*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "backendconf: 1 check failed at once, not run again on a lowered model that hung (or crashed the "
            "same way twice) in an earlier check*",
        ]
    )
    report = json.loads((pytester.path / "report.json").read_text())
    types = {t["id"]: (t["error"] or {}).get("type") for t in report["tests"] if t["outcome"] == "failed"}
    assert sorted(types.values()) == ["BackendHostDied", "BackendHostDied", "BackendHostModelHung"]


def test_a_lowered_model_is_a_case_in_one_dtype_or_an_operator_in_one_dtype():
    from pytest_backendconf.suite._host import model_key

    assert model_key("parity", "small_cnn[float16]", "small_cnn", "float16") == ("model", "small_cnn", "float16")
    # The samples of one operator in one dtype differ in shapes only: one lowered model.
    assert model_key("ops", "aten.add.Tensor[float16-sample1]", None, None) == (
        "operator",
        "aten.add.Tensor",
        "float16",
    )
    assert model_key("ops", "aten.add.Tensor[float16-sample0]", None, None) == (
        "operator",
        "aten.add.Tensor",
        "float16",
    )
    # A check of the backend as a whole runs no one model: its hang says nothing about the others.
    assert model_key("availability", "host-compile_no-execute_no", None, None) is None


@pytest.mark.slow
def test_a_backend_that_leaks_8mb_per_call_fails_the_checks_that_cross_the_memory_limit(pytester):
    result, outcomes = run(
        pytester,
        "broken_backends_isolation",
        "Leaks8MBPerCall",
        "leaks_8mb_per_call",
        ["backendconf::parity::small_cnn[float32]", "backendconf::reliability::memory_stays_flat*"],
        "--backendconf-max-rss=900",
        subprocess=False,
    )
    assert outcomes == {
        "backendconf::parity::small_cnn[float32]": "passed",
        "backendconf::reliability::memory_stays_flat[small_cnn]": "failed",
        "backendconf::reliability::memory_stays_flat[nested_nml]": "failed",
    }
    result.stdout.fnmatch_lines(
        [
            "the process running reliability::memory_stays_flat[[]small_cnn] was killed: its memory grew past "
            "--backendconf-max-rss (* MiB > 900 MiB) (from * MiB at the start of this check).",
            "Subject: model small_cnn, dtype float32; the last backend call was execute() of method 'forward'*",
        ]
    )
    # The second one ran in a fresh process, and crossed the limit there again.
    result.stdout.fnmatch_lines(["*memory_stays_flat[[]nested_nml] was killed: its memory grew past*"])


@pytest.mark.slow
def test_an_unavailable_backend_runs_the_rows_and_lowering_checks_and_marks_the_rest_not_applicable(pytester):
    select = [
        "backendconf::availability::*",
        "backendconf::contract::*[[]small_cnn]",
        "backendconf::parity::small_cnn*",
        "backendconf::serialization::*[[]small_cnn]",
        "backendconf::symbolication::unsupported_node_is_symbolicated*",
    ]
    # An unavailable backend cannot take the process down: this pytest run is in-process.
    result, outcomes = run(pytester, "broken_backends", "Unavailable", "unavailable", select, subprocess=False)
    ran = {k for k, v in outcomes.items() if v != "skipped"}
    assert ran == {
        "backendconf::availability::host-compile_no-execute_no",
        "backendconf::availability::host-compile_no-execute_yes",
        "backendconf::availability::host-compile_yes-execute_no",
        "backendconf::availability::target-compile_no-execute_no",
        "backendconf::availability::target-compile_yes-execute_no",
        "backendconf::contract::preprocess_returns_bytes[small_cnn]",
        "backendconf::contract::preprocess_is_deterministic[small_cnn]",
        "backendconf::contract::preprocess_leaves_the_program_alone[small_cnn]",
        "backendconf::serialization::deterministic_lowering[small_cnn]",
        "backendconf::symbolication::unsupported_node_is_symbolicated[flat]",
        "backendconf::symbolication::unsupported_node_is_symbolicated[nested]",
        "backendconf::symbolication::unsupported_node_is_symbolicated[cond_branch]",
    }, outcomes
    assert all(outcomes[k] == "passed" for k in ran), outcomes
    skipped = len(outcomes) - len(ran)
    # One line for all of them, with the one reason.
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED [[]{skipped}] backendconf: not applicable: backend 'unavailable' is not available here (no "
            "device in this test); the availability rows and the lowering-side checks ran, the rest need "
            "is_available() True",
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_a_host_that_cannot_start_fails_every_check_once_with_the_reason(pytester, monkeypatch):
    # Both pytest runs are in-process (nothing here can crash): the conftest marks the process it
    # was imported in, so the host child, which inherits the mark, fails to import it. Each run
    # starts unmarked, as a fresh pytest process would; monkeypatch removes the mark afterwards.
    monkeypatch.setenv("BACKENDCONF_TEST_IN_HOST", "0")
    pytester.makeconftest(
        "import os\n"
        "from backendconf_reference import ReferenceBackend\n"
        "if os.environ.get('BACKENDCONF_TEST_IN_HOST') == '1':\n"
        "    raise RuntimeError('this conftest cannot be imported twice')\n"
        "os.environ['BACKENDCONF_TEST_IN_HOST'] = '1'\n"
        "class Mine(ReferenceBackend):\n"
        "    name = 'mine'\n"
        "def backendconf_register_backends(register):\n"
        "    register(Mine())\n"
    )
    result = pytester.runpytest(
        "--backend=mine",
        "-p",
        "no:cacheprovider",
        "--backendconf-select=backendconf::contract::*[[]small_cnn]",
    )
    result.assert_outcomes(failed=6)  # small_cnn's five contract checks and its execute_profiled one
    result.stdout.fnmatch_lines(
        [
            "the suite could not be set up in its child process (the backend host): PluginLoadError: plugin "
            "'*conftest.py' failed to import in a child process: RuntimeError: this conftest cannot be imported twice*",
            "*--backendconf-in-process runs them in the pytest process instead.",
        ]
    )
    # In the pytest process, the same checks pass.
    monkeypatch.setenv("BACKENDCONF_TEST_IN_HOST", "0")
    again = pytester.runpytest(
        "--backend=mine",
        "-p",
        "no:cacheprovider",
        "--backendconf-select=backendconf::contract::*[[]small_cnn]",
        "--backendconf-in-process",
    )
    again.assert_outcomes(passed=6)


@pytest.mark.slow
def test_child_process_reports_exit_status_and_timeout():
    child = _child.ChildProcess("pytest_backendconf.target._child:Echo", plugins=[])
    assert child.request({"say": "hello"}, timeout=60) == {"kind": "result", "said": "hello"}
    ended = child.request({"exit": 7}, timeout=60)
    assert isinstance(ended, _child.Ended) and ended.returncode == 7
    assert ended.describe() == "exited with code 7 before answering"
    child = _child.ChildProcess("pytest_backendconf.target._child:Echo", plugins=[])
    ended = child.request({"sleep": 60}, timeout=0.5)
    assert isinstance(ended, _child.Ended) and ended.timed_out == 0.5
    assert ended.describe() == "did not answer within 0.5 s and was killed"


@pytest.mark.slow
def test_a_child_runs_torch_on_its_parents_thread_count(monkeypatch):
    # A kernel's float sums depend on how many threads split them: a child on
    # torch's default count (OMP_NUM_THREADS says otherwise here) would differ
    # from its parent in the last bits.
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        for threads in (3, 1):
            torch.set_num_threads(threads)
            child = _child.ChildProcess("pytest_backendconf.target._child:Echo", plugins=[])
            try:
                assert child.request({"threads": True}, timeout=120) == {"kind": "result", "threads": threads}
            finally:
                child.close()
    finally:
        torch.set_num_threads(before)


def test_child_handlers_must_live_in_the_package():
    with pytest.raises(ValueError, match="a child handler must live in pytest_backendconf"):
        _child.ChildProcess("os:system")


def test_no_pickle_in_the_package():
    """Child processes and archives exchange JSON and raw tensor bytes only; nothing is unpickled."""
    pattern = re.compile(
        r"\b(import\s+(c?pickle|dill|cloudpickle|marshal|shelve)|from\s+(c?pickle|dill|cloudpickle|"
        r"marshal|shelve)\s+import|pickle\.|multiprocessing|torch\.load\()"
    )
    found = []
    for folder in ("pytest_backendconf", "conformance", "backends"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_a_crash_blocks_a_model_only_when_it_repeats_the_same_way():
    from pytest_backendconf.suite._host import NOT_RUN_AGAIN, ModelMemory

    execute = [{"kind": "call", "call": "execute", "detail": "of method 'forward', inputs [float32[2, 3]]"}]
    model = ("model", "small_cnn", "float32")
    memory = ModelMemory()
    # One crash may be a flaky driver: the next check on the model runs.
    memory.ended(model, "parity::small_cnn[float32]", _child.Ended(returncode=-11, stderr=""), execute)
    assert memory.blocked(model, runs_backend=True) is None
    # Another way of ending (another exit status) is not the same crash.
    memory.ended(model, "contract::execute_profiled_events[small_cnn]", _child.Ended(returncode=3, stderr=""), execute)
    assert memory.blocked(model, runs_backend=True) is None
    # The same signal in the same backend call a second time: deterministic.
    memory.ended(model, "reliability::memory_stays_flat[small_cnn]", _child.Ended(returncode=-11, stderr=""), execute)
    failure = memory.blocked(model, runs_backend=True)
    assert failure is not None and failure.error is not None and failure.error["type"] == NOT_RUN_AGAIN
    assert "took down its process the same way twice (it was killed by signal 11 (SIGSEGV); also in " in failure.message
    # It crashed in execute: a check that only lowers the model still runs; another model runs.
    assert memory.blocked(model, runs_backend=False) is None
    assert memory.blocked(("model", "small_cnn", "float16"), runs_backend=True) is None
    assert memory.saved == 1
    # A host that ended with no backend call running says nothing about the model.
    memory.ended(
        ("model", "mlp", "float32"), "parity::mlp[float32]", _child.Ended(returncode=None, stderr="", timed_out=5.0), []
    )
    assert memory.blocked(("model", "mlp", "float32"), runs_backend=True) is None


def test_a_hang_in_one_pytest_process_is_known_to_the_others_of_the_run(tmp_path):
    # pytest-xdist workers each keep a ModelMemory; they share the hangs through a folder of the run,
    # so the run pays the full timeout once, not once per worker.
    from pytest_backendconf.suite._host import NOT_RUN_AGAIN, ModelMemory

    shared = tmp_path / "hangs"
    one, other = ModelMemory(shared), ModelMemory(shared)
    assert not other.hung
    execute = [{"kind": "call", "call": "execute", "detail": "of method 'forward'"}]
    model = ("operator", "aten.tanh.default", "float32")
    one.ended(
        model, "ops::aten.tanh.default[float32]", _child.Ended(returncode=None, stderr="", timed_out=120.0), execute
    )
    assert other.hung  # the other worker's next check gets the shorter timeout
    failure = other.blocked(model, runs_backend=True)
    assert failure is not None and failure.error is not None and failure.error["type"] == NOT_RUN_AGAIN
    assert "in ops::aten.tanh.default[float32], during execute() of method 'forward'" in failure.message
    assert other.blocked(("operator", "aten.sin.default", "float32"), runs_backend=True) is None
    # A damaged or foreign file in the folder is ignored, never trusted.
    (shared / "junk.json").write_text('{"model": 3}')
    (shared / "half.json").write_text('{"model": ["x"')
    third = ModelMemory(shared)
    assert third.hung and third.blocked(model, runs_backend=True) is not None
    # Without a shared folder a process knows only its own hangs.
    assert not ModelMemory().hung


def test_after_a_hang_each_later_check_gets_a_shorter_timeout():
    # A backend that hangs on one operator hangs on every model that holds it: after the first hang,
    # each later check may take three times the slowest check that finished, at least 10 s, so the
    # other hanging models cost seconds each instead of the whole --backendconf-timeout.
    from pytest_backendconf.suite import SuiteOptions
    from pytest_backendconf.suite._host import AFTER_HANG_FLOOR, BackendHost

    host = BackendHost(SuiteOptions("reference"), timeout=120.0, max_rss=None)
    assert host.check_timeout() == 120.0
    host.slowest = 2.0
    assert host.check_timeout() == 120.0  # no hang yet: the full timeout
    host.models.hung = True
    assert host.check_timeout() == AFTER_HANG_FLOOR == 10.0
    host.slowest = 30.0
    assert host.check_timeout() == 90.0
    host.slowest = 100.0
    assert host.check_timeout() == 120.0  # never longer than the timeout given
    assert BackendHost(SuiteOptions("reference"), timeout=None, max_rss=None).check_timeout() is None
