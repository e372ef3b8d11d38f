"""The ``backendconf`` command and its subcommands, and ``python -m pytest_backendconf.rerun``.

The ``backendconf`` entry point is ``pytest_backendconf.cli:main``.

May import: every layer; nothing in the package imports it.
"""

from ._main import main
from ._rerun import main as rerun_main

__all__ = ["main", "rerun_main"]
