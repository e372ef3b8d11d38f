"""The conformance summary's lines for the terminal, from the counts the JSON report and the HTML page use.

One function, so that the suite's terminal summary needs one name of this room, and so that every line
is drawn from `summarize` (`category_counts`), as the documents are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._delegation_summary import delegation_line
from ._failure_groups import group_failures, same_program_groups, same_program_lines
from ._failure_groups import summary_lines as group_lines
from ._ops import flagged_lines, summary_line
from ._report import TestResult, not_under_test, ops_matrix_of, score_line, summarize

if TYPE_CHECKING:
    from ..registry import RegisteredBackend


def summary_lines(selected: RegisteredBackend, results: list[TestResult]) -> list[str]:
    """The score of each category, the ops matrix's line, what was not under test and the failures grouped."""
    from ..capabilities import capabilities_of

    lines: list[str] = []
    matrix = ops_matrix_of(selected, results)
    for category, counts in summarize(results).items():
        if counts["total"] and not (category == "ops" and matrix is not None):
            # delegation counts nodes, and "not needed" apart from passes.
            lines.append(
                (category == "delegation" and delegation_line(results, counts)) or score_line(category, counts)
            )
    if matrix is not None:
        lines += [summary_line(matrix), *flagged_lines(matrix)]
    left_out = not_under_test(capabilities_of(selected.backend))
    if left_out:
        lines.append(f"not under test (as declared): {'; '.join(left_out)}")
    broken = [r for r in results if r.outcome in ("failed", "error", "unexpected_pass")]
    if len(broken) > 1:
        lines += ["", "failures grouped by message (numbers and names masked):"]
        lines += group_lines(group_failures(r.as_json() for r in broken))
        same = same_program_lines(same_program_groups(r.as_json() for r in broken))
        if same:
            lines += ["", "failures with the same minimal reproduction (operator sequence):", *same]
    return lines
