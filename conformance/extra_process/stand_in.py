"""The stand-in: a copy of the vendor's backend that forces an availability row's condition and counts calls.

The availability category puts each row of ``availability.toml`` into effect
with one, on the host and (in the suite's extra process) on the target.
"""

from __future__ import annotations

import collections
import copy
import functools
from typing import Any

from pytest_backendconf.checks import fail


class StandIn:
    """A copy of ``backend`` that forces availability conditions and counts calls.

    The copy's class is a subclass of the backend's own, so the backend's own
    code sees the forced answers too (a ``preprocess`` that asks
    ``self.is_available()`` gets the simulated answer). Objects whose class
    cannot be swapped get a delegating proxy with the same name and methods.

    :param available: ``True``, ``False``, or ``"backend"`` (ask the backend).
    :param compile: ``"backend"`` or ``"fails"``; so is ``execute``.
    """

    def __init__(
        self,
        backend: Any,
        *,
        available: Any = "backend",
        compile: str = "backend",
        execute: str = "backend",
        row: str = "",
    ) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.row = row
        base = type(backend)
        stand = self

        def is_available(this: Any) -> Any:
            stand.calls["is_available"] += 1
            return base.is_available(this) if available == "backend" else available

        def compile_(this: Any, processed: dict, method_compile_spec: dict) -> Any:
            stand.calls["compile"] += 1
            if compile == "fails":
                raise RuntimeError(stand.simulated("compile()"))
            return base.compile(this, processed, method_compile_spec)

        def execute_(this: Any, handle: Any, inputs: list) -> Any:
            stand.calls["execute"] += 1
            if execute == "fails":
                raise RuntimeError(stand.simulated("execute()"))
            return base.execute(this, handle, inputs)

        def unavailable_reason(this: Any) -> str:
            if available is False:
                return f"simulated by pytest-backendconf for availability row {row}"
            explain = getattr(base, "unavailable_reason", None)
            return explain(this) if callable(explain) else ""

        overrides = {
            "is_available": is_available,
            "compile": compile_,
            "execute": execute_,
            "unavailable_reason": unavailable_reason,
        }
        try:
            # __slots__ = () keeps the layout, so __class__ can be assigned.
            cls = type(base.__name__, (base,), {**overrides, "__slots__": (), "__module__": base.__module__})
            obj = copy.copy(backend)
            obj.__class__ = cls
        except Exception:  # slots, metaclasses, uncopyable state: fall back to delegating
            obj = _Delegate(backend, overrides)
        self.backend = obj

    def simulated(self, what: str) -> str:
        return f"simulated by pytest-backendconf: {what} cannot work here (availability row {self.row})"

    def expect_no_calls(self, where: str, *methods: str) -> None:
        called = {m: self.calls[m] for m in methods if self.calls[m]}
        if called:
            fail(
                f"{where}: {', '.join(f'{m}() was called {n} time(s)' for m, n in called.items())} although "
                "is_available() returned False; docs/backend-contract.md#availability forbids calling them then"
            )


class _Delegate:
    """The stand-in for a backend whose class cannot be subclassed in place."""

    def __init__(self, backend: Any, overrides: dict[str, Any]) -> None:
        self._backend = backend
        self.name = backend.name
        self.capabilities = getattr(backend, "capabilities", None)
        for name, function in overrides.items():
            setattr(self, name, functools.partial(function, backend))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
