"""``python -m pytest_backendconf.rerun FILE``: rerun one saved comparison.

The command lives in `cli` (``cli._rerun``); this package keeps the module
path that failing checks print, and that users run.
"""

from ..cli._rerun import main

__all__ = ["main"]
