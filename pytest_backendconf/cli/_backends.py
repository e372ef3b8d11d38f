"""``backendconf list``: the registered backends, with the error of any entry point that fails to import."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import warnings

from ..backend import TorchScriptBackend
from ..errors import PluginLoadError
from ..registry import BackendRegistry, Source, source_of_module
from ..report import printable


def add_command(commands: argparse._SubParsersAction) -> None:
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
    listing.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
