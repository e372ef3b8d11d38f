"""The availability checks (docs/backend-contract.md#availability): the reference backend passes every row,
and each defect, in a backend or in the lowering itself, fails exactly the rows that catch it."""

from __future__ import annotations

import os
import textwrap

import pytest

from pytest_backendconf.conformance.availability import table

TESTS = os.path.dirname(os.path.abspath(__file__))
ROWS = [row["id"] for row in table()["row"]]
HOST_NO_NO, HOST_NO_YES, HOST_YES_NO, HOST_YES_YES = ROWS[:4]
TARGET_NO_NO, TARGET_NO_YES, TARGET_NOT_READY, TARGET_YES_NO, TARGET_YES_YES = ROWS[4:]


def run_rows(
    pytester, backend: str, conftest: str = "", select: str = "*", *more: str
) -> tuple[dict[str, str], pytest.RunResult]:
    """Run the availability rows matching ``select`` (and the checks ``more`` selects);
    return ({check name: outcome}, the run)."""
    pytester.syspathinsert(TESTS)
    if conftest:
        pytester.makeconftest(textwrap.dedent(conftest))
    patterns = [f"backendconf::availability::{select}", *more]
    result = pytester.runpytest(
        f"--backend={backend}", "-p", "no:cacheprovider", *[f"--backendconf-select={p}" for p in patterns]
    )
    reports = result.reprec.getreports("pytest_runtest_logreport")
    outcomes = {}
    for report in reports:
        name = report.nodeid.rsplit("::", 1)[-1]
        if report.when == "call" or report.outcome != "passed":
            outcomes[name] = report.outcome
    return outcomes, result


def registering(cls: str) -> str:
    return f"""
        from broken_backends_archive import {cls}

        def backendconf_register_backends(register):
            register({cls}())
    """


def failed(outcomes: dict[str, str]) -> set[str]:
    return {name for name, outcome in outcomes.items() if outcome == "failed"}


def test_the_table_has_the_eight_rows_of_the_design_in_order():
    assert [(r["where"], r["compile"], r["execute"]) for r in table()["row"] if r["blobs"] == "intact"] == [
        ("host", False, False),
        ("host", False, True),
        ("host", True, False),
        ("host", True, True),
        ("target", False, False),
        ("target", False, True),
        ("target", True, False),
        ("target", True, True),
    ]
    assert all(r["outcome"] and r["simulation"] for r in table()["row"])
    assert table()["texts"]["warning"] == (
        "Backend [{name}] is not available. Execution of this Module is still possible by saving and "
        "loading on a device where the backend is available."
    )


def test_the_reference_backend_passes_every_row(pytester):
    outcomes, result = run_rows(pytester, "reference")
    assert outcomes == {row: "passed" for row in ROWS}
    result.stdout.fnmatch_lines(["backendconf: 9 conformance checks for backend 'reference'"])


def test_a_backend_whose_compile_needs_the_host_compiler_fails_the_target_rows(pytester):
    outcomes, result = run_rows(pytester, "compiler_on_target", registering("CompilerNeededOnTarget"), "target-*")
    assert failed(outcomes) == {TARGET_NO_YES, TARGET_YES_YES}
    assert outcomes[TARGET_NOT_READY] == outcomes[TARGET_NO_NO] == outcomes[TARGET_YES_NO] == "passed"
    result.stdout.fnmatch_lines(
        [
            "*row target-compile_no-execute_yes, small_cnn (float32) on the target: the archive did not load with "
            "backendconf_reference.compiler, torch._dynamo, torch.export._trace blocked: BackendContractError: *"
            "compile() failed at load: ImportError: blocked on the target: backendconf_reference.compiler is host-only*",
            "reproduce: pytest --backend=compiler_on_target "
            "--backendconf-select=backendconf::availability::target-compile_no-execute_yes*",
        ]
    )


def test_a_backend_that_says_available_but_cannot_compile_fails_the_honesty_row(pytester):
    outcomes, result = run_rows(pytester, "lies_about_availability", registering("LiesAboutAvailability"))
    assert failed(outcomes) == {HOST_YES_YES, TARGET_NO_YES, TARGET_YES_YES}
    result.stdout.fnmatch_lines(
        [
            "*row host-compile_yes-execute_yes, small_cnn (float32): is_available() returned True on this host, "
            "but lowering raised BackendContractError: *compile() failed at lowering: RuntimeError: no NPU device "
            "found*",
        ]
    )


def test_a_preprocess_that_needs_the_device_fails_the_unavailable_host_rows(pytester):
    outcomes, result = run_rows(pytester, "preprocess_needs_device", registering("PreprocessNeedsDevice"), "host-*")
    assert failed(outcomes) == {HOST_NO_NO, HOST_YES_NO}
    assert outcomes[HOST_NO_YES] == outcomes[HOST_YES_YES] == "passed"
    result.stdout.fnmatch_lines(
        [
            "*row host-compile_no-execute_no, small_cnn (float32): with is_available() False, lowering must succeed "
            "with a BackendUnavailableWarning; it raised LoweringError: preprocess() of backend "
            "'preprocess_needs_device' failed for method 'forward': RuntimeError: cannot preprocess: no NPU device*",
        ]
    )


@pytest.mark.slow
def test_a_backend_that_crashes_on_a_blob_that_is_not_ready_fails_that_row_only(pytester):
    # The crash also takes down the extra process's later work (here the
    # serialization category's fresh lowering, which parity's lowering of
    # small_cnn brought into the same process): that is retried elsewhere.
    outcomes, result = run_rows(
        pytester,
        "crashes_on_bad_blob",
        registering("CrashesOnBadBlob"),
        "target-*",
        "backendconf::parity::small_cnn[[]float32]",
        "backendconf::serialization::deterministic_lowering[[]small_cnn]",
    )
    assert failed(outcomes) == {TARGET_NOT_READY}
    assert outcomes["deterministic_lowering[small_cnn]"] == "passed"
    result.stdout.fnmatch_lines(
        [
            "*row target-compile_no-execute_yes-blob_not_ready, small_cnn (float32) on the target: loading blobs cut "
            "to half their length must fail with a clear error, never a crash or a hang: TargetCrashError: the "
            "process exited with code -6 while on availability:target-compile_no-execute_yes-blob_not_ready/*",
        ]
    )


# A lowering that breaks §3.4 itself: only these rows can catch it, in this process and on the target.
IGNORES_AVAILABILITY = """
    from pytest_backendconf.lowering import _lowered_module, _lowering

    _original = _lowering.availability
    # The defect: never asks the backend, at lowering (_lowering) or at load and call (_lowered_module).
    _lowering.availability = _lowered_module.availability = lambda backend: True

    def backendconf_register_backends(register):
        pass  # a backendconf plugin, so that the suite's extra process imports this file too

    def pytest_unconfigure(config):
        _lowering.availability = _lowered_module.availability = _original
"""

SWALLOWS_VIOLATIONS = """
    from pytest_backendconf.lowering import _lowered_module
    from pytest_backendconf.errors import BackendContractError

    _original = _lowered_module.LoweredModule.compile_now

    def compile_now(self, *, at="load"):
        try:
            _original(self, at=at)
        except BackendContractError:
            self.handles = {}  # the defect: a violation goes unreported

    _lowered_module.LoweredModule.compile_now = compile_now

    def backendconf_register_backends(register):
        pass

    def pytest_unconfigure(config):
        _lowered_module.LoweredModule.compile_now = _original
"""


def test_a_lowering_that_compiles_while_unavailable_fails_the_unavailable_rows(pytester):
    outcomes, result = run_rows(pytester, "reference", IGNORES_AVAILABILITY)
    assert failed(outcomes) == {HOST_NO_NO, HOST_YES_NO, TARGET_NO_NO}
    result.stdout.fnmatch_lines(
        [
            "*row host-compile_no-execute_no, small_cnn (float32), lowering: compile() was called 1 time(s) although "
            "is_available() returned False; docs/backend-contract.md#availability forbids calling them then",
            "*row host-compile_yes-execute_no, small_cnn (float32): lowering did not warn 'Backend [[]reference] is "
            "not available. *'; warnings seen: none",
            "*row target-compile_no-execute_no, small_cnn (float32) on the target: load must raise "
            "BackendUnavailableError starting 'Backend is not available.'; it raised BackendContractError: *simulated*",
        ]
    )


def test_a_lowering_that_swallows_violations_fails_the_invalid_rows(pytester):
    outcomes, result = run_rows(pytester, "reference", SWALLOWS_VIOLATIONS)
    # A blob that is not ready is a compile() failure too: swallowed, it loads.
    assert failed(outcomes) == {HOST_NO_YES, TARGET_YES_NO, TARGET_NOT_READY}
    result.stdout.fnmatch_lines(
        [
            "*row host-compile_no-execute_yes, small_cnn (float32): is_available() returned True and compile() raised "
            "(1 call(s)), yet lowering returned a module: the contract violation was not reported",
            "*row target-compile_yes-execute_no, small_cnn (float32) on the target: is_available() returned True and "
            "compile() raised, yet the archive loaded: the contract violation was not reported",
        ]
    )


def test_row_ids_are_plain_words_a_shell_and_fnmatch_leave_alone():
    for row in ROWS:
        assert row.replace("-", "").replace("_", "").isalnum(), row


def test_a_backend_that_rejects_every_subject_skips_the_target_rows_naming_why(pytester):
    outcomes, result = run_rows(
        pytester,
        "rejects_all",
        """
        import pytest_backendconf as bc
        from backendconf_reference import ReferenceBackend

        class RejectsAll(ReferenceBackend):
            name = "rejects_all"

            def preprocess(self, program, compile_spec, debug_handles):
                node = next(n for n in program.graph.nodes if n.op == "call_function")
                raise bc.UnsupportedNodeError(node, "this backend runs nothing")

        def backendconf_register_backends(register):
            register(RejectsAll())
        """,
        "target-*",
    )
    assert set(outcomes.values()) == {"skipped"}
    reasons = {r.longrepr[2] for r in result.reprec.getreports("pytest_runtest_logreport") if r.skipped}
    # Every subject's rejection, joined (they are Unsupported exceptions, not strings).
    (reason,) = reasons
    assert reason.startswith(
        "Skipped: unsupported: The node of aten::conv2d is not supported in this compiler (this backend runs "
        "nothing) at "
    )
    assert "; The node of aten::linear is not supported in this compiler (this backend runs nothing) at " in reason
