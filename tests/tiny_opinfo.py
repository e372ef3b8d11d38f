"""A -p plugin for tests/test_ops_discovery_once.py: a torch build without shipped ops samples.

Every process of the run imports it (the pytest process, xdist's controller and
workers, the backend host): the shipped data folder is empty, PyTorch's OpInfo
database is cut to two entries so discovery takes seconds, and each real
discovery appends a line (the process id, the xdist worker) to the file named by
``TINY_OPINFO_COUNT``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pytest_backendconf import _compat
from pytest_backendconf.conformance.ops import discovery

_op_db, _reason = _compat.opinfo_database()
_TINY = [entry for entry in _op_db or () if entry.name in ("sub", "neg")]
_compat.opinfo_database = lambda: (_TINY, None)  # type: ignore[assignment]
discovery.DATA_DIR = Path(os.environ["TINY_OPINFO_DATA"])
_discover = discovery.discover


def _counted(*args, **kwargs):
    with open(os.environ["TINY_OPINFO_COUNT"], "a") as log:
        log.write(f"{os.getpid()} {os.environ.get('PYTEST_XDIST_WORKER', '-')}\n")
    return _discover(*args, **kwargs)


discovery.discover = _counted
