"""``backendconf report gate``: judge an existing report as the gated run would have, without running again.

The first green CI in one run: a run writes its report, ``backendconf report
known-failures`` writes the file from it, and this gate applies that file to
the same report. Each test's verdict before known failures (`unlisted_verdict`)
is judged again with the file's entries by `gated_outcome`, the exit status is
`exit_status`'s and the summary is `end_lines`'s: the suite's own decision and
text (``_gating``, ``_summary``). An entry scoped with ``when`` is judged
against the machine the report names, not the one the gate runs on. Never
imports torch or pytest (reading a known-failures file imports pytest for its
usage errors).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..errors import ReportError
from ._counts import OUTCOMES
from ._gating import (
    entries_here,
    entry_for,
    exit_status,
    gated_outcome,
    known_failures_line,
    unexpected_pass_text,
    unlisted_verdict,
)
from ._known_failures import KnownFailure, KnownFailureIndex
from ._known_from_report import _load, _read, _result
from ._machine import machine_line
from ._reading import printable
from ._summary import end_lines
from ._words import counted

#: pytest's exit statuses of a run that did not complete: its report does not hold every check.
_INCOMPLETE = {2: "was interrupted", 3: "ended with an internal error", 4: "ended with a usage error"}
_MACHINE_KEYS = ("machine", "cpu_model", "cpu_capability", "cpu_flags")


def gate_report(report: str, known: str | None = None) -> tuple[int, list[str]]:
    """(the exit status, the lines to print) of gating ``report`` with the known failures of ``known``.

    Without ``known``, the outcomes the run recorded (with the file it
    applied) are judged as they are. `ReportError` names a bad file and the fix.
    """
    document = _read(report)
    tests = document.get("tests")
    if not isinstance(tests, list):
        raise ReportError(f'report {report!r}: "tests" must be a list; pass the file --backendconf-report wrote')
    results = [_result(report, i, t) for i, t in enumerate(tests)]
    for i, result in enumerate(results):
        if result.outcome not in OUTCOMES:  # judged as nothing, it would pass the gate
            raise ReportError(
                f"report {report!r}: tests[{i}].outcome is {printable(repr(result.outcome))}, not one of "
                f"{', '.join(OUTCOMES)}; pass the file --backendconf-report wrote"
            )
    backend = _mapping(document.get("backend"))
    name = str(backend.get("name", "?"))
    environment = _mapping(document.get("environment"))
    machine = _machine_of(environment)
    lines = [f"backendconf: gate of report {report}: backend {name!r}, machine {machine_line(machine)}"]

    run = _mapping(document.get("run"))
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
        here, elsewhere = entries_here(_load(path, "--known-failures"), machine)
        lines.append(known_failures_line(known, here, elsewhere, "there"))
        index = KnownFailureIndex(here)
        for result in results:
            entry = entry_for(index, result.id)
            result.outcome = gated_outcome(
                unlisted_verdict(str(result.outcome), result.check_outcome),
                entry is not None,
                strict=entry is None or entry.strict,
            )
            result.known_failure = entry.as_json() if entry is not None else None
            if result.outcome == "unexpected_pass" and entry is not None:
                unexpected.append(unexpected_pass_text(result.id, entry, known, name, result.reproduce))
    else:
        applied = _mapping(document.get("known_failures"))
        if isinstance(applied.get("file"), str):
            lines.append(f"backendconf: known failures as the run applied them, from {applied['file']}")
        for result in results:
            entry_json = _mapping(result.known_failure)
            if result.outcome == "unexpected_pass" and isinstance(entry_json.get("pattern"), str):
                entry = KnownFailure(entry_json["pattern"], str(entry_json.get("reason", "")))
                unexpected.append(unexpected_pass_text(result.id, entry, applied.get("file"), name, result.reproduce))

    status = exit_status(r.outcome for r in results)
    capabilities = _mapping(backend.get("capabilities"))
    supported = capabilities.get("supported_ops")
    supported_ops = [str(op) for op in supported] if isinstance(supported, list) else None
    listed = backend.get("not_under_test")
    left_out = [w for w in listed if isinstance(w, str)] if isinstance(listed, list) else []
    for text in unexpected:
        lines += ["", *text.splitlines()]
    lines.append(_separator(f"backendconf: conformance of backend {name!r}"))
    lines += end_lines(results, supported_ops, left_out)
    lines.append(_verdict(status, [str(r.outcome) for r in results]))
    return status, [printable(line) for line in lines]


def _machine_of(environment: dict[str, Any]) -> dict[str, Any]:
    """The machine fields of a report's ``environment``, as `describe_machine` gives them (strings, a list)."""
    machine: dict[str, Any] = {k: v if isinstance(v := environment.get(k), str) else "" for k in _MACHINE_KEYS}
    flags = environment.get("cpu_flags")
    machine["cpu_flags"] = [f for f in flags if isinstance(f, str)] if isinstance(flags, list) else []
    return machine


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


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
