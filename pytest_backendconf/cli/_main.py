"""The ``backendconf`` command: list backends, inspect archives, symbolicate handles, run on a target."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
import warnings
from typing import Iterable, Sequence

from ..registry import BackendRegistry, Source, source_of_module
from ..report import printable
from ..backend import TorchScriptBackend
from ..errors import BackendConfError, PluginLoadError
from ._options import add_target_options


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except BackendConfError as exc:
        print(f"backendconf: error: {printable(exc, keep_newlines=True)}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backendconf", description="PyTorch delegate-backend conformance tools")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    listing = commands.add_parser(
        "list",
        help="list the registered backends",
        description="List the backends of the installed entry points (with the error of any that fails "
        "to import) and of the plugins given with -p.",
    )
    listing.add_argument(
        "-p",
        dest="plugins",
        metavar="PLUGIN",
        action="append",
        default=[],
        help="a module name or plugin/conftest.py file that registers backends, as `pytest -p` (repeatable)",
    )
    listing.set_defaults(run=_list)
    _add_archive_commands(commands)
    from ._profile import add_command as _add_profile_command

    _add_profile_command(commands, run=_profile)
    from ._replay import add_command as _add_replay_command

    _add_replay_command(commands, run=_replay)
    _add_report_commands(commands)
    return parser


def _list(args: argparse.Namespace) -> int:
    registry = BackendRegistry()
    for spec in args.plugins:
        registry.add_plugin(*_import_plugin(spec))
    with warnings.catch_warnings():
        # A broken entry point is listed below with its error, not warned about.
        warnings.simplefilter("ignore")
        registry.load_entry_points()
    backends = registry.backends()
    failed = {n: f for n, f in registry.failed_entry_points.items() if n not in backends}
    if not backends and not failed:
        print("no backends registered (install one, e.g. `pip install -e backends/reference`)")
        return 0
    rows: list[tuple[str, ...]] = [("NAME", "AVAILABLE", "DISTRIBUTION", "SOURCE")]
    for name, registered in sorted(backends.items()):
        available, reason = registered.availability()
        # A TorchScript backend's library is not loaded here: the row says what it is and where.
        kind = registered.backend.describe() if isinstance(registered.backend, TorchScriptBackend) else ""
        rows.append(
            (
                name,
                "yes" if available else f"no ({reason})",
                _distribution(registered.source),
                registered.source.description + (f" [{kind}]" if kind else ""),
            )
        )
    for name, (source, error) in sorted(failed.items()):
        rows.append((name, f"no (failed to import: {error})", _distribution(source), source.description))
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return 0


def _distribution(source: Source) -> str:
    return f"{source.distribution} {source.version}" if source.distribution else "-"


def _import_plugin(spec: str) -> tuple[object, Source]:
    """A ``-p`` plugin: a module name, or a ``.py`` file (its folder goes on sys.path, as pytest does)."""
    try:
        if spec.endswith(".py") or os.sep in spec:
            path = os.path.abspath(spec)
            directory = os.path.dirname(path)
            if directory not in sys.path:
                sys.path.insert(0, directory)
            name = os.path.splitext(os.path.basename(path))[0]
            loader = importlib.util.spec_from_file_location(name, path)
            if loader is None or loader.loader is None:
                raise ImportError(f"cannot import {path!r}")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
            kind = "conftest" if name == "conftest" else "plugin file"
            return module, Source(f"{kind} {path}")
        module = importlib.import_module(spec)
        return module, source_of_module(module, f"plugin {spec}")
    except Exception as exc:
        raise PluginLoadError(
            f"plugin {spec!r} (-p) failed to import: {type(exc).__name__}: {exc}. Check the module name or "
            "path; a module in the current folder needs PYTHONPATH=. (or `python -m backendconf`-style sys.path)"
        ) from exc


# --- archives: inspect, symbolicate, run-target -------------------------------------


def _add_archive_commands(commands: argparse._SubParsersAction) -> None:
    from ..archive import add_limit_options

    inspect = commands.add_parser(
        "inspect", help="show an archive's versions, backend, methods, entries and debug handles"
    )
    inspect.add_argument("archive", metavar="ARCHIVE", help="a file written by pytest_backendconf.save")
    add_limit_options(inspect)
    inspect.set_defaults(run=_inspect)

    symbolicate = commands.add_parser(
        "symbolicate",
        help="print the model source of debug handles, offline, from an archive alone",
        description="Print the symbolicated text of each HANDLE, or copy a log to stdout with the "
        "text of every `debug_handle=N` written under the line that mentions it. The backend "
        "is not needed.",
    )
    symbolicate.add_argument("archive", metavar="ARCHIVE", help="an archive, or the .debug file of a handles-only one")
    symbolicate.add_argument("handles", metavar="HANDLE", nargs="*", help="debug handles (integers)")
    symbolicate.add_argument("--log", metavar="FILE", help="a log to rewrite ('-' reads stdin)")
    symbolicate.add_argument(
        "--fused",
        action="store_true",
        help="the HANDLEs are one fused kernel's nodes (a debug_handles=[...] range): one text naming every node",
    )
    add_limit_options(symbolicate)
    symbolicate.set_defaults(run=_symbolicate)

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
    target.set_defaults(run=_run_target)


def _file_errors(run):
    """Report an unreadable file as `backendconf: error: ...` (exit code 1), not a traceback.

    And end quietly when stdout's reader goes away (``backendconf report ops R.json | head``):
    what it wanted was written.
    """

    def wrapped(args: argparse.Namespace) -> int:
        try:
            code = run(args)
            sys.stdout.flush()  # here, where a reader that went away is caught, not at the interpreter's exit
            return code
        except BrokenPipeError:
            # The reader went away (`... | head -1`): what it wanted was written. Point stdout
            # at /dev/null so that the interpreter's final flush does not fail again.
            import os

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
        except OSError as exc:
            name = exc.filename if exc.filename is not None else getattr(args, "archive", "?")
            print(f"backendconf: error: cannot read {name!r}: {exc.strerror or exc}", file=sys.stderr)
            return 1

    wrapped.__name__ = run.__name__
    return wrapped


@_file_errors
def _inspect(args: argparse.Namespace) -> int:
    from ..archive import SCHEMA_VERSION, read_archive
    from ..archive import limits_from_options

    archive = read_archive(args.archive, limits=limits_from_options(args))
    major, minor = archive.schema_version
    handles = sorted(archive.debug) or list(archive.handles)
    span = f" ({handles[0]}..{handles[-1]})" if handles else ""
    if archive.separate_debug is not None:
        span += f", debug info apart (.debug file of sha256 {archive.separate_debug['sha256'][:16]}...)"
    # Every field below comes from the file: escaped, so that it cannot forge lines or drive the terminal.
    p = printable
    print(f"archive:       {p(archive.source)} ({archive.file_size} bytes)")
    print(
        f"format:        {p(archive.manifest['format'])}, schema version {major}.{minor} "
        f"(this reader: {SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]})"
    )
    print(f"written by:    {p(archive.writer or '-')}, torch {p(archive.torch_version)}")
    print(f"backend:       {p(archive.backend_name)} (version {p(archive.backend_version or '-')})")
    print(f"debug handles: {len(handles)}{span}")
    print("methods:")
    for name, spec in archive.methods.items():
        print(f"  {p(name)}{p(spec.signature())}")
        for label, values in (("inputs", spec.inputs), ("outputs", spec.outputs)):
            listed = ", ".join(f"{v.name}: {v.describe()}" for v in values) or "none"
            print(f"    {label + ':':9}{p(listed)}")
        print(f"    {'compile spec:'} {json.dumps(spec.compile_spec, sort_keys=True)}")
    from ..archive import delegation
    from ..archive import format_delegation

    print("delegation:")
    for line in format_delegation(delegation(archive)).splitlines():
        print(f"  {line}")
    if archive.bundles is not None:
        print("bundled inputs (backendconf replay runs them):")
        for method, (count, size) in archive.bundles.sizes().items():
            print(
                f"  {p(method)}: {count} bundle{'' if count == 1 else 's'}, {size} bytes of inputs and expected outputs"
            )
    print("entries:")
    width = max(len(p(e.name)) for e in archive.entries)
    for e in archive.entries:
        print(
            f"  {p(e.name):{width}}  {e.size:>10} bytes  {e.compression:8} {e.stored_size:>10} stored  sha256 {e.sha256[:16]}"
        )
    return 0


@_file_errors
def _symbolicate(args: argparse.Namespace) -> int:
    from ..archive import debug_source, symbolicate
    from ..archive import limits_from_options
    from ..errors import BackendConfError

    if not args.handles and args.log is None:
        raise BackendConfError("symbolicate needs debug handles (integers) or --log FILE")
    handles = []
    for text in args.handles:
        if not re.fullmatch(r"-?[0-9]+", text.strip()):
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise BackendConfError(f"handle {shown!r} is not an integer; write debug handles such as 17")
        handle = int(text.strip()) if len(text.strip()) <= 40 else None
        if handle is None or not -(2**63) <= handle <= 2**63 - 1:
            shown = text.strip() if len(text.strip()) <= 40 else text.strip()[:37] + "..."
            raise BackendConfError(
                f"handle {shown} is outside the range of debug handles (64-bit integers, at most {2**63 - 1})"
            )
        handles.append(handle)
    archive = debug_source(args.archive, limits=limits_from_options(args))  # an archive or its .debug file
    if handles:
        print(printable(symbolicate(archive, handles, fused=args.fused), keep_newlines=True))
    if args.log is not None:
        if args.log == "-":
            lines = sys.stdin
            _rewrite_log(archive, lines)
        else:
            with open(args.log, encoding="utf-8", errors="replace") as lines:
                _rewrite_log(archive, lines)
    return 0


_HANDLE_IN_LOG = re.compile(r"debug_handle\s*=\s*(-?\d+)")
# A fused kernel's range, as BackendRuntimeError and backends print it: debug_handles=[3, 4, 5].
_RANGE_IN_LOG = re.compile(r"debug_handles\s*=\s*[\[(]\s*(-?\d+(?:\s*,\s*-?\d+)*)[\s,]*[\])]")


def _handle(digits: str) -> int | str:
    """The handle a run of digits in a log names; past 40 digits (int() refuses 4300) no handle
    can match, and it stays text, shortened, for the "was not found" line."""
    if len(digits.lstrip("-")) <= 40:
        return int(digits)
    return f"<an integer of {len(digits.lstrip('-'))} digits>"


def _rewrite_log(archive: object, lines: Iterable[str]) -> None:
    from ..archive import symbolicate
    from ..debuginfo import format_missing

    out = sys.stdout
    for line in lines:
        out.write(line if line.endswith("\n") else line + "\n")
        found = dict.fromkeys(_handle(m) for m in _HANDLE_IN_LOG.findall(line))
        handles = [h for h in found if isinstance(h, int)]
        too_long = [h for h in found if isinstance(h, str)]
        if handles:
            out.write(printable(symbolicate(archive, handles), keep_newlines=True) + "\n")
        if too_long:
            out.write(format_missing(too_long) + "\n")
        for listed in _RANGE_IN_LOG.findall(line)[:4]:
            kernel = [h for h in (_handle(d) for d in re.findall(r"-?\d+", listed)) if isinstance(h, int)]
            out.write(printable(symbolicate(archive, kernel, fused=True), keep_newlines=True) + "\n")


@_file_errors
def _replay(args: argparse.Namespace) -> int:
    from ._replay import run

    return run(args, printable)


def _profile(args: argparse.Namespace) -> int:
    from ._profile import run

    return run(args, _calls_from_file, _example_calls)


@_file_errors
def _run_target(args: argparse.Namespace) -> int:
    from ..archive import read_archive
    from ..archive import limits_from_options
    from ..target import run_on_target

    limits = limits_from_options(args)
    archive = read_archive(args.archive, limits=limits)  # a bad file is reported here, before a process starts
    calls = None
    if args.inputs is not None:
        calls = _calls_from_file(archive, args.inputs)
    elif args.example_inputs:
        calls = _example_calls(archive, limits)
    result = run_on_target(
        args.archive, calls, blocked_modules=args.blocked, plugins=args.plugins, timeout=args.timeout
    )
    if result["error"] is not None:
        error = result["error"]
        print(
            f"backendconf: error: the target could not load {printable(args.archive)!r}: "
            + _indented(f"{error['type']}: {error['message']}"),
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
                print(printable(f"  {method} call {i}: ok -> {_describe(value)}"))
            else:
                print(f"  {printable(method)} call {i}: " + _indented(f"{error['type']}: {error['message']}"))
    print("target: ok" if result["ok"] else "target: FAILED (see above)")
    return 0 if result["ok"] else 1


def _indented(text: str) -> str:
    """A message from the target, escaped, its later lines indented: none can pass for a line of ours."""
    return printable(text, keep_newlines=True).replace("\n", "\n    ")


def _calls_from_file(archive: object, path: str) -> dict:
    """The calls of an ``--inputs`` JSON file (``run-target`` and ``profile``)."""
    from ..report import load_json

    with open(path, encoding="utf-8") as f:
        text = f.read()
    # Bounded nesting: Python's parser recurses once per level, and a tensor needs one per dimension.
    document = load_json(text, f"--inputs {path!r}", 'write {"method": [[arg, ...], ...]}', BackendConfError)
    return _calls_from_json(archive, document, path)


def _calls_from_json(archive: object, document: object, name: str) -> dict:
    import torch

    from ..allowlist import dtype_named
    from ..errors import BackendConfError

    if not isinstance(document, dict):
        raise BackendConfError(f"--inputs {name!r} must hold a JSON object {{method: [[arg, ...], ...]}}")
    calls = {}
    for method, arg_lists in document.items():
        spec = archive.methods.get(method)  # type: ignore[attr-defined]
        if spec is None:
            raise BackendConfError(
                f"--inputs {name!r} names method {method!r}; the archive's methods are {', '.join(archive.methods)}"  # type: ignore[attr-defined]
            )
        if not isinstance(arg_lists, list) or not all(isinstance(a, list) for a in arg_lists):
            raise BackendConfError(f"--inputs {name!r}: {method!r} must map to a list of argument lists")
        converted = []
        for args in arg_lists:
            call = []
            for i, value in enumerate(args):
                value_spec = spec.inputs[i] if i < len(spec.inputs) else None
                if isinstance(value, list) and value_spec is not None and value_spec.kind == "tensor":
                    try:
                        value = torch.tensor(value, dtype=dtype_named(value_spec.dtype, where="--inputs"))
                    except (TypeError, ValueError, RuntimeError) as exc:
                        raise BackendConfError(
                            f"--inputs {name!r}: argument {i} of {method!r} is not a {value_spec.dtype} tensor: {exc}"
                        ) from None
                call.append(value)
            converted.append(tuple(call))
        calls[method] = converted
    return calls


def _example_calls(archive: object, limits: object = None) -> dict:
    import torch

    from ..allowlist import dtype_named
    from ..archive import check_limits
    from ..archive import ITEMSIZE
    from ..errors import ArchiveSizeError

    # The shapes come from the file: add up what they would allocate before allocating any.
    cap = check_limits(limits).max_example_input_bytes
    total = 0
    shapes = {method: _example_shapes(spec) for method, spec in archive.methods.items()}  # type: ignore[attr-defined]
    for method, spec in archive.methods.items():  # type: ignore[attr-defined]
        for i, value in enumerate(spec.inputs):
            if value.kind == "tensor":
                numel = 1
                for d in shapes[method][i]:
                    numel *= d
                total += numel * ITEMSIZE[value.dtype]
                if total > cap:
                    raise ArchiveSizeError(
                        f"archive {archive.source!r}: the example inputs of its methods need more than "  # type: ignore[attr-defined]
                        f"{cap} bytes (method {method!r}, input {value.name!r} of shape {list(value.shape)}); "
                        "pass --max-example-input-bytes N if the archive is trusted, or give --inputs"
                    )
    generator = torch.Generator().manual_seed(0)
    calls = {}
    for method, spec in archive.methods.items():  # type: ignore[attr-defined]
        args = []
        for i, value in enumerate(spec.inputs):
            if value.kind != "tensor":
                args.append(value.value)
                continue
            shape = shapes[method][i]
            dtype = dtype_named(value.dtype, where=f"method {method!r}, input {value.name!r}")
            if dtype.is_floating_point or dtype.is_complex:
                args.append(torch.randn(shape, generator=generator).to(dtype))
            elif dtype == torch.bool:
                args.append(torch.rand(shape, generator=generator) > 0.5)
            else:
                args.append(torch.randint(0, 10, shape, generator=generator, dtype=dtype))
        calls[method] = [tuple(args)]
    return calls


def _example_shapes(spec: object) -> list[list[int]]:
    """Each input's example shape: recorded sizes as they are, a dynamic one inside its recorded range."""
    dynamic = spec.dynamic_shapes  # type: ignore[attr-defined]
    sizes = dynamic.example_sizes() if dynamic is not None else {}
    return [
        [sizes.get((i, dim), 2) if d is None else d for dim, d in enumerate(value.shape or ())]
        for i, value in enumerate(spec.inputs)  # type: ignore[attr-defined]
    ]


def _describe(value: object) -> str:
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"{str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    return repr(value)


# --- reports: merge --------------------------------------------------------------------


def _add_report_commands(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="work with --backendconf-report files (merge, html)")
    actions = report.add_subparsers(title="report commands", metavar="ACTION")
    report.set_defaults(run=lambda args: _usage(report))
    merge = actions.add_parser(
        "merge",
        help="merge the reports of several environments into one matrix and list the flips",
        description="Merge --backendconf-report files (one per environment of a tox or CI "
        "matrix) into one matrix of backend x torch version x category (passed/total and "
        "score), and list every check that passed in one environment and failed in another.",
    )
    merge.add_argument(
        "reports",
        metavar="REPORT",
        nargs="+",
        help="a JSON file written by --backendconf-report, or a directory: its *.json files",
    )
    merge.add_argument("--markdown", metavar="FILE", help="also write the matrix and the flips as Markdown to FILE")
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
    page.add_argument("-o", "--output", metavar="FILE", required=True, help="the HTML file to write, e.g. index.html")
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
        help="write a known-failures file from a report, as --backendconf-write-known-failures does",
        description="Write the known-failures file of a --backendconf-report file without running the suite "
        "again: every failing check, with the first line of its failure as the reason; the entries of the "
        "known-failures file the run applied, and of an existing -o file, kept where they still hold.",
    )
    known.add_argument("report", metavar="REPORT", help="a JSON file written by --backendconf-report")
    known.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="the known-failures file to write (or update)"
    )
    known.set_defaults(run=_report_known_failures)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


@_file_errors
def _report_known_failures(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..archive import write_atomic
    from ..report import known_failures_from_report

    target = Path(args.output)
    if target.is_dir() or not target.parent.is_dir():
        raise BackendConfError(
            f"-o {args.output!r}: "
            + (
                "that is a directory; give a file name in it"
                if target.is_dir()
                else f"the directory {str(target.parent)!r} does not exist; create it first"
            )
        )
    text, entries, previous = known_failures_from_report(args.report, args.output)
    try:
        write_atomic(target, text)
    except OSError as exc:
        raise BackendConfError(f"cannot write -o {args.output!r}: {exc.strerror or exc}") from None
    before, after = {e.pattern for e in previous}, {e.pattern for e in entries}
    print(
        f"backendconf: wrote {len(entries)} known failure{'' if len(entries) == 1 else 's'} to {printable(args.output)} "
        f"({len(after - before)} added, {len(before - after)} removed)"
    )
    return 0


@_file_errors
def _report_ops(args: argparse.Namespace) -> int:
    from ..report import capabilities_text, matrix_text, read_matrix

    matrix = read_matrix(args.report)
    print(printable(capabilities_text(matrix) if args.capabilities else matrix_text(matrix), keep_newlines=True))
    return 0


@_file_errors
def _report_merge(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..archive import write_atomic
    from ..report import format_markdown, format_text, merge, read_report, report_files
    from ..errors import BackendConfError

    merged = merge([read_report(path) for path in report_files(args.reports)])
    if args.markdown is not None:
        target = Path(args.markdown)
        if target.is_dir() or not target.parent.is_dir():
            raise BackendConfError(
                f"--markdown {args.markdown!r}: "
                + (
                    "that is a directory; give a file name in it"
                    if target.is_dir()
                    else f"the directory {str(target.parent)!r} does not exist; create it first"
                )
            )
        try:
            write_atomic(target, format_markdown(merged))
        except OSError as exc:
            raise BackendConfError(f"cannot write --markdown {args.markdown!r}: {exc.strerror or exc}") from None
    sys.stdout.write(format_text(merged, shown=printable))
    if args.markdown is not None:
        print(f"backendconf: markdown written to {args.markdown}")
    return 1 if args.fail_on_flips and merged.flips else 0


def _report_html(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..archive import write_atomic
    from ..report import render
    from ..report import read_documents
    from ..errors import BackendConfError

    documents, labels = read_documents(args.reports)
    target = Path(args.output)
    if target.is_dir() or not target.parent.is_dir():
        raise BackendConfError(
            f"--output {args.output!r}: "
            + (
                "that is a directory; give a file name in it"
                if target.is_dir()
                else f"the directory {str(target.parent)!r} does not exist; create it first"
            )
        )
    try:
        write_atomic(target, render(documents, labels if len(documents) > 1 else None, title=args.title))
    except OSError as exc:
        raise BackendConfError(f"cannot write --output {args.output!r}: {exc.strerror or exc}") from None
    print(
        f"backendconf: HTML report of {len(documents)} report{'s' if len(documents) != 1 else ''} written to {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
