"""``backendconf profile ARCHIVE``: load an archive here (or on a device) and profile its methods (`profile`)."""

from __future__ import annotations

import argparse
import sys

from ._options import connect_target, unreachable


def add_command(commands: argparse._SubParsersAction) -> None:
    """Add ``profile``, run by `run`."""
    from ..archive import add_limit_options
    from ._options import add_plugin_option

    parser = commands.add_parser(
        "profile",
        help="time an archive's methods node by node (by source line, op and module)",
        description="Load ARCHIVE in this process (its backend must be installed, or registered "
        "with -p), call each method --repeat times, and print where the time goes: one row per "
        "source line and op, and per module. The backend's execute_profiled gives per-node "
        "events; without it, whole calls are timed.",
    )
    parser.add_argument("archive", metavar="ARCHIVE")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--inputs",
        metavar="FILE",
        help='JSON {"method": [[arg, ...], ...]}, as for run-target; each call list is profiled',
    )
    group.add_argument(
        "--example-inputs", action="store_true", help="inputs made from each method's input specs (seeded random)"
    )
    parser.add_argument("--repeat", type=int, default=10, metavar="N", help="calls per input list (default 10)")
    parser.add_argument(
        "--method",
        metavar="NAME",
        action="append",
        default=None,
        help="profile only this method (repeatable; default: every method given inputs)",
    )
    parser.add_argument(
        "--chrome-trace",
        metavar="FILE",
        help="also write a Chrome trace (JSON; open it in Perfetto); with several methods, "
        "FILE gets the method name before its suffix. Not '-': standard output carries the table",
    )
    parser.add_argument(
        "--debug-file",
        metavar="FILE",
        help="the .debug file of a handles-only archive (default: ARCHIVE.debug if present)",
    )
    add_plugin_option(parser)
    parser.add_argument(
        "--target-command",
        metavar="CMD",
        default=None,
        help="profile on a device instead of here: a command prefix that starts a Python there (e.g. "
        "'ssh ci@board /opt/venv/bin/python'), reached as run-target reaches it (docs/vendor-ci.md); "
        "default $BACKENDCONF_TARGET_COMMAND",
    )
    add_limit_options(parser)
    parser.set_defaults(run=run)


@unreachable
def run(args: argparse.Namespace) -> int:
    """The command; its inputs are read as ``run-target`` reads them (`_inputs`)."""
    import os

    from ..archive import output_file, read_archive, with_sidecar
    from ..archive import limits_from_options
    from ..diagnostics import profile, profile_on_target
    from ..lowering import instantiate
    from ..errors import BackendConfError
    from ..report import printable
    from ._inputs import calls_from_file, example_calls

    if args.repeat < 1:
        raise BackendConfError(f"--repeat {args.repeat}: give the number of calls to time, 1 or more")
    if args.chrome_trace:  # checked before the profiling; each trace is written by `to_chrome_trace`
        output_file("--chrome-trace", args.chrome_trace, stdout_carries="the profile's table")
    limits = limits_from_options(args)
    try:
        archive = read_archive(args.archive, limits=limits)
        if args.inputs is not None:
            calls = calls_from_file(archive, args.inputs)
        else:
            calls = example_calls(archive, limits)
        for name in args.method or ():
            if name not in calls:
                raise BackendConfError(
                    f"--method {name!r}: the archive's methods with inputs are {', '.join(calls) or 'none'}"
                )
        archive = with_sidecar(archive, args.archive, args.debug_file, limits)
        methods = [m for m in calls if args.method is None or m in args.method]
        device = connect_target(args)  # the device's machine and versions, printed; None: profile here
        if device is None:
            if args.plugins:
                from ..target import import_plugins

                import_plugins(args.plugins)
            loaded = instantiate(archive)
            profiles = [
                (method, i, profile(loaded, *call_args, repeat=args.repeat, method=method))
                for method in methods
                for i, call_args in enumerate(calls[method])
            ]
        else:
            # The calls run on the device, through the link run-target uses; the rows are drawn here.
            profiles = profile_on_target(
                args.archive, archive, {m: calls[m] for m in methods}, repeat=args.repeat, plugins=args.plugins
            )
    except OSError as exc:
        name = exc.filename if exc.filename is not None else args.archive
        print(f"backendconf: error: cannot read {name!r}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    where = "" if device is None else f" on the device {device['machine']}"
    for method, i, result in profiles:
        label = f"{method}" + (f" (input list {i})" if len(calls[method]) > 1 else "") + where
        # The table shows the archive's source lines and names: escaped, so that none drives the terminal.
        print(printable(f"== {label}"))
        print(printable(result, keep_newlines=True))
        if args.chrome_trace:
            path = args.chrome_trace
            if len(methods) > 1 or len(calls[method]) > 1:
                stem, suffix = os.path.splitext(path)
                path = f"{stem}.{method}{'' if len(calls[method]) == 1 else f'.{i}'}{suffix}"
            result.to_chrome_trace(path)
            print(f"chrome trace: {path}")
    return 0
