"""What the serialization checks share: their records, each session's saved lowerings, the archives the target loads.

`serialization` (each case's shared lowering) and `_dynamic_archives` (its
dynamic-shape lowering) both save a lowering once per session, compare the
module loaded from its archive with it, and hand the archive to the suite's
extra process to load on the target.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from pytest_backendconf.checks import Check

from .._session_work import Scenario, archive_directory

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

_Saved = TypeVar("_Saved")


def serialization_check(check: Any, case: str, dtype: str, stage: str) -> Check:
    """The record of ``check(ctx, case=..., dtype=...)``: ``serialization::<name without check_>[<case>]``."""
    return Check(
        "serialization",
        f"{check.__name__.removeprefix('check_')}[{case}]",
        functools.partial(check, case=case, dtype=dtype),
        stage=stage,
        case=case,
    )


class SavedLowerings(Generic[_Saved]):
    """Per session, each case's saved lowering, made once: checks may run in threads and share it."""

    def __init__(self) -> None:
        self._sessions: "weakref.WeakKeyDictionary[Any, dict[str, _Saved]]" = weakref.WeakKeyDictionary()
        #: Held while one is made, and while a category places their archives in the extra process.
        self.lock = threading.RLock()

    def get(self, ctx: SuiteContext, case: str, save: Callable[[], _Saved]) -> _Saved:
        """The case's saved lowering, ``save()`` the first time (an exception it raises is not kept)."""
        with self.lock:
            done = self._sessions.setdefault(ctx, {})
            if case not in done:
                done[case] = save()
            return done[case]

    def of(self, ctx: SuiteContext) -> dict[str, _Saved]:
        """The session's lowerings saved so far, by case."""
        return self._sessions.get(ctx, {})


def target_scenario(
    ctx: SuiteContext, key: str, file_name: str, data: bytes, calls: dict[str, list[tuple[tuple, dict]]]
) -> Scenario:
    """Write the archive ``data`` into the session's folder; the scenario that loads it and makes ``calls`` there."""
    path = os.path.join(archive_directory(ctx), file_name)
    with open(path, "wb") as f:
        f.write(data)
    return Scenario(key, path, calls)
