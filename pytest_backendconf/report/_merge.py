"""Merge conformance reports from several environments (`backendconf report merge`).

A tox or CI matrix writes one ``--backendconf-report`` per environment; this
module reads them (checking the schema of docs/ci-gating.md), lays out one
matrix of backend × torch version × category, and lists the checks whose
outcome *flips*: passed in one environment, failed in another. It never
imports torch, so it runs anywhere the reports can be copied to.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .._quoting import markdown_code
from ..checks import CATEGORIES
from ._reading import check_page_fields, load_json
from ._report import FAILING, OUTCOMES, PASSING, REPORT_SCHEMA, REPORT_SCHEMA_VERSION
from ..errors import ReportError
from ._words import counted

# PASSING and FAILING come from the report's schema: `skipped` and `unsupported`
# are neither, so a change to or from them is a difference, not a flip.


@dataclasses.dataclass(frozen=True)
class ReportResult:
    """One check of one report."""

    id: str
    category: str
    outcome: str
    error: str | None  # "Type: first line of the message", for the flips listing


@dataclasses.dataclass
class Report:
    """The parts of one ``--backendconf-report`` file that a merge needs."""

    path: str
    backend: str
    backend_version: str | None
    torch: str
    python: str
    platform: str
    exit_status: int | None
    select: list[str]
    summary: dict[str, dict[str, Any]]
    tests: list[ReportResult]
    #: The column title, unique among the merged reports (set by `merge`).
    label: str = ""


def report_files(paths: Iterable[str]) -> list[str]:
    """The report files named by ``paths``: a file as given, a directory as its ``*.json`` files.

    A directory lets a CI job merge whatever reports its matrix produced
    (``backendconf report merge reports/``) without a shell glob.
    """
    files = []
    for path in paths:
        if Path(path).is_dir():
            found = sorted(str(p) for p in Path(path).glob("*.json") if p.is_file())
            if not found:
                raise ReportError(
                    f"directory {path!r} holds no report (*.json); run the suite with --backendconf-report=FILE first"
                )
            files += found
        else:
            files.append(path)
    return files


def read_report(path: str | Path) -> Report:
    """Read and check one report; a `ReportError` names the file and what is wrong."""
    document, name = read_document(path)
    return parse_report(document, name)


def read_document(path: str | Path) -> tuple[Any, str]:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot read report {name!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ReportError(f"report {name!r} is not UTF-8 text; pass the file --backendconf-report wrote") from None
    return load_json(text, f"report {name!r}", "pass the file --backendconf-report wrote"), name


def read_matrix(path: str) -> dict[str, Any]:
    """The ops matrix of a ``--backendconf-report`` file; `ReportError` names the file and the fix."""
    from ._ops import ops_matrix

    report = read_report(path)  # the report's schema, checked; its nesting, bounded
    matrix = ops_matrix({"id": t.id, "outcome": t.outcome} for t in report.tests)
    if matrix is None:
        raise ReportError(
            f"report {path!r} has no ops checks: run the suite with the ops category "
            f"(e.g. `pytest --backend=NAME -m ops --backendconf-report={path}`)"
        )
    return matrix


def read_documents(paths: Iterable[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The checked report documents named by ``paths`` and their column labels, in `merge`'s order.

    For tools that need the whole document (the HTML page) rather than the
    parts a merge reads; the checks and the errors are those of `read_report`,
    and every field the page prints is checked too (`check_page_fields`).
    """
    documents: dict[int, dict[str, Any]] = {}
    reports = []
    for path in report_files(paths):
        document, name = read_document(path)
        report = parse_report(document, name)
        check_page_fields(document, name)
        documents[id(report)] = document
        reports.append(report)
    merged = merge(reports)
    return [documents[id(r)] for r in merged.reports], [f"{r.backend}, {r.label}" for r in merged.reports]


def parse_report(document: Any, name: str) -> Report:
    """Check ``document`` against the report schema (major version 1, any minor)."""
    if not isinstance(document, dict) or document.get("schema") != REPORT_SCHEMA:
        found = (
            f'its "schema" is {document.get("schema")!r}, expected {REPORT_SCHEMA!r}'
            if isinstance(document, dict)
            else f"it holds {_kind(document)}, not an object"
        )
        raise ReportError(f"{name!r} is not a backendconf report ({found}); pass the file --backendconf-report wrote")
    version = document.get("schema_version")
    if not (isinstance(version, list) and len(version) == 2 and all(_is_int(v) for v in version)):
        raise ReportError(f'report {name!r}: "schema_version" must be [major, minor], got {version!r}')
    if version[0] != REPORT_SCHEMA_VERSION[0]:
        ours = f"{REPORT_SCHEMA_VERSION[0]}.{REPORT_SCHEMA_VERSION[1]}"
        raise ReportError(
            f"report {name!r} has schema version {version[0]}.{version[1]}; this backendconf reads "
            f"version {REPORT_SCHEMA_VERSION[0]}.x (it writes {ours}); merge reports written by the "
            "same major version of pytest-backendconf, or upgrade it"
        )
    check = _Checker(name)
    backend = check.mapping(document, "backend")
    environment = check.mapping(document, "environment")
    run = check.mapping(document, "run")
    summary_doc = check.mapping(document, "summary")
    summary = {}
    for category, counts in summary_doc.items():
        where = f"summary.{category}"
        check.mapping(summary_doc, category, "summary")
        summary[category] = {
            "total": check.count(counts, "total", where),
            "passed": check.count(counts, "passed", where),
        }
        # 1.3: the score's denominator (delegation runs lowered whole left out); before, the total.
        summary[category]["scored"] = (
            check.count(counts, "scored", where) if "scored" in counts else summary[category]["total"]
        )
        if summary[category]["passed"] > summary[category]["total"]:
            raise ReportError(f"report {name!r}: {where} has more passed checks than its total")
    tests_doc = document.get("tests")
    if not isinstance(tests_doc, list):
        raise ReportError(f'report {name!r}: "tests" must be a list, got {_kind(tests_doc)}')
    tests = []
    seen = set()
    for i, entry in enumerate(tests_doc):
        where = f"tests[{i}]"
        if not isinstance(entry, dict):
            raise ReportError(f"report {name!r}: {where} must be an object, got {_kind(entry)}")
        test_id = check.string(entry, "id", where)
        outcome = check.string(entry, "outcome", where)
        if outcome not in OUTCOMES:
            raise ReportError(
                f"report {name!r}: {where} ({test_id}) has outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}"
            )
        if test_id in seen:
            raise ReportError(f"report {name!r}: {where}: check {test_id!r} is listed twice")
        seen.add(test_id)
        tests.append(
            ReportResult(test_id, check.string(entry, "category", where), outcome, _error_text(entry.get("error")))
        )
    exit_status = run.get("exit_status")
    select = run.get("select") or []
    return Report(
        path=name,
        backend=check.string(backend, "name", "backend"),
        backend_version=backend.get("version") if isinstance(backend.get("version"), str) else None,
        torch=check.string(environment, "torch", "environment"),
        python=str(environment.get("python") or "?"),
        platform=str(environment.get("platform") or "?"),
        exit_status=exit_status if _is_int(exit_status) else None,
        select=[str(s) for s in select] if isinstance(select, list) else [],
        summary=summary,
        tests=tests,
    )


class _Checker:
    """Field checks whose errors name the report and the field."""

    def __init__(self, name: str) -> None:
        self.name = name

    def mapping(self, document: dict, key: str, where: str = "") -> dict:
        value = document.get(key)
        if not isinstance(value, dict):
            field = f"{where}.{key}" if where else key
            raise ReportError(f"report {self.name!r}: {field} must be an object, got {_kind(value)}")
        return value

    def string(self, document: dict, key: str, where: str) -> str:
        value = document.get(key)
        if not isinstance(value, str):
            raise ReportError(f"report {self.name!r}: {where}.{key} must be a string, got {_kind(value)}")
        return value

    def count(self, document: Any, key: str, where: str) -> int:
        value = document.get(key) if isinstance(document, dict) else None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ReportError(
                f"report {self.name!r}: {where}.{key} must be a count (an integer >= 0), got {_kind(value)}"
            )
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """How a wrong value looks in an error: the value for scalars, else its JSON type."""
    if value is None:
        return "null or nothing"
    if isinstance(value, (str, int, float, bool)):
        return json.dumps(value)[:40]
    return "an object" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__


def _error_text(error: Any) -> str | None:
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
            outcomes = {
                report.label: (found[test_id].outcome, found[test_id].error)
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
