"""The ``backendconf`` command: list backends (and, as they land, inspect and run archives)."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Sequence

from ._registry import BackendRegistry
from .errors import BackendConfError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except BackendConfError as exc:
        print(f"backendconf: error: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backendconf", description="PyTorch delegate-backend conformance tools"
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    listing = commands.add_parser("list", help="list the registered backends")
    listing.set_defaults(run=_list)
    return parser


def _list(args: argparse.Namespace) -> int:
    registry = BackendRegistry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.load_entry_points()
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    backends = registry.backends()
    if not backends:
        print("no backends registered (install one, e.g. `pip install -e backends/reference`)")
        return 0
    rows = [("NAME", "AVAILABLE", "DISTRIBUTION", "SOURCE")]
    for name, registered in sorted(backends.items()):
        available, reason = registered.availability()
        source = registered.source
        dist = f"{source.distribution} {source.version}" if source.distribution else "-"
        rows.append((name, "yes" if available else f"no ({reason})", dist, source.description))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
