"""What several ``backendconf`` subcommands share: options, and how an unreadable file or a closed pipe ends one."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from ..report import printable


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """``-p PLUGIN``: the module or file that registers the backend (every command that runs one)."""
    parser.add_argument(
        "-p",
        dest="plugins",
        metavar="PLUGIN",
        action="append",
        default=[],
        help="a module name or conftest.py/plugin file that registers the backend (repeatable)",
    )


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """``-p`` and ``--block``: what a command that loads archives on a target (run-target, replay) takes."""
    add_plugin_option(parser)
    parser.add_argument(
        "--block",
        dest="blocked",
        metavar="MODULE",
        action="append",
        default=[],
        help="another module to block on the target (repeatable)",
    )


def file_errors(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
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


def indented(text: str) -> str:
    """A message from the target, escaped, its later lines indented: none can pass for a line of ours."""
    return printable(text, keep_newlines=True).replace("\n", "\n    ")


def usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
