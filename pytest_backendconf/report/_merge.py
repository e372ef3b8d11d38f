"""Merge conformance reports from several environments (`backendconf report merge`).

A tox or CI matrix writes one ``--backendconf-report`` per environment; this
module reads them (checking the schema of docs/ci-gating.md), lays out one
matrix of backend × torch version × category, and lists the checks whose
outcome *flips*: passed in one environment, failed in another. It never
imports torch, so it runs anywhere the reports can be copied to.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

from .._quoting import markdown_code
from ..checks import CATEGORIES
from ._reading import Report, read_reports
from ._record import FAILING, PASSING
from ._words import counted

# PASSING and FAILING come from the report's record: `skipped` and `unsupported`
# are neither, so a change to or from them is a difference, not a flip.


def _error_text(error: dict[str, str] | None) -> str | None:
    if not isinstance(error, dict):
        return None
    kind = error.get("type") or "error"
    message = str(error.get("message") or "").strip().splitlines()
    first = message[0] if message else ""
    return f"{kind}: {first}"[:160] if first else str(kind)


# --- the merge ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Flip:
    """A check whose outcome differs between environments of one backend."""

    backend: str
    id: str
    #: label → (outcome, error text); environments without the check are left out.
    outcomes: dict[str, tuple[str, str | None]]

    @property
    def is_flip(self) -> bool:
        """Passed somewhere and failed elsewhere (the rest are other differences)."""
        found = {outcome for outcome, _ in self.outcomes.values()}
        return bool(found & set(PASSING)) and bool(found & set(FAILING))


@dataclasses.dataclass
class Merged:
    reports: list[Report]
    categories: list[str]
    #: Checks whose outcome differs between two environments of the same backend.
    differences: list[Flip]

    @property
    def flips(self) -> list[Flip]:
        return [d for d in self.differences if d.is_flip]

    @property
    def other_differences(self) -> list[Flip]:
        return [d for d in self.differences if not d.is_flip]


def merge(reports: Sequence[Report]) -> Merged:
    """One matrix from several reports, rows sorted by backend then torch version."""
    reports = sorted(reports, key=lambda r: (r.backend, _version_key(r.torch), r.python, r.path))
    _label(reports)
    categories = list(CATEGORIES) + sorted({c for r in reports for c in r.summary} - set(CATEGORIES))
    differences = []
    by_backend: dict[str, list[Report]] = {}
    for report in reports:
        by_backend.setdefault(report.backend, []).append(report)
    for backend, group in by_backend.items():
        if len(group) < 2:
            continue
        ids: dict[str, None] = {}
        for report in group:
            ids.update(dict.fromkeys(t.id for t in report.tests))
        results = [{t.id: t for t in report.tests} for report in group]
        for test_id in ids:
            outcomes: dict[str, tuple[str, str | None]] = {
                report.label: (found[test_id].outcome, _error_text(found[test_id].error))
                for report, found in zip(group, results)
                if test_id in found
            }
            if len({o for o, _ in outcomes.values()}) > 1:
                differences.append(Flip(backend, test_id, outcomes))
    return Merged(list(reports), categories, differences)


def _label(reports: Sequence[Report]) -> None:
    """Give each report a short unique title: torch, then Python, platform and file as needed."""
    parts = [
        lambda r: f"torch {r.torch}",
        lambda r: f"Python {r.python}",
        lambda r: r.platform,
        lambda r: r.path,
    ]
    for report in reports:
        report.label = ""
    for depth in range(1, len(parts) + 1):
        labels = [", ".join(part(r) for part in parts[:depth]) for r in reports]
        keys = [(r.backend, label) for r, label in zip(reports, labels)]
        if len(set(keys)) == len(keys) or depth == len(parts):
            for report, label in zip(reports, labels):
                report.label = label
            if len(set(keys)) < len(keys):  # the same file twice: number them
                for i, report in enumerate(reports, 1):
                    report.label = f"{report.label} #{i}"
            return


def _version_key(version: str) -> tuple:
    release = version.split("+")[0]
    key = []
    for piece in release.split("."):
        digits = "".join(c for c in piece if c.isdigit())
        key.append(int(digits) if digits else -1)
    return tuple(key), version


def _cell(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "—"
    total, passed = counts.get("scored", counts["total"]), counts["passed"]
    if total == 0:
        return "0/0"
    return f"{passed}/{total} {100 * passed / total:.1f}%"


def _overall(report: Report) -> dict[str, int]:
    return {
        "total": sum(c["total"] for c in report.summary.values()),
        "scored": sum(c.get("scored", c["total"]) for c in report.summary.values()),
        "passed": sum(c["passed"] for c in report.summary.values()),
    }


def _matrix_rows(merged: Merged) -> list[list[str]]:
    rows = [["backend", "environment", *merged.categories, "all"]]
    for report in merged.reports:
        rows.append(
            [
                report.backend,
                report.label,
                *(_cell(report.summary.get(c)) for c in merged.categories),
                _cell(_overall(report)),
            ]
        )
    return rows


def _notes(merged: Merged) -> list[str]:
    notes = []
    for report in merged.reports:
        if report.select:
            notes.append(
                f"{report.backend}, {report.label} ran a selection ({', '.join(report.select)}): "
                "its scores cover the selected checks only"
            )
        if report.exit_status not in (0, None):
            notes.append(f"{report.backend}, {report.label}: the run's exit status was {report.exit_status}")
    return notes


def _outcome_text(outcome: str, error: str | None) -> str:
    return f"{outcome} ({error})" if error else outcome


def format_text(merged: Merged, shown: Callable[[str], str] = str) -> str:
    """The terminal form: sources, the aligned matrix, notes, flips, other differences.

    :param shown: applied to every piece of text read from a report (the
        command passes `printable`, so that no field can forge a line).
    """
    p = shown
    lines = [f"backendconf: merged {counted(len(merged.reports), 'report')}"]
    for report in merged.reports:
        version = f" {report.backend_version}" if report.backend_version else ""
        lines.append(
            p(
                f"  {report.path}: backend {report.backend}{version}, torch {report.torch}, "
                f"Python {report.python}, {counted(len(report.tests), 'check')}"
            )
        )
    lines.append("")
    rows = [[p(cell) for cell in row] for row in _matrix_rows(merged)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    lines.append("(each cell: passed/total and the score, passed / total)")
    for note in _notes(merged):
        lines.append(p(f"note: {note}"))
    lines.append("")
    flips = merged.flips
    if flips:
        lines.append(f"flips: {counted(len(flips), 'check')} passed in one environment and failed in another")
    else:
        lines.append("flips: none (no check passed in one environment and failed in another)")
    for flip in flips:
        lines.append(p(f"  {flip.id} ({flip.backend})"))
        for label, (outcome, error) in flip.outcomes.items():
            lines.append(p(f"    {label}: {_outcome_text(outcome, error)}"))
    others = merged.other_differences
    if others:
        lines.append(f"other differences: {counted(len(others), 'check')}")
        for diff in others:
            listed = "; ".join(f"{label}: {outcome}" for label, (outcome, _) in diff.outcomes.items())
            lines.append(p(f"  {diff.id} ({diff.backend}) — {listed}"))
    return "\n".join(lines) + "\n"


def format_markdown(merged: Merged) -> str:
    """The same content as Markdown tables, for a CI job summary or a pull-request comment.

    Every text read from a report (ids, names, labels, paths, error texts) is a
    code span (`_quoting.markdown_code`): a backtick, ``|`` or line break in it
    cannot end the span, split a cell or start a row.
    """
    code = markdown_code
    out = ["# Conformance across environments", ""]
    header, *rows = _matrix_rows(merged)
    out += _md_table(
        [*header[:2], *map(code, header[2:-1]), header[-1]],
        [[code(row[0]), code(row[1]), *row[2:]] for row in rows],
    )
    out.append("")
    out.append("Each cell: passed/total and the score (passed / total, the denominator of the run's summary).")
    for report in merged.reports:
        if report.select:
            selection = ", ".join(code(s) for s in report.select)
            out.append(
                f"- {code(report.backend)}, {code(report.label)} ran a selection ({selection}): "
                "its scores cover the selected checks only"
            )
        if report.exit_status not in (0, None):
            out.append(
                f"- {code(report.backend)}, {code(report.label)}: the run's exit status was {report.exit_status}"
            )
    out.append("")
    flips = merged.flips
    out.append(f"## Flips ({len(flips)})")
    out.append("")
    if flips:
        out.append("Checks that passed in one environment and failed in another.")
        out.append("")
        out += _differences_table(merged, flips, with_errors=True)
    else:
        out.append("No check passed in one environment and failed in another.")
    others = merged.other_differences
    if others:
        out += ["", f"## Other differences ({len(others)})", ""]
        out += _differences_table(merged, others, with_errors=False)
    out += ["", "## Reports", ""]
    out += _md_table(
        ["backend", "environment", "file", "torch", "Python", "platform", "checks", "exit status"],
        [
            [
                *(code(str(v)) for v in (r.backend, r.label, r.path, r.torch, r.python, r.platform)),
                str(len(r.tests)),
                "?" if r.exit_status is None else str(r.exit_status),
            ]
            for r in merged.reports
        ],
    )
    return "\n".join(out) + "\n"


def _differences_table(merged: Merged, differences: Iterable[Flip], with_errors: bool) -> list[str]:
    code = markdown_code
    out = []
    by_backend: dict[str, list[Flip]] = {}
    for diff in differences:
        by_backend.setdefault(diff.backend, []).append(diff)
    for backend, group in by_backend.items():
        labels = [r.label for r in merged.reports if r.backend == backend]
        if len(by_backend) > 1:
            out += [f"Backend {code(backend)}:", ""]
        rows = []
        for diff in group:
            cells = [code(diff.id)]
            for label in labels:
                if label not in diff.outcomes:
                    cells.append("—")
                    continue
                outcome, error = diff.outcomes[label]
                text = f"**{outcome}**" if outcome in FAILING else outcome  # one of OUTCOMES: the reader checked it
                if with_errors and error:
                    text += f" ({code(error)})"
                cells.append(text)
            rows.append(cells)
        out += _md_table(["check", *map(code, labels)], rows)
        out.append("")
    return out[:-1] if out and out[-1] == "" else out


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table of cells that are Markdown already (foreign text in them quoted by the caller)."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    return [line(header), "|" + "|".join("---" for _ in header) + "|", *(line(row) for row in rows)]


def side_by_side(paths: Iterable[str]) -> tuple[list[Report], list[str]]:
    """The reports named by ``paths`` in `merge`'s order, with their column labels (the HTML page's)."""
    merged = merge(read_reports(paths))
    return merged.reports, [f"{r.backend}, {r.label}" for r in merged.reports]
