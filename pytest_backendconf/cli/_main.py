"""The ``backendconf`` command: its parser, assembled from each command family's module, and dispatch.

The families: ``list`` (`_backends`), ``inspect``/``symbolicate`` (`_archives`), ``run-target``
(`_target`), ``profile`` (`_profile`), ``replay`` (`_replay`), ``report …`` (`_reports`). Each module
adds its commands and runs them; none is handed a reader or callback from here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import BackendConfError
from ..report import printable
from . import _archives, _backends, _profile, _replay, _reports, _target


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
    _backends.add_command(commands)
    _archives.add_commands(commands)
    _target.add_command(commands)
    _profile.add_command(commands)
    _replay.add_command(commands)
    _reports.add_commands(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
