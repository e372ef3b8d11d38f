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


#: How a reference blob names its tanh instruction (length-prefixed, so not hardtanh's).
_TANH = (4).to_bytes(4, "little") + b"tanh"
#: Handles of methods whose graph holds aten.tanh (kept, so that an id is never reused for another).
_TANH_HANDLES: dict[int, object] = {}


class HangsOnTanh(ReferenceBackend):
    """Never returns from execute() of a method whose graph holds ``aten.tanh``: a device that hangs on one op.

    Every other graph runs as on the reference backend, so only the checks of the models (and the
    operator samples) with a tanh hang.
    """

    name = "hangs_on_tanh"

    def compile(self, processed, method_compile_spec):
        handles = super().compile(processed, method_compile_spec)
        for method, blob in processed.items():
            if _TANH in bytes(blob):
                _TANH_HANDLES[id(handles[method])] = handles[method]
        return handles

    def execute(self, handle, inputs):
        if id(handle) in _TANH_HANDLES:
            while True:
                time.sleep(60)
        return super().execute(handle, inputs)
