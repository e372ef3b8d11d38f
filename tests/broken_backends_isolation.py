"""Backends that would take a whole pytest run down: each is the reference backend with one defect.

The suite runs its checks in a child process (the backend host), so each
of these fails the checks it was in and the run goes on (docs/isolation.md).
"""

from __future__ import annotations

import os
import time

from backendconf_reference import ReferenceBackend

_CALLS = {"execute": 0}
_KEPT: list = []


class ExitsOnThirdExecute(ReferenceBackend):
    """Ends its process on the third execute() of the process, as a segfaulting driver would."""

    name = "exits_on_third_execute"

    def execute(self, handle, inputs):
        _CALLS["execute"] += 1
        if _CALLS["execute"] == 3:
            os._exit(3)
        return super().execute(handle, inputs)


class HangsInExecute(ReferenceBackend):
    """Never returns from execute()."""

    name = "hangs_in_execute"

    def execute(self, handle, inputs):
        while True:
            time.sleep(60)


class Leaks8MBPerCall(ReferenceBackend):
    """Keeps 8 MB per execute() call, touched so that it is resident, never freed."""

    name = "leaks_8mb_per_call"

    def execute(self, handle, inputs):
        _KEPT.append(b"x" * (8 << 20))
        return super().execute(handle, inputs)
