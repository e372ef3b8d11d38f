"""The run's account of minimal reproductions: the time spent on them and the failure groups already shrunk.

A run shrinks one failure per distinct failure group (the failure's
template, as "failures grouped" prints it, and the operator or error it
fails at), and stops shrinking once ``--backendconf-minify-run-budget``
seconds are spent. pytest-xdist's workers share the account through a JSON
file in the run's temporary folder, read and written under a POSIX
``flock``, so the budget and the groups hold for the whole run; the lock is
held only to read and update the account, never while shrinking. Without
``fcntl`` (Windows) or without a temporary folder, each process keeps its
own account (docs/conformance-suite.md, "Minimal reproductions").
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from ._settings import setting

#: Seconds a run spends on minimal reproductions by default (``--backendconf-minify-run-budget``).
DEFAULT_RUN_BUDGET = 300.0
RUN_BUDGET_ENV = "BACKENDCONF_MINIFY_RUN_BUDGET"
RUN_BUDGET_INI = "backendconf_minify_run_budget"


def run_budget_choice(config: pytest.Config) -> float | None:
    """``--backendconf-minify-run-budget``, else the ini option, else ``$BACKENDCONF_MINIFY_RUN_BUDGET``, else 300.

    :returns: seconds, or None for no limit (``0``).
    :raises pytest.UsageError: a value that is not a number of seconds >= 0, naming where it came from.
    """
    value, where, _ = setting(config, RUN_BUDGET_INI, RUN_BUDGET_ENV)
    if value is None:
        return DEFAULT_RUN_BUDGET
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise pytest.UsageError(
            f"{where}: give the seconds a run may spend on minimal reproductions, e.g. 300 (0: no limit)"
        )
    return seconds or None


class MinifyLedger:
    """What the run spent on minimal reproductions and which failure groups have one.

    :param path: the shared account's file (pytest-xdist workers name the same one), or None: this process only.
    :param budget: seconds for the whole run; None: no limit.
    """

    def __init__(self, path: Path | None, budget: float | None) -> None:
        self.path = path
        self.budget = budget
        self._mine: dict[str, Any] = {"spent": 0.0, "groups": {}}
        self._lock = threading.Lock()

    def claim(self, group: str, check_id: str) -> tuple[str, Any]:
        """``("shrink", seconds left or None)``, ``("same", the group's first check and record)`` or ``("spent", None)``.

        A ``shrink`` claims the group for ``check_id``: another failure of the group is then ``same``.
        """
        with self._account() as account:
            found = account["groups"].get(group)
            if found is not None:
                return "same", found
            left = None if self.budget is None else self.budget - account["spent"]
            if left is not None and left <= 0:
                return "spent", None
            account["groups"][group] = {"check": check_id, "record": None}
            return "shrink", left

    def done(self, group: str, record: dict[str, Any], seconds: float) -> None:
        """Count ``seconds`` against the budget and keep the group's record for its later failures."""
        with self._account() as account:
            account["spent"] += seconds
            entry = account["groups"].setdefault(group, {"check": "", "record": None})
            entry["record"] = record

    @contextlib.contextmanager
    def _account(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            if self.path is None:
                yield self._mine
                return
            try:
                import fcntl
            except ImportError:  # pragma: no cover - Windows: this process's account
                yield self._mine
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                handle = open(self.path, "a+", encoding="utf-8")
            except OSError:  # an unwritable temporary folder: this process's account
                yield self._mine
                return
            with handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                try:
                    handle.seek(0)
                    text = handle.read()
                    try:
                        account = json.loads(text) if text else {"spent": 0.0, "groups": {}}
                    except ValueError:  # written by nothing but this class; a torn file starts afresh
                        account = {"spent": 0.0, "groups": {}}
                    yield account
                    handle.seek(0)
                    handle.truncate()
                    handle.write(json.dumps(account))
                    handle.flush()
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
