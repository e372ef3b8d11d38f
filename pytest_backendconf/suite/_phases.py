"""What a pytest report of a conformance item means for the suite: its outcome, reason and error.

The pytest side of the report (`report.ReportTest` and the document know nothing of pytest): the
gating plugin turns each phase's `pytest.TestReport`, with the check's own `CheckOutcome` from the
item's stash, into one phase's `ReportTest`; `report.combined` adds the phases up.
"""

from __future__ import annotations

import pytest

from ..checks import CheckOutcome, reason_text
from ..report import ReportOutcome, Verdict, gated_outcome

#: The report attribute that carries a conformance test's phase (`ReportTest.to_json` and the check's
#: location; xdist serializes it).
REPORT_ATTR = "backendconf"
#: How many lines of an exception's message the report and the summary keep.
MESSAGE_LINES = 5


def phase_outcome(
    report: pytest.TestReport, listed: bool, check: CheckOutcome | None = None, strict: bool = True
) -> tuple[Verdict, ReportOutcome] | None:
    """(the verdict, the gated outcome) of one phase's report; None for a setup or teardown that passed.

    pytest's xfail marker has already turned a listed failure into a skip with ``wasxfail`` and a
    listed pass into a strict XPASS failure: the verdict under them is read back, and the outcome
    decided by `gated_outcome`, as ``backendconf report gate`` decides it from a report's verdict.

    :param check: the check's own outcome (the call phase's), which tells a rejection from a skip.
    :param strict: False for a non-strict entry, whose pass (a non-strict XPASS) is a pass.
    """
    xfailed = hasattr(report, "wasxfail")
    if report.skipped and not xfailed:
        skip: Verdict = "unsupported" if check is not None and check.outcome == "unsupported" else "skipped"
        return skip, skip
    failing: Verdict = "failed" if report.when == "call" else "error"
    if report.skipped:  # a listed check that failed (or a setup or teardown that raised)
        return failing, gated_outcome(failing, listed=True)
    if report.failed:
        # Listed, but the marker did not apply (``--runxfail``): the failure stands.
        xpassed = listed and str(report.longrepr).startswith("[XPASS(strict)]")
        return ("passed", gated_outcome("passed", listed=True)) if xpassed else (failing, failing)
    if report.when == "call":
        return "passed", gated_outcome("passed", listed=xfailed, strict=strict)
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
