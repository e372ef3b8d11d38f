"""The conformance report as one self-contained HTML page (``--backendconf-html``, ``backendconf report html``).

The page is built from the JSON report of docs/ci-gating.md and nothing else,
so a page made at the end of a run and one made later from the saved report
are the same. It needs no network: the CSS and the little JavaScript (the
filter box, opening a failure from its cell) are inline, and every cell reads
without colour too, through a text symbol. Given several reports (a tox
matrix, several devices), it shows them side by side with the checks whose
outcome flips between them highlighted, then each report in full. It never
imports torch.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from .._quoting import html_text, shell_command
from ._reading import Report
from ._record import FAILING, PASSING, ReportTest
from ._closeness import closeness_table
from ._words import counted

#: Outcome → (text symbol, words), so that the matrix reads without colour.
SYMBOLS = {
    "passed": ("✓", "passed"),
    "failed": ("✗", "failed"),
    "error": ("E", "error"),
    "known_failure": ("K", "known failure"),
    "unexpected_pass": ("U", "unexpected pass"),
    "unsupported": ("–", "unsupported"),
    "skipped": ("S", "skipped"),
}
#: Outcomes a person has to look into: their cells link to the failure's details.
DETAILED = ("failed", "error", "known_failure", "unexpected_pass")
#: The report categories whose rows are not models (op × dtype, or checks of the whole backend).
_OP_CATEGORY = "ops"
#: A matrix is drawn while its cells are at most this many, or at most `SPARSE` per entry it shows;
#: past that (many distinct models × many distinct columns) its entries are listed instead, so that
#: the page stays linear in the report's size.
MATRIX_CELLS = 20_000
SPARSE = 8


def _fits(rows: int, columns: int, entries: int) -> bool:
    return rows * columns <= max(MATRIX_CELLS, SPARSE * entries)


#: Every text of the page that is not this module's own markup goes through here (`_quoting.html_text`).
_e = html_text


def _anchor(prefix: str, test_id: str) -> str:
    """A stable element id for a check (ids hold ``::`` and brackets, fine in HTML5 but not in CSS)."""
    return prefix + re.sub(r"[^A-Za-z0-9_-]", lambda m: f"_{ord(m.group()):x}_", test_id)


# --- what the page shows, read from a report -------------------------------------------


def check_column(test: ReportTest) -> str:
    """The matrix column of a per-model check: its id without the category and the model's name.

    ``parity::small_cnn[float16]`` (case ``small_cnn``) is column
    ``parity[float16]``; ``contract::preprocess_returns_bytes[small_cnn]`` is
    ``contract: preprocess_returns_bytes``; a case inside other brackets is
    written ``*`` (``symbolication: runtime_fault_is_symbolicated[*:cos]``).
    """
    name = test.id.split("::", 2)[-1]
    case = test.case or ""
    if case and name.startswith(case):
        rest = name[len(case) :]
    elif case and name.endswith(f"[{case}]"):
        rest = name[: -len(case) - 2]
    elif case:
        rest = name.replace(case, "*")
    else:
        rest = name
    if not rest:
        return test.category
    return f"{test.category}{rest}" if rest[0] in "[." else f"{test.category}: {rest}"


def root_cause(test: ReportTest) -> str:
    """The key failures are grouped by: the error type and its first line with the specifics blurred.

    Numbers, quoted names and shapes differ between models that fail for one
    reason, so they are replaced by placeholders; the first line is what a
    person reads to tell two causes apart.
    """
    error = test.error or {}
    if test.outcome == "unexpected_pass":
        return "unexpected pass: a listed known failure passes now"
    first = (str(error.get("message") or "").strip().splitlines() or [""])[0]
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", first)
    first = re.sub(r"\[[0-9, ]*\]", "[…]", first)
    first = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", first)  # not the 32 of float32
    kind = error.get("type") or test.outcome
    return f"{kind}: {first}" if first else str(kind)


# --- the page ---------------------------------------------------------------------------


def render(reports: Sequence[Report], labels: Sequence[str] | None = None, title: str | None = None) -> str:
    """The HTML page for one report (`read_report`), or for several side by side (``labels`` names their columns)."""
    if not reports:
        raise ValueError("render() needs at least one report")
    labels = list(labels) if labels is not None else [_default_label(r.document) for r in reports]
    if title is None:
        names = sorted({r.backend for r in reports})
        title = f"Conformance of backend {', '.join(names)}"
    body: list[str] = [f"<h1>{_e(title)}</h1>", _filter_box()]
    if len(reports) == 1:
        body += _report_sections(reports[0], "r0", level=2)
    else:
        body += _comparison(reports, labels)
        for i, (report, label) in enumerate(zip(reports, labels)):
            body.append(f'<section class="report" aria-labelledby="r{i}-h"><h2 id="r{i}-h">{_e(label)}</h2>')
            body += _report_sections(report, f"r{i}", level=3)
            body.append("</section>")
    return _PAGE.format(title=_e(title), css=_CSS, script=_SCRIPT, body="\n".join(body))


def _default_label(report: dict[str, Any]) -> str:
    backend = (report.get("backend") or {}).get("name", "?")
    environment = report.get("environment") or {}
    return f"{backend}, torch {environment.get('torch', '?')}, Python {environment.get('python', '?')}"


def _filter_box() -> str:
    return (
        '<p class="filter"><label for="filter">Filter checks and models</label> '
        '<input id="filter" type="search" placeholder="e.g. small_cnn, float16, failed" autocomplete="off"> '
        '<span id="filter-count" aria-live="polite"></span></p>'
    )


def _report_sections(read: Report, prefix: str, level: int) -> list[str]:
    report, tests = read.document, read.tests
    h = f"h{level}"
    out = [_header(report)]
    out.append(f"<{h}>Scores</{h}>")
    out.append(_cards(report))
    models = [t for t in tests if t.case and t.category != _OP_CATEGORY]
    if models:
        out.append(f"<{h}>Models × checks</{h}>")
        out.append(_legend())
        out.append(_model_matrix(models, prefix))
    others = [t for t in tests if not t.case and t.category != _OP_CATEGORY]
    if others:
        out.append(f"<{h}>Checks of the whole backend</{h}>")
        out.append(_check_list(others, prefix))
    ops = [t for t in tests if t.category == _OP_CATEGORY]
    if ops or isinstance(report.get(_OP_CATEGORY), dict):
        out.append(f"<{h}>Operators × dtypes</{h}>")
        out.append(_op_matrix(report, ops, prefix))
    delegation = _delegation_rows(report, tests)
    if delegation:
        out.append(f"<{h}>Delegation</{h}>")
        out.append(_delegation_table(delegation))
    closeness = closeness_table(tests)
    if closeness:
        out.append(f"<{h}>Closeness to the reference</{h}>")
        out.append(closeness)
    out.append(f"<{h}>Failures by root cause</{h}>")
    out += _failures(report, tests, prefix, level + 1)
    return out


def _header(report: dict[str, Any]) -> str:
    backend = report.get("backend") or {}
    env = report.get("environment") or {}
    hyp = report.get("hypothesis") or {}
    run = report.get("run") or {}
    known = report.get("known_failures") or {}
    version = f" {backend['version']}" if backend.get("version") else ""
    state = "available" if backend.get("available", True) else f"not available: {backend.get('unavailable_reason')}"
    rows = [
        ("Backend", f"{backend.get('name', '?')}{version} ({state})"),
        ("Registered from", backend.get("source")),
        ("torch", env.get("torch")),
        ("Python", f"{env.get('python', '?')} ({env.get('python_implementation', '?')})"),
        ("Machine", f"{env.get('machine', '?')}, {env.get('platform', '?')}"),
        # What changes the kernels a backend runs: a check can fail on one CPU and pass on another.
        ("CPU", env.get("cpu_model") or "unknown"),
        ("torch CPU capability", env.get("cpu_capability") or "unknown"),
        ("CPU flags (kernel-relevant)", _flags(env.get("cpu_flags"))),
        ("Hypothesis", f"profile {hyp.get('profile', '?')}, seed {hyp.get('seed', '?')}" if hyp else "not used"),
        (
            "Run",
            f"started {run.get('started', '?')}, {run.get('duration', '?')} s, exit status "
            f"{run.get('exit_status', '?')}, {run.get('xdist_workers') or 'no'} xdist workers",
        ),
    ]
    if run.get("select"):
        rows.append(("Selection", ", ".join(map(str, run["select"])) + " (scores cover the selected checks only)"))
    rows += _target_rows(run.get("target"))
    if known:
        non_strict = known.get("non_strict")
        apart = (
            f"; {counted(non_strict, 'check')} non-strict, {known.get('non_strict_passed')} passed"
            if non_strict
            else ""
        )
        rows.append(
            ("Known failures", f"{known.get('file')} ({counted(known.get('entries'), 'entry', 'entries')}{apart})")
        )
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows)
    return f'<dl class="meta">{items}</dl>'


def _flags(flags: object) -> str:
    """The report's ``cpu_flags`` in words (a report from before they were recorded has none)."""
    if not isinstance(flags, list):
        return "not recorded"
    return " ".join(str(f) for f in flags) or "none of those that change kernels"


def _target_rows(target: Any) -> list[tuple[str, str]]:
    """The device a target command reached (the report's ``run.target``); none without one."""
    if not isinstance(target, dict):
        return []
    backends = target.get("backends") or {}
    names = ", ".join(f"{name} {(entry or {}).get('version') or '?'}" for name, entry in sorted(backends.items()))
    connect, rtt = target.get("connect_seconds"), target.get("round_trip_ms")
    return [
        (
            "Target device",
            f"{target.get('machine') or '?'}, Python {target.get('python') or '?'}, torch {target.get('torch') or '?'}, "
            f"pytest-backendconf {target.get('pytest_backendconf') or '?'}; backends: {names or 'none'}",
        ),
        ("Target command", target.get("command") or "?"),
        (
            "Target link",
            f"connected in {'?' if connect is None else f'{connect:.2f}'} s; "
            f"{'?' if rtt is None else f'{rtt:.1f}'} ms round trip per request",
        ),
    ]


def _cards(report: dict[str, Any]) -> str:
    cards = []
    for category, counts in (report.get("summary") or {}).items():
        if not isinstance(counts, dict) or not counts.get("total"):
            continue
        # The score's denominator: delegation runs lowered whole ("not needed") are stated apart.
        total, passed, whole = (
            counts.get("scored", counts["total"]),
            counts.get("passed", 0),
            counts.get("not_needed", 0),
        )
        shown = {**counts, "skipped": counts.get("skipped", 0) - whole}
        parts = [counted(shown[o], SYMBOLS[o][1]) for o in SYMBOLS if o != "passed" and shown.get(o)]
        detail = ", ".join(parts + ([f"{whole} not needed (lowered whole)"] if whole else [])) or "all passed"
        if not total:  # every check of the category was lowered whole
            cards.append(
                f'<div class="card good" data-category="{_e(category)}"><h3 class="card-title">{_e(category)}</h3>'
                f'<p class="score">not needed</p><p class="detail">{_e(detail)}</p></div>'
            )
            continue
        level = "good" if passed == total else "warn" if not (counts.get("failed") or counts.get("error")) else "bad"
        cards.append(
            f'<div class="card {level}" data-category="{_e(category)}"><h3 class="card-title">{_e(category)}</h3>'
            f'<p class="score"><span class="num">{_e(passed)}/{_e(total)}</span> {_percent(passed, total)}</p>'
            f'<p class="detail">{_e(detail)}</p></div>'
        )
    return f'<div class="cards">{"".join(cards)}</div>' if cards else "<p>No conformance check ran.</p>"


def _percent(passed: Any, total: Any) -> str:
    """``97.0%``; ``?`` when the counts are not numbers (the page prints what a report says, escaped)."""
    try:
        return f"{100 * float(passed) / float(total):.1f}%"
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return "?"


def _legend() -> str:
    items = "".join(f'<li><span class="cell {o}">{_e(s)}</span> {_e(w)}</li>' for o, (s, w) in SYMBOLS.items())
    return f'<ul class="legend" aria-label="legend">{items}<li><span class="cell none">·</span> not run</li></ul>'


def _cell(test: ReportTest | None, prefix: str) -> str:
    if test is None:
        return '<td class="cell none" title="not run">·</td>'
    outcome = test.outcome
    symbol, words = SYMBOLS.get(outcome, ("?", outcome))
    tip = f"{test.id}: {words}"
    if test.reason:
        tip += f" ({test.reason})"
    if outcome in DETAILED:
        target = _anchor(prefix + "-f-", test.id)
        inner = f'<a href="#{target}" data-open="{target}" aria-label="{_e(tip)}">{_e(symbol)}</a>'
    else:
        inner = f'<span aria-label="{_e(tip)}">{_e(symbol)}</span>'
    return f'<td class="cell {_e(outcome)}" title="{_e(tip)}">{inner}</td>'


def _model_matrix(tests: list[ReportTest], prefix: str) -> str:
    columns: dict[str, None] = {}
    rows: dict[str, dict[str, ReportTest]] = {}
    for test in tests:
        column = check_column(test)
        columns[column] = None
        rows.setdefault(test.case or "", {})[column] = test
    if not _fits(len(rows), len(columns), len(tests)):
        return _too_sparse(len(rows), len(columns), len(tests), "model", "check") + _check_list(tests, prefix)
    head = "".join(f'<th scope="col"><span>{_e(c)}</span></th>' for c in columns)
    body = []
    for case, found in rows.items():
        keys = " ".join([case, *(t.id for t in found.values()), *(t.outcome for t in found.values())])
        cells = "".join(_cell(found.get(c), prefix) for c in columns)
        body.append(f'<tr data-filter="{_e(keys.lower())}"><th scope="row">{_e(case)}</th>{cells}</tr>')
    return (
        f'<div class="scroll"><table class="matrix" id="{prefix}-matrix"><caption>One row per model, one column per '
        f'check; click a marked cell for its failure.</caption><thead><tr><th scope="col">model</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _too_sparse(rows: int, columns: int, entries: int, row: str, column: str) -> str:
    return (
        f"<p>{_e(entries)} entries over {_e(rows)} {row}s × {_e(columns)} {column}s would make a matrix of "
        f"{_e(rows * columns)} cells, nearly all empty: listed one per row instead.</p>"
    )


def _check_list(tests: list[ReportTest], prefix: str) -> str:
    rows = []
    for test in tests:
        keys = f"{test.id} {test.outcome}".lower()
        reason = test.reason or ""
        rows.append(
            f'<tr data-filter="{_e(keys)}"><th scope="row">{_e(test.id.split("::", 1)[-1])}</th>'
            f"{_cell(test, prefix)}<td>{_e(reason)}</td></tr>"
        )
    return (
        '<div class="scroll"><table class="checks"><thead><tr><th scope="col">check</th>'
        '<th scope="col">outcome</th><th scope="col">note</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _op_matrix(report: dict[str, Any], tests: list[ReportTest], prefix: str) -> str:
    """Operator × dtype, from the report's ``ops`` section (overload → dtype → state) where it has one.

    A cell links to the first failing check of its overload and dtype
    (``ops::aten.add.Tensor[float16-sample0]``); without an ``ops`` section the
    cells are read from the ops checks themselves.
    """
    by_cell: dict[tuple[str, str], list[ReportTest]] = {}
    for test in tests:
        name = test.id.split("::", 2)[-1]
        match = re.fullmatch(r"(.*?)\[([^\]-]*)[^\]]*\]", name)
        op, dtype = (match.group(1), match.group(2)) if match else (name, "—")
        by_cell.setdefault((op, dtype), []).append(test)
    section = report.get(_OP_CATEGORY)
    overloads = section.get("overloads") if isinstance(section, dict) else None
    if isinstance(overloads, dict) and overloads:
        columns = [
            str(d) for d in (section or {}).get("dtypes") or sorted({d for row in overloads.values() for d in row})
        ]
        rows = {str(op): {str(d): str(v) for d, v in (row or {}).items()} for op, row in overloads.items()}
    else:
        columns = list(dict.fromkeys(d for _, d in by_cell))
        rows = {}
        for (op, dtype), group in by_cell.items():
            outcomes = {t.outcome for t in group}
            rows.setdefault(op, {})[dtype] = (
                "failed"
                if outcomes & {"failed", "error", "unexpected_pass"}
                else "known failure"
                if "known_failure" in outcomes
                else "unsupported"
                if outcomes & {"unsupported", "skipped"}
                else "passed"
            )
    # A cell's state (the report's words) → its outcome's class and symbol.
    states = {"passed": "passed", "failed": "failed", "known failure": "known_failure", "unsupported": "unsupported"}
    entries = len(tests) + sum(len(row) for row in rows.values())
    if not _fits(len(rows), len(columns), entries):
        listed = [(op, dtype, state) for op, row in sorted(rows.items()) for dtype, state in row.items()]
        listing = "".join(
            f'<tr data-filter="{_e(f"{op} {dtype} {state}".lower())}"><th scope="row">{_e(op)}</th><td>{_e(dtype)}</td>'
            f"<td>{_e(state)}</td></tr>"
            for op, dtype, state in listed
        )
        return _too_sparse(len(rows), len(columns), entries, "operator", "dtype") + (
            '<div class="scroll"><table class="checks"><thead><tr><th scope="col">operator</th><th scope="col">dtype'
            f'</th><th scope="col">state</th></tr></thead><tbody>{listing}</tbody></table></div>'
            + (_check_list(tests, prefix) if tests else "")
        )
    head = "".join(f'<th scope="col">{_e(c)}</th>' for c in columns)
    body = []
    for op, row in sorted(rows.items()):
        cells = []
        for dtype in columns:
            state = row.get(dtype, "not under test")
            group = by_cell.get((op, dtype), [])
            # The cell links to a failure of its own kind: a known failure's cell to a listed one.
            wanted = ("known_failure",) if state == "known failure" else ("failed", "error", "unexpected_pass")
            failing = next((t for t in group if t.outcome in wanted), None)
            if state in ("failed", "known failure") and failing is not None:
                cells.append(_cell(failing, prefix))
            elif state in states:
                symbol, words = SYMBOLS[states[state]]
                tip = (
                    f"{op} in {dtype}: {words} ({counted(len(group), 'sample')})"
                    if group
                    else f"{op} in {dtype}: {words}"
                )
                cells.append(
                    f'<td class="cell {states[state]}" title="{_e(tip)}"><span aria-label="{_e(tip)}">{_e(symbol)}</span></td>'
                )
            else:
                cells.append(f'<td class="cell none" title="{_e(op)} in {_e(dtype)}: not under test">·</td>')
        keys = " ".join([op, *row.values()]).lower()
        body.append(f'<tr data-filter="{_e(keys)}"><th scope="row">{_e(op)}</th>{"".join(cells)}</tr>')
    return (
        f'<div class="scroll"><table class="matrix ops"><caption>One row per operator overload, one column per dtype '
        f'(· not under test).</caption><thead><tr><th scope="col">operator</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _delegation_rows(report: dict[str, Any], tests: list[ReportTest]) -> list[tuple[str, float, str]]:
    """(model, delegated fraction, detail) from the report's ``delegation`` data, where it has any.

    Read from a top-level ``delegation`` object (model → fraction or
    {fraction, delegated, total}) or from the ``details.delegation`` of the
    delegation category's tests.
    """
    found: list[tuple[str, float, str]] = []
    top = report.get("delegation")
    if isinstance(top, dict):
        source = top.get("models", top)
        if isinstance(source, dict):
            for model, value in source.items():
                row = _delegation_row(str(model), value)
                if row:
                    found.append(row)
    if not found:
        for test in tests:
            # The delegation checks report {"details": {"delegation": {"delegated": 41, "total": 47, …}}}.
            data = (test.details or {}).get("delegation")
            if test.category == "delegation" and data is not None:
                row = _delegation_row(test.id.split("::", 2)[-1], data)
                if row:
                    found.append(row)
    return found


def _delegation_row(model: str, value: object) -> tuple[str, float, str] | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return model, float(value), ""
    if isinstance(value, dict):
        fraction = value.get("fraction")
        delegated, total = value.get("delegated"), value.get("total")
        if fraction is None and isinstance(delegated, (int, float)) and isinstance(total, (int, float)) and total:
            fraction = delegated / total
        if isinstance(fraction, (int, float)):
            detail = f"{delegated}/{total} nodes" if delegated is not None and total is not None else ""
            return model, float(fraction), detail
    return None


def _delegation_table(rows: list[tuple[str, float, str]]) -> str:
    body = "".join(
        f'<tr data-filter="{_e(model.lower())}"><th scope="row">{_e(model)}</th>'
        f'<td><meter min="0" max="1" value="{fraction:.4f}"></meter> {100 * fraction:.1f}%</td><td>{_e(detail)}</td></tr>'
        for model, fraction, detail in rows
    )
    return (
        '<table class="delegation"><thead><tr><th scope="col">model</th><th scope="col">delegated</th>'
        f'<th scope="col">nodes</th></tr></thead><tbody>{body}</tbody></table>'
    )


def _failures(report: dict[str, Any], tests: list[ReportTest], prefix: str, level: int) -> list[str]:
    failing = [t for t in tests if t.outcome in DETAILED]
    if not failing:
        return ["<p>No check failed.</p>"]
    out = [_error_statistics(report.get("errors") or {})]
    groups: dict[str, list[ReportTest]] = {}
    for test in failing:
        groups.setdefault(root_cause(test), []).append(test)
    h = f"h{min(level, 6)}"
    for n, (cause, group) in enumerate(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))):
        keys = " ".join([cause, *(t.id for t in group), *(t.outcome for t in group)]).lower()
        out.append(
            f'<section class="cause" data-filter="{_e(keys)}" aria-labelledby="{prefix}-c{n}">'
            f'<{h} id="{prefix}-c{n}">{len(group)} × {_e(cause)}</{h}>'
        )
        for test in group:
            out.append(_failure(test, prefix))
        out.append("</section>")
    return out


def _failure(test: ReportTest, prefix: str) -> str:
    error = test.error or {}
    symbol, words = SYMBOLS.get(test.outcome, ("?", test.outcome))
    parts = [f"<p><strong>{_e(words)}</strong> in stage {_e(test.stage)}"]
    if error:
        parts.append(f", {_e(error.get('module'))}.{_e(error.get('type'))}")
    parts.append("</p>")
    known = test.known_failure
    if known:
        link = known.get("link")
        href = safe_href(link, files=False)
        link_html = f' (<a href="{_e(href)}">{_e(link)}</a>)' if href else (f" ({_e(link)})" if link else "")
        parts.append(f"<p>Known failure: {_e(known.get('reason'))}{link_html}</p>")
    if error.get("message"):
        parts.append(f'<pre class="message">{_e(error["message"])}</pre>')
    parts.append(f'<p>Reproduce:</p><pre class="repro"><code>{_e(test.reproduce)}</code></pre>')
    rerun = test.rerun_command()
    if isinstance(rerun, str) and rerun != test.reproduce:  # the saved comparison alone, without pytest
        parts.append(
            f'<p>Rerun this comparison on its saved inputs:</p><pre class="rerun"><code>{_e(rerun)}</code></pre>'
        )
    parts.append(_reproduction(test.reproduction))
    anchor = _anchor(prefix + "-f-", test.id)
    return (
        f'<details id="{anchor}" class="failure {_e(test.outcome)}" data-filter="{_e(test.id.lower())}">'
        f'<summary><span class="cell {_e(test.outcome)}">{_e(symbol)}</span> {_e(test.id)}</summary>'
        f"{''.join(parts)}</details>"
    )


def _reproduction(record: object) -> str:
    """The minimal reproduction: a link to its script (a local file, next to the run), its operators."""
    if not isinstance(record, dict):
        return ""
    script = record.get("script")
    if not script:
        note = record.get("note")
        return f"<p>Minimal reproduction: none ({_e(note)})</p>" if note else ""
    nodes = record.get("nodes")
    ops = ", ".join(str(op) for op in record.get("ops") or [])
    ran_out = " (the budget ran out: the smallest found)" if record.get("budget_ran_out") else ""
    href = safe_href(script, files=True)
    shown = f'<a href="{_e(href)}">{_e(script)}</a>' if href else _e(script)
    return (
        f'<p class="minimal">Minimal reproduction{ran_out}: {_e(counted(nodes, "node"))} ({_e(ops)}), {shown}'
        f'</p><pre class="minimal-repro"><code>python {_e(shell_command([str(script)]))}</code></pre>'
    )


def safe_href(target: object, *, files: bool) -> str | None:
    """The ``href`` of a link the page may draw to ``target`` (text from a report), or None: no link.

    Only ``http(s)`` addresses, and with ``files`` a local path (absolute: a ``file:`` URI; relative:
    percent-quoted, so nothing in it reads as a scheme). ``javascript:``, ``data:`` and any other scheme
    stay text: a report is data from outside, and a link on the page is a click away from running it.
    """
    import urllib.parse
    from pathlib import PurePosixPath

    if not isinstance(target, str) or not target or any(c in target for c in "\r\n\t\0"):
        return None
    scheme = urllib.parse.urlsplit(target).scheme.lower()
    if scheme in ("http", "https"):
        return target
    if not files or scheme or target.startswith("//"):
        return None
    path = PurePosixPath(target)
    return path.as_uri() if path.is_absolute() else urllib.parse.quote(target)


def _error_statistics(errors: dict[str, Any]) -> str:
    if not errors.get("total"):
        return ""

    def table(title: str, counts: dict[str, int]) -> str:
        rows = "".join(f'<tr><th scope="row">{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in counts.items())
        return (
            f'<table class="stats"><caption>{_e(title)}</caption><thead><tr><th scope="col">{_e(title.split()[-1])}</th>'
            f'<th scope="col">checks</th></tr></thead><tbody>{rows}</tbody></table>'
        )

    return (
        f'<div class="stats-row"><p>{_e(counted(errors["total"], "check"))} did not work.</p>'
        f"{table('by exception type', errors.get('by_type') or {})}{table('by stage', errors.get('by_stage') or {})}</div>"
    )


# --- several reports ----------------------------------------------------------------------


def flips(reports: Sequence[Report]) -> dict[str, tuple[list[str | None], bool]]:
    """Check id → (its outcome in each report, whether it flips), for the checks whose outcome differs.

    As in `backendconf report merge`, only reports of the same backend are
    compared; a flip is a check that passed in one and failed in another.
    """
    by_report: list[dict[str, str | None]] = [{t.id: t.outcome for t in r.tests} for r in reports]
    backends = [r.backend for r in reports]
    ids: dict[str, None] = {}
    for found in by_report:
        ids.update(dict.fromkeys(found))
    differing: dict[str, tuple[list[str | None], bool]] = {}
    for test_id in ids:
        outcomes = [found.get(test_id) for found in by_report]
        differs = flip = False
        for backend in set(backends):
            group = {o for o, b in zip(outcomes, backends) if b == backend and o is not None}
            differs |= len(group) > 1
            flip |= is_flip(group)
        if differs:
            differing[test_id] = (outcomes, flip)
    return differing


def is_flip(outcomes: Iterable[str | None]) -> bool:
    """Passed in one report and failed in another (other differences are shown, not highlighted)."""
    found = set(outcomes)
    return bool(found & set(PASSING)) and bool(found & set(FAILING))


def _comparison(reports: Sequence[Report], labels: Sequence[str]) -> list[str]:
    heads = "".join(f'<th scope="col">{_e(label)}</th>' for label in labels)
    categories: dict[str, None] = {}
    for report in reports:
        categories.update(dict.fromkeys(report.section("summary").keys()))
    rows = []
    for category in categories:
        cells = []
        for report in reports:
            counts = report.section("summary").get(category) or {}
            total = counts.get("total") or 0
            passed = counts.get("passed", 0)
            cells.append(f"<td>{_e(passed)}/{_e(total)} {_percent(passed, total)}</td>" if total else "<td>—</td>")
        if any(c != "<td>—</td>" for c in cells):
            rows.append(f'<tr><th scope="row">{_e(category)}</th>{"".join(cells)}</tr>')
    out = [
        "<h2>Side by side</h2>",
        f'<div class="scroll"><table class="side"><thead><tr><th scope="col">category</th>{heads}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>",
    ]
    differences = flips(reports)
    flipping = [i for i, (_, flip) in differences.items() if flip]
    flip_count = counted(len(flipping), "flip")
    out.append(f"<h2>Checks that differ ({len(differences)}; {flip_count} between passing and failing)</h2>")
    out += _not_everywhere(reports, labels)
    if not differences:
        out.append("<p>Every check that ran in more than one report has the same outcome in each.</p>")
        return out
    body = []
    for test_id, (outcomes, flip) in differences.items():
        row = "".join(
            '<td class="cell none">·</td>'
            if o is None
            else f'<td class="cell {_e(o)}"><span aria-hidden="true">{_e(SYMBOLS.get(o, ("?",))[0])}</span> {_e(SYMBOLS.get(o, ("", o))[1])}</td>'
            for o in outcomes
        )
        mark = '<span class="flip-mark">flip</span> ' if flip else ""
        body.append(
            f'<tr class="{"flip" if flip else "difference"}" data-filter="{_e((test_id + (" flip" if flip else "")).lower())}">'
            f'<th scope="row">{mark}{_e(test_id)}</th>{row}</tr>'
        )
    out.append(
        f'<div class="scroll"><table class="side differences"><caption>Rows marked “flip” passed in one report and '
        f'failed in another (reports of one backend are compared).</caption><thead><tr><th scope="col">check</th>{heads}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )
    return out


def _not_everywhere(reports: Sequence[Report], labels: Sequence[str]) -> list[str]:
    """The checks some reports do not have (another torch's OpInfo samples, another zoo), listed, not compared."""
    by_report = [{t.id for t in r.tests} for r in reports]
    every = set.union(*by_report) if by_report else set()
    missing = sorted(i for i in every if any(i not in found for found in by_report))
    if not missing:
        return []
    rows = "".join(
        f'<tr data-filter="{_e(test_id.lower())}"><th scope="row">{_e(test_id)}</th>'
        + "".join(
            "<td>ran</td>" if test_id in found else '<td class="cell none">· not in this report</td>'
            for found in by_report
        )
        + "</tr>"
        for test_id in missing
    )
    heads = "".join(f'<th scope="col">{_e(label)}</th>' for label in labels)
    return [
        f"<details><summary>{len(missing)} {'check is' if len(missing) == 1 else 'checks are'} in some reports only "
        "(not compared)</summary>"
        f'<div class="scroll"><table class="side"><thead><tr><th scope="col">check</th>{heads}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div></details>"
    ]


# --- the fixed parts of the page -------------------------------------------------------------

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<main>
{body}
</main>
<script>{script}</script>
</body>
</html>
"""

# Colours: every text/background pair has a contrast ratio of at least 7:1
# (WCAG AAA), and each outcome also has its own symbol.
_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #111; background: #fff; margin: 0; }
main { max-width: 1400px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.6rem; margin: .5rem 0 1rem; }
h2 { font-size: 1.3rem; margin-top: 2rem; border-bottom: 2px solid #333; }
h3 { font-size: 1.1rem; margin-top: 1.5rem; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: 0 0 1rem; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; overflow-wrap: anywhere; }
.filter { position: sticky; top: 0; background: #fff; padding: .5rem 0; z-index: 2; border-bottom: 1px solid #ccc; }
.filter input { font-size: 1rem; padding: .3rem .5rem; width: min(30rem, 60vw); border: 2px solid #333; }
.cards { display: flex; flex-wrap: wrap; gap: .75rem; }
.card { border: 2px solid #333; border-radius: 6px; padding: .5rem .9rem; min-width: 10rem; }
.card .card-title { margin: 0; font-size: 1rem; }
.card .score { margin: .2rem 0; font-size: 1.1rem; } .card .num { font-size: 1.5rem; font-weight: 700; }
.card .detail { margin: 0; font-size: .85rem; }
.card.good { background: #e6f4ea; border-color: #14532d; } .card.warn { background: #fff4d6; border-color: #6b4500; }
.card.bad { background: #fde8e8; border-color: #7f1d1d; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border: 1px solid #999; padding: .15rem .4rem; }
th { background: #f0f0f0; text-align: left; font-weight: 600; }
caption { text-align: left; font-size: .85rem; padding: .2rem 0; white-space: nowrap; }
table.matrix thead th { vertical-align: bottom; white-space: nowrap; }
table.matrix thead th span { writing-mode: vertical-rl; transform: rotate(180deg); }
table.matrix tbody th { white-space: nowrap; }
.cell { text-align: center; font-weight: 700; min-width: 1.4rem; }
.cell a, .cell span { color: inherit; text-decoration: none; display: inline-block; min-width: 1.2rem; }
.cell a { text-decoration: underline; cursor: pointer; }
.passed { background: #d8f0df; color: #0b3d1e; } .failed { background: #f9d6d6; color: #6b0f0f; }
.error { background: #f2d0f0; color: #5a0a55; } .known_failure { background: #fff0c2; color: #553600; }
.unexpected_pass { background: #d6e4ff; color: #0a2a66; } .unsupported { background: #e9e9e9; color: #333; }
.skipped { background: #f4f4f4; color: #444; } .none { background: #fff; color: #555; }
ul.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: .3rem 1rem; font-size: .9rem; }
ul.legend .cell { display: inline-block; padding: 0 .3rem; border: 1px solid #999; }
details.failure { border: 1px solid #999; border-radius: 4px; margin: .3rem 0; padding: .2rem .5rem; }
details.failure summary { cursor: pointer; font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
details.failure summary .cell { display: inline-block; padding: 0 .3rem; }
details.failure:target, details.failure.focus { outline: 3px solid #0a2a66; }
pre { background: #f6f6f6; border: 1px solid #ccc; padding: .4rem; overflow-x: auto; white-space: pre-wrap; }
.stats-row { display: flex; flex-wrap: wrap; gap: 1.5rem; align-items: flex-start; }
tr.flip th { background: #fde8e8; } .flip-mark { background: #6b0f0f; color: #fff; padding: 0 .3rem; border-radius: 3px; }
[hidden] { display: none !important; }
"""

# The filter hides rows and failures whose data-filter text lacks every word
# typed; a cell's link opens its failure's <details> before the browser scrolls.
_SCRIPT = """
(function () {
  var box = document.getElementById('filter'), count = document.getElementById('filter-count');
  function apply() {
    var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean), shown = 0, all = 0;
    document.querySelectorAll('[data-filter]').forEach(function (el) {
      var text = el.getAttribute('data-filter');
      var ok = words.every(function (w) { return text.indexOf(w) >= 0; });
      el.hidden = !ok;
      if (el.tagName === 'TR') { all++; if (ok) shown++; }
    });
    document.querySelectorAll('section.cause').forEach(function (s) {
      if (!s.hidden && words.length) {
        var any = Array.prototype.some.call(s.querySelectorAll('details'), function (d) { return !d.hidden; });
        if (!any) { s.querySelectorAll('details').forEach(function (d) { d.hidden = false; }); }
      }
    });
    count.textContent = words.length ? shown + ' of ' + all + ' rows shown' : '';
  }
  box.addEventListener('input', apply);
  function open(id) {
    var d = document.getElementById(id);
    if (!d) return;
    d.open = true; d.hidden = false;
    if (d.parentElement) d.parentElement.hidden = false;
    document.querySelectorAll('details.focus').forEach(function (x) { x.classList.remove('focus'); });
    d.classList.add('focus');
  }
  document.addEventListener('click', function (ev) {
    var a = ev.target.closest && ev.target.closest('a[data-open]');
    if (a) open(a.getAttribute('data-open'));
  });
  if (location.hash) open(location.hash.slice(1));
})();
"""
