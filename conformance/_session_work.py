"""What the session's extra process is handed: archives to load on the target, cases to lower afresh.

`_extra_process` runs the process (`session`); the availability and
serialization categories hand it work. They import the records from here,
so no category imports another's internals, and a category offers the work
it already has at hand through `offer_at_hand` instead of being imported by
the process's owner.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from pytest_backendconf import lowering as _lowering
from pytest_backendconf._compat import tree_structure
from pytest_backendconf.errors import BackendUnavailableWarning

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext


@dataclasses.dataclass
class Scenario:
    """Target phase: load one archive with the backend or a stand-in, then make the calls."""

    key: str
    archive: str
    calls: dict[str, list[tuple[tuple, dict]]]
    #: `StandIn` options, or None for the backend itself.
    stand_in: dict | None = None
    #: The availability row the stand-in simulates, for its messages.
    row: str = ""
    #: May take the process down (a blob that is not ready): run after every other scenario.
    last: bool = False


@dataclasses.dataclass
class Lowering:
    """Host phase: lower one case again as a fresh process does; write its archive."""

    key: str
    case: str
    dtype: str
    spec: dict


#: What a category can hand the session's first extra process without lowering anything here.
AtHand = Callable[[Any, str], "tuple[list[Scenario], list[Lowering]]"]
_AT_HAND: list[AtHand] = []


def offer_at_hand(provider: AtHand) -> AtHand:
    """Register ``provider(ctx, asking)``: what a session's extra process can carry when category ``asking`` first needs it."""
    _AT_HAND.append(provider)
    return provider


def items_at_hand(ctx: SuiteContext, asking: str) -> tuple[list[Scenario], list[Lowering]]:
    """Every registered category's work at hand when category ``asking`` first needs the process."""
    scenarios: list[Scenario] = []
    lowerings: list[Lowering] = []
    for provider in _AT_HAND:
        more, fresh = provider(ctx, asking)
        scenarios += more
        lowerings += fresh
    return scenarios, lowerings


class FreshLowerer:
    """In the extra process's host phase: lower cases as a fresh process does.

    Debug handles are part of an archive and numbered per lowering, so the
    whole archive must come out the same byte for byte as the suite's own
    lowering of the case, whatever either process lowered before.
    """

    def __init__(self, registered: Any, backend_version: str | None, registry: Any) -> None:
        import tempfile

        from pytest_backendconf.suite import SuiteContext

        from ._zoo_loader import load_zoo

        self.registered = registered
        self.backend_version = backend_version
        extra = registry.cases() if registry is not None else []
        self.ctx = SuiteContext(
            registered, load_zoo() + extra, tmp_dir=lambda name: Path(tempfile.mkdtemp(prefix=name))
        )

    def lower(self, item: dict, workdir: str) -> dict:
        from pytest_backendconf.lowering import lower_programs

        case, dtype, ctx = item["case"], item["dtype"], self.ctx
        try:
            programs = {m: ctx.program(case, dtype, m) for m in item["spec"]}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BackendUnavailableWarning)
                lowered = lower_programs(
                    programs,
                    self.registered.backend,
                    item["spec"],
                    module_type=type(ctx.module(case, dtype)),
                    backend_version=self.backend_version,
                )
            path = os.path.join(workdir, f"fresh-{case}.bcpt")
            with open(path, "wb") as f:
                f.write(_lowering.to_bytes(lowered))
            return {"archive": path}
        except Exception as exc:
            return {"error": {"type": type(exc).__name__, "message": str(exc)}}


_DIRECTORIES: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_DIRECTORIES_LOCK = threading.Lock()


def archive_directory(ctx: SuiteContext) -> str:
    """The session's folder for the archives the target process loads."""
    with _DIRECTORIES_LOCK:
        if ctx not in _DIRECTORIES:
            _DIRECTORIES[ctx] = str(ctx.tmp_dir("serialization-archives"))
        return _DIRECTORIES[ctx]


def same_outputs(actual: Any, expected: Any, *, rtol: float = 0.0, atol: float = 0.0) -> str | None:
    """None if equal (same structure, dtypes, values; NaN equal to NaN), else why not."""
    if tree_structure(actual) != tree_structure(expected):
        return f"output structure {tree_structure(actual)} instead of {tree_structure(expected)}"
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        return str(exc)
    return None
