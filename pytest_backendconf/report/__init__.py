"""The conformance report: check records and outcomes, the JSON document, merge, HTML, ops matrix.

Owns what a check is and what its outcome means, known-failures files, the score and summary lines,
failure groups, merging reports of several environments and the HTML page.

May import: `lowering`, `archive`, `debuginfo`, `reference`, `registry` and the public surface.
"""

from ._check import CATEGORIES, Check, CheckFailed, ROOT_ID, Unsupported, fail, id_matches
from ._delegation_summary import NOT_NEEDED, delegation_line
from ._failure_groups import group_failures, same_program_groups, same_program_lines, summary_lines
from ._html import render
from ._known_failures import KnownFailure, format_known_failures, load_known_failures, merge_known_failures
from ._merge import format_markdown, format_text, merge, read_documents, read_report, report_files
from ._ops import capabilities_text, flagged_lines, matrix_text, read_matrix, summary_line
from ._report import (
    FAILING,
    REPORT_ATTR,
    TestResult,
    error_of,
    not_under_test,
    ops_matrix_of,
    phase_outcome,
    report_document,
    score_line,
    skip_reason,
    summarize,
)

__all__ = [
    "CATEGORIES",
    "Check",
    "CheckFailed",
    "FAILING",
    "KnownFailure",
    "NOT_NEEDED",
    "REPORT_ATTR",
    "ROOT_ID",
    "TestResult",
    "Unsupported",
    "capabilities_text",
    "delegation_line",
    "error_of",
    "fail",
    "flagged_lines",
    "format_known_failures",
    "format_markdown",
    "format_text",
    "group_failures",
    "id_matches",
    "load_known_failures",
    "matrix_text",
    "merge",
    "merge_known_failures",
    "not_under_test",
    "ops_matrix_of",
    "phase_outcome",
    "read_documents",
    "read_matrix",
    "read_report",
    "render",
    "report_document",
    "report_files",
    "score_line",
    "skip_reason",
    "summarize",
    "summary_line",
    "same_program_groups",
    "same_program_lines",
    "summary_lines",
]
