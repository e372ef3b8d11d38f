"""A known-failures file from an existing report: what ``--backendconf-write-known-failures`` writes, without a run.

``backendconf report known-failures REPORT.json -o known.toml`` turns last
night's report into the file: each failing check with the first line of its
failure as the reason, the entries of the known-failures file the run
applied and of an existing ``-o`` file kept where they still hold, by the
same `merge_known_failures` the run option uses. Never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from ._known_edit import KnownFailuresUpdate, edited_known_failures, existing_text
from ._known_failures import KnownFailure, facts_from_json, load_known_failures_file, merge_known_failures
from ._reading import Report, read_report


def known_failures_from_report(report: str, existing: Path | None) -> KnownFailuresUpdate:
    """The known-failures file for ``report``: its text, its entries, those it had before and those it drops.

    The entries the run applied (the report's ``known_failures.file``, when
    it is still there, else those the report's tests name) come first, then
    those of ``existing``, the regular file the output replaces (None: a new file, standard output or a
    pipe): as in a run with ``--backendconf-known-failures=K --backendconf-write-known-failures=OUTPUT``.
    ``existing`` is edited line by line (`edited_known_failures`): its comments stay.
    """
    read = read_report(report)
    applied = applied_entries(read)
    previous = list(applied)
    if existing is not None and existing.resolve() != _applied_path(read):
        previous += load_known_failures_file(existing, "-o")
    removed: dict[str, str] = {}
    entries = merge_known_failures(read.tests, previous, _stale(read), removed)
    old = existing_text(existing) if existing is not None else None
    text, rewritten = edited_known_failures(old, entries, read.backend)
    return KnownFailuresUpdate(text, entries, previous, removed, rewritten)


def _applied_path(report: Report) -> Path | None:
    file = report.section("known_failures").get("file")
    return Path(file).resolve() if isinstance(file, str) else None


def applied_entries(report: Report) -> list[KnownFailure]:
    """The entries of the file the run applied: from the file itself while it exists, else from the tests."""
    path = _applied_path(report)
    if path is not None and path.is_file():
        return load_known_failures_file(path, "the report's known_failures.file")
    entries: dict[str, KnownFailure] = {}
    for test in report.tests:
        entry = test.known_failure
        if entry is not None and isinstance(entry.get("pattern"), str):
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


def _stale(report: Report) -> set[str]:
    """The applied file's patterns the run found naming no check of the suite: dropped, as the run option drops them.

    The run judged them against every check of the suite (also those a
    selection, ``-k`` or ``-m`` left out), which a report does not list; so
    only what it recorded is known, and the entries of an existing ``-o``
    file that match no test of the report are kept.
    """
    stale = report.section("known_failures").get("stale")
    return {p for p in stale if isinstance(p, str)} if isinstance(stale, list) else set()
