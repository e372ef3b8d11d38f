"""``backendconf inspect`` and ``symbolicate``: read an archive (or its .debug file) offline; no backend needed."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Iterable

from ..report import printable
from ._options import file_errors


def add_commands(commands: argparse._SubParsersAction) -> None:
    from ..archive import add_limit_options

    inspect = commands.add_parser(
        "inspect", help="show an archive's versions, backend, methods, entries and debug handles"
    )
    inspect.add_argument("archive", metavar="ARCHIVE", help="a file written by pytest_backendconf.save")
    add_limit_options(inspect)
    inspect.set_defaults(run=inspect_command)

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
    symbolicate.set_defaults(run=symbolicate_command)


@file_errors
def inspect_command(args: argparse.Namespace) -> int:
    from ..archive import SCHEMA_VERSION, check_sidecar_size, read_archive
    from ..archive import limits_from_options

    limits = limits_from_options(args)
    if args.archive.endswith(".debug"):
        check_sidecar_size(args.archive, limits)  # bounded before it is read, as a debug file
    archive = read_archive(args.archive, limits=limits)
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


@file_errors
def symbolicate_command(args: argparse.Namespace) -> int:
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
