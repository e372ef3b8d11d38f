"""The reliability checks: the reference backend passes them, each broken backend fails exactly its own.

The crashing backend runs in a pytest subprocess: if the suite's own isolation
ever regressed, it would take this session down with it. The hanging one runs in
this process: a regression would hang a pytest subprocess as surely (it has no
timeout either), and the run costs no pytest start and torch import.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

import broken_backends
from pytest_backendconf.conformance._spec import section
from pytest_backendconf.conformance.reliability import TIMEOUT_ENV

TESTS_DIR = Path(__file__).parent
SPEC = section("reliability")
CASES, MEMORY_CASES = SPEC["cases"], SPEC["memory_cases"]
ALL = 2 + 3 * len(CASES) + len(MEMORY_CASES)
# Everything but the child-process probes: a run that selects only these starts no child.
IN_PROCESS = [
    "backendconf::reliability::execute_leaves_inputs_alone*",
    "backendconf::reliability::execute_is_*",
    "backendconf::reliability::memory_stays_flat*",
]

CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
from broken_backends import {cls}

def backendconf_register_backends(register):
    register({cls}())
"""


def run_suite(pytester, cls: str | None, select: list[str], *, subprocess: bool = False):
    name = "reference"
    if cls is not None:
        pytester.makeconftest(CONFTEST.format(tests=str(TESTS_DIR), cls=cls))
        name = getattr(broken_backends, cls).name
    run = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    return run(f"--backend={name}", "-p", "no:cacheprovider", "-rfs", *(f"--backendconf-select={s}" for s in select))


def failed_ids(result) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^FAILED (backendconf::\S+?)(?: - .*)?$", result.stdout.str(), re.M)}


def assert_failed_exactly(result, pattern: str, count: int) -> None:
    failed = failed_ids(result)
    assert len(failed) == count and all(fnmatch.fnmatchcase(f, pattern) for f in failed), failed


@pytest.mark.slow
def test_the_reference_backend_passes_every_reliability_check(pytester):
    result = run_suite(pytester, None, ["backendconf::reliability::*"])
    result.assert_outcomes(passed=ALL)


@pytest.mark.slow
def test_a_crash_fails_its_check_and_skips_the_in_process_checks(pytester):
    result = run_suite(pytester, "CrashesOnExecute", ["backendconf::reliability::*"], subprocess=True)
    result.assert_outcomes(failed=1, skipped=ALL - 1)
    assert failed_ids(result) == {"backendconf::reliability::execute_does_not_crash_the_process"}
    result.stdout.fnmatch_lines(
        [
            f"execute() (call 1 of 3) of {CASES[0]}.forward * crashed the process (exit code 139). It ran "
            "in a child process; in the pytest process it would have ended the whole session.*",
        ]
    )
    result.stdout.fnmatch_lines(["SKIPPED * not run in-process: *crashed in the child process"])


@pytest.mark.slow
def test_a_hang_fails_its_check_within_the_timeout(pytester, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "2")
    result = run_suite(pytester, "HangsOnExecute", ["backendconf::reliability::*"])
    result.assert_outcomes(failed=1, skipped=ALL - 1)
    assert failed_ids(result) == {"backendconf::reliability::execute_returns_in_time"}
    result.stdout.fnmatch_lines(
        [
            f"execute() (call 1 of 3) of {CASES[0]}.forward * did not return within 2 s; the child process "
            "running it was killed*",
            "the child's stderr ended with:",
            # faulthandler's dump shows where it hung.
            '*File "*broken_backends.py", line * in execute',
        ]
    )


@pytest.mark.parametrize(
    ("cls", "failing", "count", "line"),
    [
        pytest.param(
            "MutatesInputs",
            "backendconf::reliability::execute_leaves_inputs_alone*",
            len(CASES),
            f"execute() changed input 0 of {CASES[0]}.forward * in place (max difference 1); inputs "
            "belong to the caller*",
            id="mutates-inputs",
        ),
        pytest.param(
            "Nondeterministic",
            "backendconf::reliability::execute_is_deterministic*",
            len(CASES),
            f"{CASES[0]}.forward *: the same inputs gave different outputs right after (max difference *); "
            "execute() must be deterministic, bit for bit",
            id="nondeterministic",
        ),
        pytest.param(
            "NotThreadSafe",
            "backendconf::reliability::execute_is_thread_safe*",
            len(CASES),
            f"calling {CASES[0]}.forward * from {SPEC['threads']} threads at once ({SPEC['calls_per_thread']} "
            "calls each): * of * calls gave outputs different from the same call alone*",
            id="not-thread-safe",
        ),
        pytest.param(
            "LeaksMemory",
            "backendconf::reliability::memory_stays_flat*",
            len(MEMORY_CASES),
            f"{MEMORY_CASES[0]} * keeps memory it does not free: RSS grew by * MiB, then * MiB, then * MiB "
            f"over successive windows of {SPEC['memory_window_calls']} calls of forward after a warm-up, "
            "about * KiB per call*",
            id="leaks-memory",
        ),
    ],
)
def test_a_defect_fails_exactly_its_checks(pytester, cls, failing, count, line):
    result = run_suite(pytester, cls, IN_PROCESS)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == count, outcomes
    # A nondeterministic backend cannot be judged for thread safety: those skip, saying why.
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == ALL - 2 - count, outcomes
    assert_failed_exactly(result, failing, count)
    result.stdout.fnmatch_lines([line])


def test_a_backend_that_does_not_declare_thread_safe_is_not_called_from_threads(pytester):
    pytester.makeconftest(
        "import dataclasses\n"
        "from backendconf_reference import ReferenceBackend\n"
        "class OneThread(ReferenceBackend):\n"
        "    name = 'one_thread'\n"
        "    capabilities = dataclasses.replace(ReferenceBackend.capabilities, thread_safe=False)\n"
        "def backendconf_register_backends(register):\n"
        "    register(OneThread())\n"
    )
    result = pytester.runpytest(
        "--backend=one_thread",
        "-p",
        "no:cacheprovider",
        "-rs",
        "--backendconf-select=backendconf::reliability::execute_is_thread_safe*",
    )
    result.assert_outcomes(skipped=len(CASES))
    result.stdout.fnmatch_lines(["*backend 'one_thread' does not declare thread_safe"])
