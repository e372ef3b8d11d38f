"""The conformance report: check records and outcomes, the JSON document, merge, HTML, ops matrix.

Owns what a check is and what its outcome means, known-failures files (also from a report), the
counts of every category (one function for the terminal, the JSON and the HTML), the score and summary lines,
failure groups, merging reports of several environments and the HTML page.

May import: `lowering`, `archive`, `debuginfo`, `reference`, `registry` and the public surface.
"""

from ._check import CATEGORIES, Batching, Check, CheckFailed, ROOT_ID, Unsupported, fail, id_matches
from ._counts import category_counts
from ._delegation_summary import NOT_NEEDED, delegation_line
from ._failure_groups import group_failures, same_program_groups, same_program_lines, summary_lines
from ._html import render
from ._known_failures import (
    KnownFailure,
    KnownFailureIndex,
    format_known_failures,
    load_known_failures,
    merge_known_failures,
)
from ._merge import format_markdown, format_text, merge, read_documents, read_matrix, read_report, report_files
from ._ops import capabilities_text, flagged_lines, matrix_text, summary_line
from ._ops import parse_id as parse_ops_id
from ._reading import MAX_JSON_DEPTH, load_json, printable
from ._known_from_report import known_failures_from_report
from ._report import (
    FAILING,
    OUTCOMES,
    REPORT_SCHEMA,
    REPORT_SCHEMA_VERSION,
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
    "Batching",
    "Check",
    "CheckFailed",
    "FAILING",
    "KnownFailure",
    "KnownFailureIndex",
    "MAX_JSON_DEPTH",
    "NOT_NEEDED",
    "OUTCOMES",
    "REPORT_SCHEMA",
    "REPORT_SCHEMA_VERSION",
    "REPORT_ATTR",
    "ROOT_ID",
    "TestResult",
    "Unsupported",
    "capabilities_text",
    "category_counts",
    "delegation_line",
    "error_of",
    "fail",
    "flagged_lines",
    "format_known_failures",
    "format_markdown",
    "format_text",
    "group_failures",
    "id_matches",
    "known_failures_from_report",
    "load_known_failures",
    "matrix_text",
    "load_json",
    "merge",
    "merge_known_failures",
    "not_under_test",
    "ops_matrix_of",
    "parse_ops_id",
    "phase_outcome",
    "printable",
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
