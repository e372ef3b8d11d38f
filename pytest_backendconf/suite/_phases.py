"""What a pytest report of a conformance item means for the suite: its outcome, reason and error.

The pytest side of the report (`report.TestResult` and the document know nothing of pytest): the
gating plugin turns each phase's `pytest.TestReport`, with the check's own `CheckOutcome` from the
item's stash, into the data a `TestResult` adds up.
"""

from __future__ import annotations

import pytest

from ..checks import CheckOutcome, reason_text

#: The report attribute that carries a conformance test's data (xdist serializes it).
REPORT_ATTR = "backendconf"
#: How many lines of an exception's message the report and the summary keep.
MESSAGE_LINES = 5


def phase_outcome(report: pytest.TestReport, listed: bool, check: CheckOutcome | None = None) -> str | None:
    """What one phase's report means for the suite; None for a setup or teardown that passed.

    :param check: the check's own outcome (the call phase's), which tells a rejection from a skip.
    """
    if report.skipped:
        if hasattr(report, "wasxfail"):
            return "known_failure"
        return "unsupported" if check is not None and check.outcome == "unsupported" else "skipped"
    if report.failed:
        if report.when != "call":
            return "error"
        if listed and str(report.longrepr).startswith("[XPASS(strict)]"):
            return "unexpected_pass"
        return "failed"
    if report.when == "call":
        return "unexpected_pass" if hasattr(report, "wasxfail") else "passed"
    return None


def report_reason(check: CheckOutcome) -> str:
    """The report's ``reason`` of a check that did not pass or fail: its message; a delegation run that
    was not needed keeps the words the terminal shows (``not needed: …``)."""
    return reason_text(check) if check.outcome == "not_needed" else check.message


def skip_reason(report: pytest.TestReport) -> str:
    """The reason pytest gives a skip that has no check outcome (a skip outside the check)."""
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return ""


def error_of(excinfo: pytest.ExceptionInfo[BaseException] | None) -> dict[str, str] | None:
    """``{type, module, message}`` of an exception, the message cut to its first lines."""
    if excinfo is None:
        return None
    exc = excinfo.value
    kind, module, text = type(exc).__qualname__, type(exc).__module__, str(exc)
    remote = getattr(exc, "error_record", None)  # a check that failed in the backend host
    if remote:
        kind, module = remote["type"], remote["module"]
        if kind != "CheckFailed" and module != "pytest_backendconf.suite._host":  # else the text is the message
            text = remote["message"]
    lines = text.strip().splitlines()
    message = "\n".join(lines[:MESSAGE_LINES]) + ("\n…" if len(lines) > MESSAGE_LINES else "")
    return {"type": kind, "module": module, "message": message}
