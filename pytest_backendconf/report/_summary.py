"""The conformance summary's lines for the terminal, from the counts the JSON report and the HTML page use.

One function for the suite's terminal summary and ``backendconf report gate``, so that a gate over a
report prints what the end of the run printed, and every line is drawn from `summarize`
(`category_counts`), as the documents are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from ..checks import NOT_RUN_AGAIN
from ._delegation_summary import delegation_line
from ._gating import non_strict_line
from ._failure_groups import group_failures, same_program_groups, same_program_lines
from ._failure_groups import summary_lines as group_lines
from ._ops import flagged_lines, ops_matrix, summary_line
from ._record import ReportTest
from ._report import compile_error_counts, compile_errors_line, not_under_test, score_line, summarize
from ._words import counted

if TYPE_CHECKING:
    from ..registry import RegisteredBackend


def declared_scope(selected: RegisteredBackend) -> tuple[list[str] | None, list[str]]:
    """(the backend's declared ``supported_ops``, what its declaration left out of the suite, in words)."""
    from ..capabilities import capabilities_of

    capabilities = capabilities_of(selected.backend)
    supported = getattr(getattr(selected.backend, "capabilities", None), "supported_ops", None)
    return (None if supported is None else sorted(supported)), not_under_test(capabilities)


def summary_lines(results: list[ReportTest], supported_ops: Iterable[str] | None, left_out: list[str]) -> list[str]:
    """The score of each category, the ops matrix's line, what was not under test and the failures grouped."""
    lines: list[str] = []
    matrix = ops_matrix(results, supported_ops)
    for category, counts in summarize(results).items():
        if counts["total"] and not (category == "ops" and matrix is not None):
            # delegation counts nodes, and "not needed" apart from passes.
            lines.append(
                (category == "delegation" and delegation_line(results, counts)) or score_line(category, counts)
            )
    if matrix is not None:
        lines += [summary_line(matrix), *flagged_lines(matrix)]
    compile_errors = compile_errors_line(compile_error_counts(results))
    if compile_errors is not None:
        lines.append(compile_errors)
    if left_out:
        lines.append(f"not under test (as declared): {'; '.join(left_out)}")
    non_strict = non_strict_line(results)
    if non_strict is not None:
        lines.append(non_strict)
    broken = [r for r in results if r.breaking]
    if len(broken) > 1:
        lines += ["", "failures grouped by message (numbers and names masked):"]
        lines += group_lines(group_failures(broken))
        same = same_program_lines(same_program_groups(broken))
        if same:
            lines += ["", "failures with the same minimal reproduction (operator sequence):", *same]
    return lines


def reproductions_line(broken: list[ReportTest]) -> str:
    """``minimal reproductions: 3 scripts, 41.2 s; --backendconf-minify=off skips them`` (and what was not made).

    Read from the failures' reproduction records, so that a gate over a
    report says what the run said. A failure of a group already shrunk
    (``same_as``) costs nothing; one whose reproduction was skipped because
    the run's budget was spent is counted apart.
    """
    records = [r.reproduction for r in broken if isinstance(r.reproduction, dict)]
    if not records:
        return ""
    own = [r for r in records if not r.get("same_as") and not r.get("skipped")]
    seconds = sum(float(r["seconds"]) for r in own if isinstance(r.get("seconds"), (int, float)))
    scripts = len({r["script"] for r in own if r.get("script")})
    line = f"minimal reproductions: {counted(scripts, 'script')}, {seconds:.1f} s; --backendconf-minify=off skips them"
    same = sum(bool(r.get("same_as")) for r in records)
    if same:
        line += f"; {counted(same, 'failure')} of a group already shrunk named its reproduction"
    skipped = [r for r in records if r.get("skipped")]
    if skipped:
        budget = skipped[0].get("run_budget")
        figure = f"{budget:g} s, " if isinstance(budget, (int, float)) else ""
        line += (
            f"; {counted(len(skipped), 'failure')} not shrunk: the run's budget ({figure}"
            "--backendconf-minify-run-budget) was spent (rerun a check alone to get its reproduction)"
        )
    return line


def end_lines(results: list[ReportTest], supported_ops: Iterable[str] | None, left_out: list[str]) -> list[str]:
    """Everything the end of a gated run prints under its ``backendconf: conformance of backend`` line.

    The summary, the failures whose minimisation ran out of time, each
    failure's command to reproduce it and its minimal reproduction, and the
    checks not run again after their model hung.
    """
    lines = summary_lines(results, supported_ops, left_out)
    broken = [r for r in results if r.breaking]
    # A failure of a group already shrunk shares its first's script: the budget ran out once, for the first.
    ran_out = [r for r in broken if (rec := r.reproduction or {}).get("budget_ran_out") and not rec.get("same_as")]
    if ran_out:
        budget = (ran_out[0].reproduction or {}).get("budget")
        figure = f"{budget:g} s, " if isinstance(budget, (int, float)) else ""
        ids = [r.id for r in ran_out]
        lines.append("")
        lines.append(
            f"the minimisation budget ({figure}--backendconf-minify-budget) "
            f"ran out for {counted(len(ids), 'failure')}: {', '.join(ids[:5])}" + (", …" if len(ids) > 5 else "")
        )
    cost = reproductions_line(broken)
    if cost:
        lines += ["", cost]
    if broken:
        lines.append("")
        lines.append("to reproduce a failure, run its command:")
        for result in broken:
            lines.append(f"{result.outcome.upper().replace('_', ' ')} {result.id}: {result.reproduce}")
            script = (result.reproduction or {}).get("script")
            if script:
                lines.append(f"    minimal reproduction: python {script}")
    saved = [r for r in results if r.error is not None and r.error.get("type") == NOT_RUN_AGAIN]
    if saved:
        lines.append(
            f"backendconf: {counted(len(saved), 'check')} failed at once, not run again on "
            "a lowered model that hung (or crashed the same way twice) in an earlier check; each would have "
            "waited for --backendconf-timeout or crashed again (docs/isolation.md)"
        )
    return lines
