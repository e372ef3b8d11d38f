"""Every category's counts and score, computed once for the terminal, the JSON report and the HTML page.

The terminal summary, the report's ``summary`` and ``ops.checks`` and the
HTML cards are all drawn from `category_counts`, from the same test entries
(the report's ``tests``), so that they cannot disagree: a known failure is
counted as ``known_failure`` everywhere (never as failed), and the
delegation score's denominator is the model runs that needed delegation,
the runs the backend lowered whole counted beside it as ``not_needed``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..checks import CATEGORIES
from ._record import OUTCOMES, ReportTest
from ._words import counted


def empty_counts() -> dict[str, Any]:
    return {"total": 0, **{o: 0 for o in OUTCOMES}, "not_needed": 0, "scored": 0, "score": None}


def category_counts(tests: Iterable[ReportTest], categories: Iterable[str] = CATEGORIES) -> dict[str, dict[str, Any]]:
    """``{category: counts}`` of a report's tests.

    Each counts dict has ``total``, one count per outcome, ``not_needed``
    (delegation runs lowered whole), ``scored`` (``total`` less
    ``not_needed``: the score's denominator) and ``score`` (``passed /
    scored``, None when nothing is scored). Every one of ``categories`` (the
    suite's) is present, with zeros when none of its checks ran.
    """
    summary = {c: empty_counts() for c in categories}
    for test in tests:
        counts = summary.setdefault(test.category, empty_counts())
        counts["total"] += 1
        counts[test.outcome] += 1
        if test.not_needed:
            counts["not_needed"] += 1
    for counts in summary.values():
        counts["scored"] = counts["total"] - counts["not_needed"]
        if counts["scored"]:
            counts["score"] = round(counts["passed"] / counts["scored"], 6)
    return summary


def outcome_parts(counts: Mapping[str, Any]) -> list[str]:
    """``["5 unsupported", "2 known failures", "1 failed", …]``: the words every summary line uses."""
    known = counts.get("known_failure", 0)
    parts = [
        f"{counts.get('unsupported', 0)} unsupported",
        counted(known, "known failure"),
        f"{counts.get('failed', 0)} failed",
    ]
    extra = {"unexpected_pass": "unexpected pass", "error": "error", "skipped": "skipped"}
    for outcome, label in extra.items():
        n = counts.get(outcome, 0)
        if outcome == "skipped":
            n -= counts.get("not_needed", 0)  # said apart, where it matters (delegation)
        if n > 0:
            parts.append(counted(n, label))
    return parts


def non_strict_counts(tests: Iterable[ReportTest]) -> dict[str, int]:
    """The report's count of checks listed by non-strict entries, and of those that passed."""
    entries = [t for t in tests if t.known_failure is not None and t.known_failure.get("strict") is False]
    return {
        "non_strict": sum(t.outcome in ("known_failure", "passed") for t in entries),
        "non_strict_passed": sum(t.outcome == "passed" for t in entries),
    }
