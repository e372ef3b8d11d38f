"""``backendconf report merge|html|ops|known-failures|gate``: work with --backendconf-report files."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import BackendConfError
from ..report import counted, printable
from ._options import file_errors, printing_aside, usage


def add_commands(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="work with --backendconf-report files (merge, html)")
    actions = report.add_subparsers(title="report commands", metavar="ACTION")
    report.set_defaults(run=lambda args: usage(report))
    merge = actions.add_parser(
        "merge",
        help="merge the reports of several environments into one matrix and list the flips",
        description="Merge --backendconf-report files (one per environment of a tox or CI "
        "matrix) into one matrix of backend x torch version x category (passed/total and "
        "score), and list every check that passed in one environment and failed in another. With --output, "
        "join instead the reports of the shards of one run (--backendconf-shard=K/N) into one report.",
    )
    merge.add_argument(
        "reports",
        metavar="REPORT",
        nargs="+",
        help="a JSON file written by --backendconf-report, or a directory: its *.json files",
    )
    merge.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the matrix and the flips as Markdown to FILE ('-': to standard output, the text to standard error)",
    )
    merge.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="join the reports of the shards of one run (--backendconf-shard=K/N: one backend, one torch) into the "
        "one report FILE an unsharded run would have written; refuses a check run by two shards, names the checks "
        "no shard ran, and exits with status 1 when one is missing or a check failed (known failures apart); "
        "'-' writes it to standard output",
    )
    merge.add_argument(
        "--fail-on-flips",
        action="store_true",
        help="exit with status 1 when a check passed in one environment and failed in another",
    )
    merge.set_defaults(run=_report_merge)
    page = actions.add_parser(
        "html",
        help="build the HTML page of one report, or of several side by side with their flips",
        description="Build the self-contained HTML page of --backendconf-report files (the page "
        "--backendconf-html writes). Several reports (a tox matrix, several devices) are shown side "
        "by side, with the checks that flip between them highlighted, then each in full.",
    )
    page.add_argument(
        "reports",
        metavar="REPORT",
        nargs="+",
        help="a JSON file written by --backendconf-report, or a directory: its *.json files",
    )
    page.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        required=True,
        help="the HTML file to write, e.g. index.html; '-' writes it to standard output",
    )
    page.add_argument("--title", metavar="TEXT", help="the page's title (default: the backends' names)")
    page.set_defaults(run=_report_html)
    ops = actions.add_parser(
        "ops",
        help="the operator x dtype matrix of a report's ops checks, or a Capabilities declaration",
        description="Print the ops category's operator x dtype matrix from a --backendconf-report file; "
        "with --capabilities, a ready-to-paste Capabilities(supported_ops=...) of the overloads that passed.",
    )
    ops.add_argument("report", metavar="REPORT", help="a JSON file written by --backendconf-report")
    ops.add_argument(
        "--capabilities", action="store_true", help="print Capabilities(supported_ops=...) instead of the matrix"
    )
    ops.set_defaults(run=_report_ops)
    known = actions.add_parser(
        "known-failures",
        help="write a known-failures file from a report (or one per machine), as --backendconf-write-known-failures does",
        description="Write the known-failures file of a --backendconf-report file without running the suite "
        "again: every failing check, with the first line of its failure as the reason; the entries of the "
        "known-failures file the run applied, and of an existing -o file, kept where they still hold. "
        "Given the reports of one backend on several machines, a check whose outcome differs between them "
        "gets an entry scoped with `when` to the machines where it fails (or, when no machine field "
        "separates them, strict = false with a reason naming the machines), and each such check is listed.",
    )
    known.add_argument(
        "reports",
        metavar="REPORT",
        nargs="+",
        help="a JSON file written by --backendconf-report; several: one per machine, of one backend",
    )
    known.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        required=True,
        help="the known-failures file to write (or update); '-' writes it to standard output",
    )
    known.set_defaults(run=_report_known_failures)
    gate = actions.add_parser(
        "gate",
        help="gate an existing report: exit as the gated run would have, without running again",
        description="Judge a --backendconf-report file as a run with --backendconf-known-failures=FILE would "
        "have judged it: the same exit status (0: green; 1: a failure, an error or an unexpected pass; 5: no "
        "conformance tests) and the same summary. Entries scoped with `when` are judged against the machine "
        "the report names. Without --known-failures, the outcomes the run recorded are judged as they are. "
        "A file that cannot be read exits with 4, as pytest's usage errors do.",
    )
    gate.add_argument("report", metavar="REPORT", help="a JSON file written by --backendconf-report")
    gate.add_argument(
        "--known-failures",
        metavar="FILE",
        default=None,
        help="the known-failures file to apply (e.g. the one `backendconf report known-failures` wrote from REPORT)",
    )
    gate.add_argument(
        "--previous",
        metavar="REPORT",
        default=None,
        help="an earlier report of the same backend and selection: the gate fails when this one lacks any of its "
        "checks (the check set shrank)",
    )
    gate.set_defaults(run=_report_gate)


@file_errors
def _report_known_failures(args: argparse.Namespace) -> int:
    from ..archive import output_file
    from ..report import known_failures_from_fleet, known_failures_from_report

    output = output_file("-o", args.output)
    # Only a regular file holds entries to keep (old_file): standard output or a pipe holds none.
    if len(args.reports) == 1:
        update = known_failures_from_report(args.reports[0], output.old_file)
    else:
        update = known_failures_from_fleet(args.reports, output.old_file)
    output.write(update.text)
    with printing_aside(output):
        for line in update.lines(output.name):
            print(printable(f"backendconf: {line}"))
    return 0


@file_errors
def _report_gate(args: argparse.Namespace) -> int:
    from ..report import USAGE_ERROR, gate_report

    try:
        status, lines = gate_report(args.report, args.known_failures, args.previous)
    except BackendConfError as exc:
        print(f"backendconf: error: {printable(exc, keep_newlines=True)}", file=sys.stderr)
        return USAGE_ERROR
    print("\n".join(lines))
    return status


@file_errors
def _report_ops(args: argparse.Namespace) -> int:
    from ..report import capabilities_text, matrix_text, read_matrix

    matrix = read_matrix(args.report)
    print(printable(capabilities_text(matrix) if args.capabilities else matrix_text(matrix), keep_newlines=True))
    return 0


@file_errors
def _report_merge(args: argparse.Namespace) -> int:
    from ..archive import output_file
    from ..report import format_markdown, format_text, merge, read_reports

    if args.output is not None:
        if args.markdown is not None or args.fail_on_flips:
            raise BackendConfError(
                "--output joins the shards of one run; --markdown and --fail-on-flips compare whole runs: "
                "join each run's shards first, then merge the joined reports"
            )
        return _join_shards(args)
    markdown = output_file("--markdown", args.markdown) if args.markdown is not None else None
    merged = merge(read_reports(args.reports))
    if markdown is not None:
        markdown.write(format_markdown(merged))
    with printing_aside(markdown):
        sys.stdout.write(format_text(merged, shown=printable))
        if markdown is not None:
            print(printable(f"backendconf: markdown written to {markdown.name}"))
    return 1 if args.fail_on_flips and merged.flips else 0


def _join_shards(args: argparse.Namespace) -> int:
    import json

    from ..archive import output_file
    from ..report import join_shards, read_reports

    output = output_file("--output", args.output)
    joined = join_shards(read_reports(args.reports))
    document = joined.document
    output.write(json.dumps(document, indent=2) + "\n")
    with printing_aside(output):
        _say_joined(joined, output.name)
    return document["run"]["exit_status"]


def _say_joined(joined: Any, name: str) -> None:
    """What `_join_shards` joined: the shards, the scores, and what is missing or failed."""
    from ..report import BREAKING, joined_score_lines

    document = joined.document
    shards = document["run"]["shards"]
    count = shards[0]["count"]
    print(
        printable(
            f"backendconf: joined {len(shards)} of {count} shards of backend {document['backend']['name']} "
            f"(torch {document['environment']['torch']}): {len(document['tests'])} checks, written to {name}"
        )
    )
    for line in joined_score_lines(document):
        print(printable(line))
    for index in joined.missing_shards:
        print(f"backendconf: shard {index}/{count}: no report given; its checks ran in no shard")
    if joined.missing_checks:
        print(f"backendconf: {joined.missing_checks} checks of the collection were in no shard given")
    if joined.not_run:
        print(f"backendconf: {len(joined.not_run)} checks given to a shard were not run (the shard stopped early?):")
        for check in joined.not_run:
            print(printable(f"  {check}"))
    broken = [t for t in document["tests"] if t["outcome"] in BREAKING]
    for test in broken:
        print(printable(f"{test['outcome'].upper().replace('_', ' ')} {test['id']}"))


@file_errors
def _report_html(args: argparse.Namespace) -> int:
    from ..archive import output_file
    from ..report import render, side_by_side

    output = output_file("--output", args.output)
    documents, labels = side_by_side(args.reports)
    output.write(render(documents, labels if len(documents) > 1 else None, title=args.title))
    with printing_aside(output):
        print(printable(f"backendconf: HTML report of {counted(len(documents), 'report')} written to {output.name}"))
    return 0
