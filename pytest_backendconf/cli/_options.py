"""What several ``backendconf`` subcommands share: options, where their lines go, and how an unreadable file or a
closed pipe ends one."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Callable

from ..report import printable

if TYPE_CHECKING:
    from ..archive import OutputFile


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
    parser.add_argument(
        "--target-command",
        metavar="CMD",
        default=None,
        help="a command prefix that starts a Python on a device (e.g. 'ssh ci@board /opt/venv/bin/python'): "
        "the target runs there, through `CMD -m pytest_backendconf.target` (docs/vendor-ci.md); default "
        "$BACKENDCONF_TARGET_COMMAND",
    )


#: The exit status of a command whose device cannot be reached (pytest's usage error has the same).
UNREACHABLE_STATUS = 4


def connect_target(args: argparse.Namespace) -> dict | None:
    """Reach the device of ``--target-command`` once (raises `TargetUnreachable`/`TargetVersionError`);
    its machine and versions are printed, and returned for the report. None without a target command."""
    import os

    from ..report import printable
    from ..target import probe, use_target_command
    from ..target import TARGET_COMMAND_ENV as COMMAND_ENV

    command = args.target_command or os.environ.get(COMMAND_ENV) or None
    if command is None:
        return None
    info = probe(command)
    use_target_command(command)
    print(
        printable(
            f"target: device {info['machine']} (Python {info['python']}, torch {info['torch']}, "
            f"pytest-backendconf {info['pytest_backendconf']}) through {info['command']}"
        )
    )
    return info


def unreachable(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A device that cannot be reached (or runs other versions) is one error line and exit status 4."""

    def wrapped(args: argparse.Namespace) -> int:
        from ..errors import TargetUnreachable, TargetVersionError
        from ..report import printable
        from ..target import target_command, use_target_command

        previous = target_command()
        try:
            return run(args)
        except (TargetUnreachable, TargetVersionError) as exc:
            print(f"backendconf: error: --target-command: {printable(exc)}", file=sys.stderr)
            return UNREACHABLE_STATUS
        finally:
            # `cli.main` called in a process that goes on (a script, a test) leaves its target as it was:
            # the device of one command must not become the target of what the process runs next.
            use_target_command(previous)

    wrapped.__name__ = run.__name__
    return wrapped


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


def printing_aside(*outputs: OutputFile | None) -> contextlib.AbstractContextManager:
    """While a command's document goes to standard output (``-o -``), what else it prints goes to standard error,
    so that the document can be piped on alone. The document itself is written outside this block."""
    if any(output is not None and output.to_stdout for output in outputs):
        return contextlib.redirect_stdout(sys.stderr)
    return contextlib.nullcontext()


def indented(text: str) -> str:
    """A message from the target, escaped, its later lines indented: none can pass for a line of ours."""
    return printable(text, keep_newlines=True).replace("\n", "\n    ")


def usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
