"""A known-failures file from an existing report: what ``--backendconf-write-known-failures`` writes, without a run.

``backendconf report known-failures REPORT.json -o known.toml`` turns last
night's report into the file: each failing check with the first line of its
failure as the reason, the entries of the known-failures file the run
applied and of an existing ``-o`` file kept where they still hold, by the
same `merge_known_failures` the run option uses. Never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ReportError
from ._merge import read_document
from ._known_edit import KnownFailuresUpdate, edited_known_failures, existing_text
from ._known_failures import KnownFailure, facts_from_json, load_known_failures, merge_known_failures
from ._report import TestResult


def known_failures_from_report(report: str, output: str) -> KnownFailuresUpdate:
    """The known-failures file for ``report``: its text, its entries, those it had before and those it drops.

    The entries the run applied (the report's ``known_failures.file``, when
    it is still there, else those the report's tests name) come first, then
    those of ``output`` when it is a regular file (not a pipe, nor ``/dev/stdout``): as in a run with
    ``--backendconf-known-failures=K --backendconf-write-known-failures=OUTPUT``.
    An existing ``output`` is edited line by line (`edited_known_failures`): its comments stay.
    """
    document = _read(report)
    tests = document.get("tests")
    if not isinstance(tests, list):
        raise ReportError(f'report {report!r}: "tests" must be a list; pass the file --backendconf-report wrote')
    results = [_result(report, i, t) for i, t in enumerate(tests)]
    applied = _applied(report, document, tests)
    previous = list(applied)
    target = Path(output)
    # Only a regular file holds old entries: a pipe or /dev/stdout would block the read (or eat its input).
    if target.is_file() and target.resolve() != _applied_path(document):
        previous += _load(target, "-o")
    stale = _stale(document)
    removed: dict[str, str] = {}
    entries = merge_known_failures(results, previous, stale, removed)
    backend = document.get("backend")
    name = backend.get("name") if isinstance(backend, dict) else None  # only a comment: any value is shown
    text, rewritten = edited_known_failures(existing_text(target), entries, str(name if name is not None else "?"))
    return KnownFailuresUpdate(text, entries, previous, removed, rewritten)


def _read(path: str) -> dict[str, Any]:
    # The reader every report command shares: depth-limited, UTF-8, errors naming the file.
    document, _ = read_document(path)
    if not isinstance(document, dict) or document.get("schema") != "backendconf-report":
        raise ReportError(f"{path!r} is not a backendconf report; pass the file --backendconf-report wrote")
    return document


def _result(path: str, index: int, test: Any) -> TestResult:
    if not isinstance(test, dict) or not isinstance(test.get("id"), str) or not isinstance(test.get("outcome"), str):
        raise ReportError(
            f"report {path!r}: tests[{index}] has no id and outcome; pass the file --backendconf-report wrote"
        )
    error = test.get("error")
    if error is not None and not (isinstance(error, dict) and {"type", "message"} <= set(error)):
        raise ReportError(f"report {path!r}: tests[{index}].error must be {{type, module, message}} or null")
    # The report keeps the numerics beside the other details; the result holds them together.
    details: dict[str, Any] = dict(test["details"]) if isinstance(test.get("details"), dict) else {}
    if isinstance(test.get("numerics"), dict):
        details["numerics"] = test["numerics"]
    duration = test.get("duration")
    check_outcome = test.get("check_outcome")
    rerun = test.get("rerun")
    return TestResult(
        test["id"],
        str(test.get("category", "")),
        test.get("case"),
        str(test.get("stage", "")),
        str(test.get("reproduce", "")),
        outcome=test["outcome"],
        duration=float(duration) if isinstance(duration, (int, float)) else 0.0,
        error=error,
        reason=test.get("reason"),
        known_failure=test.get("known_failure"),
        details=details or None,
        reproduction=test.get("reproduction") if isinstance(test.get("reproduction"), dict) else None,
        check_outcome=check_outcome if isinstance(check_outcome, str) else None,
        rerun=rerun if isinstance(rerun, str) else None,
    )


def _applied_path(document: dict[str, Any]) -> Path | None:
    known = document.get("known_failures")
    if isinstance(known, dict) and isinstance(known.get("file"), str):
        return Path(known["file"]).resolve()
    return None


def _applied(report: str, document: dict[str, Any], tests: list[Any]) -> list[KnownFailure]:
    """The entries of the file the run applied: from the file itself while it exists, else from the tests."""
    path = _applied_path(document)
    if path is not None and path.is_file():
        return _load(path, "the report's known_failures.file")
    entries: dict[str, KnownFailure] = {}
    for test in tests:
        entry = test.get("known_failure") if isinstance(test, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("pattern"), str):
            entries.setdefault(
                entry["pattern"],
                KnownFailure(
                    entry["pattern"],
                    str(entry.get("reason", "")),
                    str(entry.get("link", "")),
                    strict=entry.get("strict") is not False,
                    **facts_from_json(entry),
                ),
            )
    return list(entries.values())


def _stale(document: dict[str, Any]) -> set[str]:
    """The applied file's patterns the run found naming no check of the suite: dropped, as the run option drops them.

    The run judged them against every check of the suite (also those a
    selection, ``-k`` or ``-m`` left out), which a report does not list; so
    only what it recorded is known, and the entries of an existing ``-o``
    file that match no test of the report are kept.
    """
    known = document.get("known_failures")
    stale = known.get("stale") if isinstance(known, dict) else None
    return {p for p in stale if isinstance(p, str)} if isinstance(stale, list) else set()


def _load(path: Path, what: str) -> list[KnownFailure]:
    import pytest  # the known-failures reader's usage errors; the report package loads without pytest

    try:
        return load_known_failures(path, what)
    except pytest.UsageError as exc:
        raise ReportError(str(exc)) from None
