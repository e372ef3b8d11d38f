"""What a run's outcomes mean for CI: known failures applied to a check's verdict, the exit status, the texts.

One decision for the suite's gating plugin (``suite._gating``, which sees
each test as pytest reports it) and for ``backendconf report gate`` (which
judges the tests of an existing report): which entries apply on a machine,
which entry names a test, what a listed or unlisted verdict becomes, and the
exit status of the whole. Never imports pytest or torch: the exit statuses
are pytest's own numbers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable

from ..checks import ROOT_ID
from ._known_failures import KnownFailure, KnownFailureIndex
from ._record import BREAKING, ReportTest, gated_outcome
from ._words import counted


#: pytest's exit statuses (`pytest.ExitCode`) that a gate can end with.
OK, TESTS_FAILED, USAGE_ERROR, NO_TESTS_COLLECTED = 0, 1, 4, 5


def entries_here(entries: Iterable[KnownFailure], machine: dict[str, Any]) -> tuple[list, list]:
    """(the entries that apply on ``machine``, those scoped by their ``when`` to other machines).

    An entry scoped elsewhere is not applied: its check must pass on ``machine``.
    """
    entries = list(entries)
    return [e for e in entries if e.applies_to(machine)], [e for e in entries if not e.applies_to(machine)]


def entry_for(index: KnownFailureIndex, test_id: str) -> KnownFailure | None:
    """The entry naming a conformance test (id ``backendconf::category::name``): its exact id first."""
    return index.entry_for(test_id, test_id, test_id.removeprefix(f"{ROOT_ID}::"))


def gated(test: ReportTest, entry: KnownFailure | None) -> ReportTest:
    """``test`` judged from its own verdict with the known-failures entry naming it (None: unlisted)."""
    return dataclasses.replace(
        test,
        outcome=gated_outcome(test.verdict, entry is not None, strict=entry is None or entry.strict),
        known_failure=entry.as_json() if entry is not None else None,
    )


def non_strict_line(tests: Iterable[ReportTest]) -> str | None:
    """``backendconf: 5 known failures, 2 of them non-strict (1 passed here)``, or None without non-strict entries.

    A test listed by a non-strict entry carries it (``known_failure.strict``
    false) whether it failed (a ``known_failure``) or passed, so the passes
    are counted apart, never silently.
    """
    listed = non_strict = passed = 0
    for test in tests:
        outcome, entry = test.outcome, test.known_failure
        if entry is None or outcome not in ("known_failure", "passed", "unexpected_pass"):
            continue
        listed += 1
        if entry.get("strict") is False:
            non_strict += 1
            passed += outcome == "passed"
    if not non_strict:
        return None
    return (
        f"backendconf: {counted(listed, 'known failure')}, {non_strict} of them non-strict "
        f"({passed} passed here, which does not fail the run)"
    )


def exit_status(outcomes: Iterable[str | None]) -> int:
    """The gated run's exit status, as pytest decides it: a failure, an error or an unexpected pass fails it."""
    outcomes = list(outcomes)
    if not outcomes:
        return NO_TESTS_COLLECTED
    return TESTS_FAILED if any(o in BREAKING for o in outcomes) else OK


def unexpected_pass_text(
    test_id: str, entry: KnownFailure, known_path: Path | str | None, backend: str, reproduce: str
) -> str:
    """The failure text of a listed check that passed: the entry, its file, and what to do."""
    exact = entry.pattern in (test_id, test_id.removeprefix(f"{ROOT_ID}::"))
    fix = "remove the entry" if exact else "narrow the entry's pattern"
    return (
        f"{test_id} passed, but it is listed as a known failure: entry {entry.pattern!r} in "
        f"{known_path} (reason: {entry.reason}). Backend {backend!r} passes it now: "
        f"{fix}, or rewrite the file with --backendconf-write-known-failures={known_path}.\n"
        f"reproduce: {reproduce}"
    )


def known_failures_line(
    path: Path | str, here: list[KnownFailure], elsewhere: list[KnownFailure], where: str = "here"
) -> str:
    """``backendconf: known failures from FILE (N entries; M scoped to other machines, …)``.

    :param where: the machine judged, in words: ``here`` in a run, ``there`` for a report's.
    """
    count = len(here)
    text = f"backendconf: known failures from {path} ({count} entr{'y' if count == 1 else 'ies'}"
    if elsewhere:
        text += f"; {len(elsewhere)} scoped to other machines, not applied {where}: their checks must pass"
    return text + ")"
