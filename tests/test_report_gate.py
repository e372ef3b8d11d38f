"""``backendconf report gate``: an existing report judged as the gated run judges it, without running again.

The runs select four fast checks of a backend with two defects (see
tests/test_gating.py): one passes, two fail with a wrong output dtype, one is
unsupported. The gate's exit status and summary are compared with those of a
real run of the suite with the same known-failures file.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from pytest_backendconf.cli._main import main
from pytest_backendconf.report import ReportTest, gated_outcome

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from test_gating import AVAILABLE, ARITHMETIC, CONFTEST, LINEAR, MLP, select
from report_records import document_of

BACKEND = "no_mul_wrong_dtype"
CHECKS = select(AVAILABLE, LINEAR, ARITHMETIC, MLP)
TITLE = f"backendconf: conformance of backend {BACKEND!r}"


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)

    def run(*args: str):
        return pytester.runpytest(
            f"--backend={BACKEND}", "--backendconf-hypothesis=ci", "-p", "no:cacheprovider", *CHECKS, *args
        )

    return run


def gate(capsys, report: Path, *known: Path) -> tuple[int, list[str]]:
    """The gate's exit status and its lines (stdout)."""
    options = [f"--known-failures={k}" for k in known]
    capsys.readouterr()  # what an in-process pytest run printed before
    status = main(["report", "gate", str(report), *options])
    return status, capsys.readouterr().out.splitlines()


def summary_of_run(lines: list[str]) -> list[str]:
    """The lines a gated run prints under its conformance title, up to its notes and pytest's own summary."""
    start = next(i for i, line in enumerate(lines) if TITLE in line) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("backendconf: report", "=")))
    return lines[start:end]


def summary_of_gate(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if TITLE in line) + 1
    return lines[start:-1]  # the last line is the gate's verdict


def write_known(path: Path, *entries: str) -> Path:
    path.write_text("".join(f"{e}\n" for e in entries))
    return path


def test_a_report_test_keeps_its_verdict_beside_the_gated_outcome_and_older_reports_still_read():
    for verdict in ("passed", "failed", "error", "skipped", "unsupported"):
        for listed in (False, True):
            outcome = gated_outcome(verdict, listed)
            check = None if verdict == "error" else verdict
            test = ReportTest("backendconf::parity::a", "parity", outcome, verdict, check_outcome=check)
            assert ReportTest.from_json(test.to_json()) == test
            # A report of schema 1.7 has no verdict: the reader derives it, once, from the gated outcome.
            old = {k: v for k, v in test.to_json().items() if k != "verdict"}
            assert ReportTest.from_json(old).verdict == verdict, (verdict, listed)
    assert gated_outcome("failed", True) == "known_failure"
    assert gated_outcome("passed", True) == "unexpected_pass"
    assert gated_outcome("unsupported", True) == "unsupported"


def test_a_first_run_and_its_known_failures_gate_green_and_the_gate_decides_as_the_suite(suite, pytester, capsys):
    first = suite("--backendconf-report=first.json")
    assert first.ret == 1
    report = pytester.path / "first.json"

    # Without a file, the report is judged as the run recorded it: the run's status and summary.
    status, lines = gate(capsys, report)
    assert status == first.ret
    assert summary_of_gate(lines) == summary_of_run(first.stdout.lines)
    assert lines[-1] == "backendconf: gate failed (exit status 1): 2 failed, 1 unsupported, 1 passed"

    # The known failures written from the report make that same report green, with no run.
    known = pytester.path / "known.toml"
    assert main(["report", "known-failures", str(report), "-o", str(known)]) == 0
    assert set(tomllib.loads(known.read_text())) == {LINEAR, MLP}
    capsys.readouterr()
    status, lines = gate(capsys, report, known)
    assert status == 0
    assert lines[-1] == "backendconf: gate passed (exit status 0): 2 known failures, 1 unsupported, 1 passed"
    assert f"backendconf: known failures from {known} (2 entries)" in lines
    assert (
        "parity         0/3 passed (0.0%); 1 unsupported, 2 known failures, 0 failed — score = passed / all 3" in lines
    )

    # A run with that file decides the same, and prints the same summary.
    second = suite(f"--backendconf-known-failures={known}", "--backendconf-report=second.json")
    assert second.ret == status == 0
    assert summary_of_run(second.stdout.lines) == summary_of_gate(lines)
    # Its own report gates the same, as it is and with the file again.
    for files in ((), (known,)):
        again, again_lines = gate(capsys, pytester.path / "second.json", *files)
        assert again == 0 and summary_of_gate(again_lines) == summary_of_gate(lines)


def test_a_new_failure_and_an_unexpected_pass_fail_the_gate_as_they_fail_the_run(suite, pytester, capsys):
    first = suite("--backendconf-report=first.json")
    report = pytester.path / "first.json"
    # MLP is not listed (a new failure); AVAILABLE is listed but passes.
    known = write_known(
        pytester.path / "known.toml",
        f'"{LINEAR}" = {{ reason = "float64 outputs", link = "https://bugs.example/7" }}',
        f'"{AVAILABLE}" = {{ reason = "was flaky" }}',
    )
    status, lines = gate(capsys, report, known)
    assert status == 1
    assert lines[-1] == (
        "backendconf: gate failed (exit status 1): 1 failed, 1 unexpected pass, 1 known failure, 1 unsupported"
    )
    text = "\n".join(lines)
    assert (
        f"{AVAILABLE} passed, but it is listed as a known failure: entry {AVAILABLE!r} in {known} (reason: was "
        f"flaky). Backend {BACKEND!r} passes it now: remove the entry, or rewrite the file with "
        f"--backendconf-write-known-failures={known}." in text
    )
    assert f"FAILED {MLP}: pytest --backend={BACKEND} '--backendconf-select={MLP}'" in text
    assert f"UNEXPECTED PASS {AVAILABLE}: pytest --backend={BACKEND} --backendconf-select={AVAILABLE}" in text

    run = suite(f"--backendconf-known-failures={known}", "--backendconf-report=second.json")
    run.assert_outcomes(failed=2, xfailed=1, skipped=1)
    assert run.ret == status
    assert summary_of_run(run.stdout.lines) == summary_of_gate(lines)
    # The run's report, gated as it is, says the same; and the first report's verdict did not change.
    again, again_lines = gate(capsys, pytester.path / "second.json")
    assert again == 1 and summary_of_gate(again_lines) == summary_of_gate(lines)
    assert first.ret == 1


def test_a_machine_scoped_entry_is_judged_against_the_machine_of_the_report(suite, pytester, capsys):
    suite("--backendconf-report=report.json")
    report = pytester.path / "report.json"
    document = json.loads(report.read_text())
    here = platform.machine()
    assert document["environment"]["machine"] == here
    elsewhere = "riscv64" if here != "riscv64" else "s390x"
    document["environment"]["machine"] = elsewhere  # as if the report came from another machine's CI
    report.write_text(json.dumps(document))

    theirs = write_known(
        pytester.path / "theirs.toml",
        *(f'"{i}" = {{ reason = "half kernels", when = {{ machine = "{elsewhere}" }} }}' for i in (LINEAR, MLP)),
    )
    status, lines = gate(capsys, report, theirs)
    assert status == 0, lines
    assert lines[0].startswith(f"backendconf: gate of report {report}: backend {BACKEND!r}, machine {elsewhere}, ")

    ours = write_known(
        pytester.path / "ours.toml",
        *(f'"{i}" = {{ reason = "half kernels", when = {{ machine = "{here}" }} }}' for i in (LINEAR, MLP)),
    )
    status, lines = gate(capsys, report, ours)
    assert status == 1
    assert (
        f"backendconf: known failures from {ours} (0 entries; 2 scoped to other machines, not applied there: "
        "their checks must pass)" in lines
    )
    assert lines[-1] == "backendconf: gate failed (exit status 1): 2 failed, 1 unsupported, 1 passed"


def test_what_cannot_be_gated_says_why(tmp_path, capsys):
    assert main(["report", "gate", str(tmp_path / "nope.json")]) == 4
    assert f"cannot read report {str(tmp_path / 'nope.json')!r}" in capsys.readouterr().err

    report = tmp_path / "report.json"
    document = document_of([], "b", run={"exit_status": 2})
    report.write_text(json.dumps(document))
    assert main(["report", "gate", str(report)]) == 2
    assert "was interrupted (exit status 2): its report does not hold every check" in capsys.readouterr().out

    document["run"]["exit_status"] = 0
    report.write_text(json.dumps(document))
    assert main(["report", "gate", str(report)]) == 5  # pytest's "no tests collected"
    assert capsys.readouterr().out.splitlines()[-1] == (
        "backendconf: gate failed (exit status 5): no conformance tests"
    )

    document["tests"] = [
        {"id": "backendconf::parity::linear[float32]", "category": "parity", "outcome": "fine, honestly"}
    ]
    report.write_text(json.dumps(document))
    assert main(["report", "gate", str(report)]) == 4  # an outcome nobody wrote would pass as nothing
    assert 'tests[0].outcome (backendconf::parity::linear[float32]) is "fine, honestly", not one of passed' in (
        capsys.readouterr().err
    )

    document["tests"] = []
    report.write_text(json.dumps(document))
    known = write_known(tmp_path / "known.toml", '"parity::x" = "no table"')
    assert main(["report", "gate", str(report), f"--known-failures={known}"]) == 4
    assert "entry 'parity::x' is a str, not a table" in capsys.readouterr().err
