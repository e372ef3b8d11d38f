"""Options that several ``backendconf`` subcommands share."""

from __future__ import annotations

import argparse


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
