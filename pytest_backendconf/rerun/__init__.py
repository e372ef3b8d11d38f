"""``python -m pytest_backendconf.rerun FILE``: rerun one saved comparison.

The command lives in `cli` (``cli.rerun_main``); this package keeps the module
path that failing checks print, and that users run.
"""

from ..cli import rerun_main as main

__all__ = ["main"]
