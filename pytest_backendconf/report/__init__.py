"""The conformance report: the JSON document, merge, HTML, the ops matrix and known failures.

Owns a report's test (`ReportTest`, with the outcome sets and its one serializer pair), what a run's
outcomes mean for CI (`gated_outcome`, `exit_status`: the suite's gating plugin and ``backendconf report
gate`` decide with them), the ``backendconf-report`` document, its one writer (`report_document`, for the
suite and for ``backendconf replay``) and its one reader (`read_report`), the counts of every category (one function for the terminal, the JSON and the
HTML), the summary lines, failure groups, merging the reports of several environments, the HTML page,
and known-failures files (also from a report). What a check is and what it decided (`CheckOutcome`) is
``pytest_backendconf.checks``; what a pytest report means for the suite is ``suite``'s.

May import: `checks`, `lowering`, `archive`, `debuginfo`, `reference`, `registry` and the public surface.
"""

import warnings
from typing import Any

from ._html import render
from ._known_failures import (
    KnownFailure,
    KnownFailureIndex,
    format_known_failures,
    load_known_failures,
    merge_known_failures,
)
from ._gate import gate_report
from ._gating import (
    USAGE_ERROR,
    entries_here,
    entry_for,
    exit_status,
    gated,
    known_failures_line,
    unexpected_pass_text,
)
from ._known_from_report import known_failures_from_report
from ._known_edit import KnownFailuresUpdate, edited_known_failures, existing_text
from ._known_from_fleet import known_failures_from_fleet, separating_when
from ._replay_results import archive_stem, replay_test_id, replay_test_results
from ._machine import applies, describe_machine, machine_line
from ._merge import format_markdown, format_text, merge, side_by_side
from ._ops import capabilities_text, matrix_text
from ._ops import parse_id as parse_ops_id
from ._reading import Report, load_json, parse_report, printable, read_matrix, read_report, read_reports, report_files
from ._record import (
    BREAKING,
    FAILING,
    OUTCOMES,
    PASSING,
    VERDICTS,
    ReportOutcome,
    ReportTest,
    Verdict,
    combined,
    gated_outcome,
)
from ._report import (
    REPORT_SCHEMA,
    REPORT_SCHEMA_VERSION,
    backend_entry,
    known_failures_entry,
    ops_matrix_of,
    report_document,
    run_entry,
)
from ._shards import join_shards, joined_score_lines, median_duration, read_durations, shard_entry, suite_digest
from ._summary import declared_scope, end_lines, summary_lines
from ._words import counted
from .._validation import InvalidField, check_choice, check_type, field
from ._failure_groups import template as failure_template

__all__ = [
    "InvalidField",
    "check_choice",
    "check_type",
    "field",
    "suite_digest",
    "shard_entry",
    "read_durations",
    "median_duration",
    "joined_score_lines",
    "join_shards",
    "BREAKING",
    "FAILING",
    "PASSING",
    "Report",
    "ReportOutcome",
    "ReportTest",
    "VERDICTS",
    "Verdict",
    "combined",
    "gated",
    "read_reports",
    "side_by_side",
    "parse_report",
    "KnownFailure",
    "KnownFailureIndex",
    "KnownFailuresUpdate",
    "edited_known_failures",
    "existing_text",
    "OUTCOMES",
    "REPORT_SCHEMA",
    "REPORT_SCHEMA_VERSION",
    "USAGE_ERROR",
    "applies",
    "backend_entry",
    "declared_scope",
    "describe_machine",
    "capabilities_text",
    "counted",
    "failure_template",
    "end_lines",
    "entries_here",
    "entry_for",
    "exit_status",
    "format_known_failures",
    "format_markdown",
    "format_text",
    "gate_report",
    "gated_outcome",
    "known_failures_from_fleet",
    "separating_when",
    "known_failures_entry",
    "known_failures_from_report",
    "known_failures_line",
    "load_json",
    "load_known_failures",
    "machine_line",
    "matrix_text",
    "merge",
    "merge_known_failures",
    "ops_matrix_of",
    "parse_ops_id",
    "printable",
    "read_matrix",
    "read_report",
    "render",
    "report_document",
    "report_files",
    "run_entry",
    "archive_stem",
    "replay_test_id",
    "replay_test_results",
    "summary_lines",
    "unexpected_pass_text",
]

#: Names this room exported before the check vocabulary got its own (`pytest_backendconf.checks`).
_MOVED_TO_CHECKS = ("CATEGORIES", "Batching", "Check", "CheckFailed", "ROOT_ID", "Unsupported", "fail", "id_matches")


def __getattr__(name: str) -> Any:
    """The old homes of the check vocabulary still import, with a `DeprecationWarning` naming the new one."""
    if name in _MOVED_TO_CHECKS:
        from .. import checks

        warnings.warn(
            f"pytest_backendconf.report.{name} moved to pytest_backendconf.checks.{name}; import it from there "
            "(the old name goes in a later release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(checks, name)
    if name == "NOT_NEEDED":
        warnings.warn(
            "pytest_backendconf.report.NOT_NEEDED is gone: a check raises pytest_backendconf.checks.NotNeeded, "
            'and a report entry says so in its "check_outcome" ("not_needed"), not in the words of its reason',
            DeprecationWarning,
            stacklevel=2,
        )
        return "not needed"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
