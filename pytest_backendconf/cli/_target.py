"""``backendconf run-target``: load an archive on a simulated target and, with inputs, call its methods there."""

from __future__ import annotations

import argparse
import sys

from ..report import printable
from ._inputs import calls_from_file, describe, example_calls
from ._options import add_target_options, connect_target, file_errors, indented, unreachable


def add_command(commands: argparse._SubParsersAction) -> None:
    from ..archive import add_limit_options

    target = commands.add_parser(
        "run-target",
        help="load an archive on a simulated target (fresh process, host-only modules blocked)",
        description="Load ARCHIVE in a fresh Python process in which the backend's "
        "host_only_modules and torch's tracing entry points cannot be imported, and report "
        "whether it loads; with --inputs or --example-inputs also call its methods there.",
    )
    target.add_argument("archive", metavar="ARCHIVE")
    group = target.add_mutually_exclusive_group()
    group.add_argument(
        "--inputs",
        metavar="FILE",
        help='JSON {"method": [[arg, ...], ...]}: one list of positional arguments per call; a '
        "(nested) list of numbers becomes a tensor of the dtype the method was lowered for",
    )
    group.add_argument(
        "--example-inputs",
        action="store_true",
        help="call each method once with inputs made from its input specs (seeded random)",
    )
    add_target_options(target)
    target.add_argument("--timeout", type=float, default=60, metavar="SECONDS")
    add_limit_options(target)
    target.set_defaults(run=run)


@unreachable
@file_errors
def run(args: argparse.Namespace) -> int:
    from ..archive import read_archive
    from ..archive import limits_from_options
    from ..target import run_on_target

    limits = limits_from_options(args)
    archive = read_archive(args.archive, limits=limits)  # a bad file is reported here, before a process starts
    calls = None
    if args.inputs is not None:
        calls = calls_from_file(archive, args.inputs)
    elif args.example_inputs:
        calls = example_calls(archive, limits)
    connect_target(args)
    result = run_on_target(
        args.archive, calls, blocked_modules=args.blocked, plugins=args.plugins, timeout=args.timeout
    )
    if result["error"] is not None:
        error = result["error"]
        print(
            f"backendconf: error: the target could not load {printable(args.archive)!r}: "
            + indented(f"{error['type']}: {error['message']}"),
            file=sys.stderr,
        )
        return 1
    print(
        printable(
            f"target: loaded {args.archive!r} (backend {result['backend']!r}; methods "
            f"{', '.join(result['methods'])}) with these modules blocked: {', '.join(result['blocked'])}"
        )
    )
    for method, outputs in result["outputs"].items():
        for i, (value, error) in enumerate(zip(outputs, result["errors"][method]), 1):
            # The method's name and the error's text come from the archive and the backend: escaped, so
            # that neither can forge a `target: ok` line or drive the terminal.
            if error is None:
                print(printable(f"  {method} call {i}: ok -> {describe(value)}"))
            else:
                print(f"  {printable(method)} call {i}: " + indented(f"{error['type']}: {error['message']}"))
    print("target: ok" if result["ok"] else "target: FAILED (see above)")
    return 0 if result["ok"] else 1
