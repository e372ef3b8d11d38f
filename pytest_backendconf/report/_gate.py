"""``backendconf report gate``: judge an existing report as the gated run would have, without running again.

The first green CI in one run: a run writes its report, ``backendconf report
known-failures`` writes the file from it, and this gate applies that file to
the same report. Each test's verdict before known failures (the record's
``verdict``) is judged again with the file's entries by `gated`, the exit status is
`exit_status`'s and the summary is `end_lines`'s: the suite's own decision and
text (``_gating``, ``_summary``). An entry scoped with ``when`` is judged
against the machine the report names, not the one the gate runs on. Never
imports torch or pytest (reading a known-failures file imports pytest for its
usage errors).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ._gating import entries_here, entry_for, exit_status, gated, known_failures_line, unexpected_pass_text
from ._known_failures import KnownFailure, KnownFailureIndex, load_known_failures_file
from ._machine import machine_line
from ..errors import ReportError
from ._reading import Report, printable, read_report
from ._record import OUTCOMES
from ._summary import end_lines
from ._words import counted

#: pytest's exit statuses of a run that did not complete: its report does not hold every check.
_INCOMPLETE = {2: "was interrupted", 3: "ended with an internal error", 4: "ended with a usage error"}


def gate_report(report: str, known: str | None = None, previous: str | None = None) -> tuple[int, list[str]]:
    """(the exit status, the lines to print) of gating ``report`` with the known failures of ``known``.

    Without ``known``, the outcomes the run recorded (with the file it
    applied) are judged as they are. A run whose check set shrank fails the
    gate (`shrank_lines`): against the known-failures file the run applied,
    and against ``previous``, an earlier report of the same selection.
    `ReportError` names a bad file and the fix.
    """
    read = read_report(report)
    tests = read.tests
    backend = read.section("backend")
    name = read.backend
    machine = read.machine
    lines = [f"backendconf: gate of report {report}: backend {name!r}, machine {machine_line(machine)}"]

    run = read.section("run")
    if run.get("exit_status") in _INCOMPLETE:
        status = int(run["exit_status"])
        lines.append(
            f"backendconf: the run that wrote {report} {_INCOMPLETE[status]} (exit status {status}): "
            "its report does not hold every check, so it cannot be gated; run the suite again"
        )
        return status, lines

    unexpected: list[str] = []
    if known is not None:
        path = Path(known)
        here, elsewhere = entries_here(load_known_failures_file(path, "--known-failures"), machine)
        lines.append(known_failures_line(known, here, elsewhere, "there"))
        index = KnownFailureIndex(here)
        entries = [entry_for(index, test.id) for test in tests]
        tests = [gated(test, entry) for test, entry in zip(tests, entries)]
        for test, entry in zip(tests, entries):
            if test.outcome == "unexpected_pass" and entry is not None:
                unexpected.append(unexpected_pass_text(test.id, entry, known, name, test.reproduce))
    else:
        applied = read.section("known_failures")
        if isinstance(applied.get("file"), str):
            lines.append(f"backendconf: known failures as the run applied them, from {applied['file']}")
        for test in tests:
            entry_json = test.known_failure or {}
            if test.outcome == "unexpected_pass" and isinstance(entry_json.get("pattern"), str):
                entry = KnownFailure(entry_json["pattern"], str(entry_json.get("reason", "")))
                unexpected.append(unexpected_pass_text(test.id, entry, applied.get("file"), name, test.reproduce))

    status = exit_status(t.outcome for t in tests)
    shrank = shrank_lines(read, read_report(previous) if previous is not None else None, applied=known is None)
    if shrank and status == 0:
        status = 1
    capabilities = backend.get("capabilities") or {}
    supported = capabilities.get("supported_ops")
    supported_ops = [str(op) for op in supported] if isinstance(supported, list) else None
    listed = backend.get("not_under_test")
    left_out = [w for w in listed if isinstance(w, str)] if isinstance(listed, list) else []
    for text in unexpected:
        lines += ["", *text.splitlines()]
    lines += shrank
    lines.append(_separator(f"backendconf: conformance of backend {name!r}"))
    lines += end_lines(tests, supported_ops, left_out)
    lines.append(_verdict(status, [t.outcome for t in tests]) + ("; the check set shrank" if shrank else ""))
    return status, [printable(line) for line in lines]


def shrank_lines(report: Report, previous: Report | None, applied: bool) -> list[str]:
    """Why ``report``'s checks are fewer than they should be, in lines; [] when they are not.

    A cache may hold the samples the ops checks are made from; one that lost samples, or a plugin that
    stopped generating checks, makes a run pass on fewer checks. Two witnesses see it: the entries of
    the known-failures file the run applied that named no check of the suite it collected (the run's
    ``known_failures.stale``, judged against its whole collection; ``applied``: the gate applies that
    file), and an earlier report of the same selection whose checks this one does not all hold.
    """
    lines = []
    stale = [p for p in report.section("known_failures").get("stale") or [] if isinstance(p, str)]
    samples = report.section("ops").get("samples")
    source = samples.get("source") if isinstance(samples, dict) else None
    where = f"; the ops samples came from {source}" if source not in (None, "shipped") else ""
    if applied and stale:
        lines.append(
            f"backendconf: the check set shrank: {counted(len(stale), 'known-failures entry', 'known-failures entries')} "
            f"of {report.section('known_failures').get('file')} named no check the run collected "
            f"({', '.join(stale[:3])}{', …' if len(stale) > 3 else ''}){where}: a check was renamed or removed, or "
            "fewer were generated. Fix or remove the entries, or run again where the checks exist"
        )
    if previous is not None:
        if previous.backend != report.backend:
            raise ReportError(
                f"--previous {previous.path!r} is a report of backend {previous.backend!r}, not {report.backend!r}: "
                "pass an earlier report of the same backend"
            )
        now = {t.id for t in report.tests}
        missing = [t.id for t in previous.tests if t.id not in now]
        if previous.select != report.select:
            lines.append(
                f"backendconf: --previous {previous.path} ran another selection ({', '.join(previous.select) or 'all'}); "
                "its checks are not compared"
            )
        elif missing:
            lines.append(
                f"backendconf: the check set shrank: {counted(len(missing), 'check')} of {previous.path} "
                f"{'is' if len(missing) == 1 else 'are'} not in this report ({', '.join(missing[:3])}"
                f"{', …' if len(missing) > 3 else ''}){where}"
            )
    return lines


def _separator(title: str) -> str:
    """``==== title ====`` across the terminal, as pytest's summary separators are drawn."""
    width = shutil.get_terminal_size((80, 24)).columns
    fill = "=" * max((width - len(title) - 2) // 2, 1)
    line = f"{fill} {title} {fill}"
    return line + "=" if len(line) < width else line


def _verdict(status: int, outcomes: list[str]) -> str:
    """``backendconf: gate failed (exit status 1): 1 failed, 1 unexpected pass, 2 known failures, 3 passed``."""
    words = {"known_failure": "known failure", "unexpected_pass": "unexpected pass"}
    parts = []
    for outcome in reversed(OUTCOMES):  # the worst first
        n = outcomes.count(outcome)
        if n:
            parts.append(counted(n, words.get(outcome, outcome)))
    verdict = "passed" if status == 0 else "failed"
    return f"backendconf: gate {verdict} (exit status {status}): {', '.join(parts) or 'no conformance tests'}"
