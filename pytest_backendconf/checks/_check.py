"""What a conformance check is: the `Check` record, the exceptions it raises, and its stable id.

The category modules in ``conformance/`` build `Check` records and raise
`CheckFailed` or `Unsupported`; the pytest side (`suite._suite`) turns the records
into items. This module sits below both, so neither imports the other's
callers, and it never imports torch.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
from typing import Any, Callable, Generic

from ._context import ContextT

#: The categories of the suite, in the order they run; each is also a pytest marker.
CATEGORIES = (
    "contract",
    "parity",
    "availability",
    "serialization",
    "symbolication",
    "reliability",
    "delegation",
    "ops",
    "quantized",
)
#: The first part of every conformance check's id.
ROOT_ID = "backendconf"
#: Stages that only lower (export, preprocess) or ask the backend about itself: they run where the
#: backend is not available too (``is_available()`` False); every other stage needs it available.
LOWERING_STAGES = frozenset({"declaration", "is_available", "preprocess", "lowering"})


@dataclasses.dataclass(frozen=True)
class Batching(Generic[ContextT]):
    """How a check may share one lowering with others of its category (`suite._batching`).

    :param group: checks of one group may be lowered together (the ops category: the sample's dtype).
    :param member: distinct within a batch (the ops category: the op's name, which its node keeps).
    :param item: what `run` needs to find the check's work (the ops category: the sample's number); this
        room does not look into it.
    :param run: ``run(ctx, checks)`` lowers the checks as one and returns ``{"decided": {id: outcome},
        "alone": [id, …], "split": [id, …]}``: outcomes (`outcome_to_json` of the `CheckOutcome` the check
        run alone gives), the checks
        that must run alone, and those to try again in smaller batches.
    """

    group: str
    member: str
    item: Any
    run: Callable[[ContextT, list[Check[ContextT]]], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Check(Generic[ContextT]):
    """One generated test, generic in the context its ``run`` takes (a `CheckContext`).

    :param category: one of `CATEGORIES`; also the pytest marker.
    :param name: unique within the category, e.g. ``small_cnn[float16]``.
    :param run: called with the `SuiteContext`; raises `CheckFailed`
        (or any exception) to fail, `Unsupported` to report "unsupported",
        `NotNeeded` when there is nothing to check (counted apart from the score).
        It may return a JSON-compatible dict of details, kept in the report
        (``{"numerics": ...}`` of a comparison, passes included).
    :param stage: the part of the contract it exercises (``preprocess``,
        ``compile``, ``execute``, ``load``, ``target`` …), for the report.
    """

    category: str
    name: str
    run: Callable[[ContextT], object]
    stage: str
    case: str | None = None
    #: Whether the check needs ``is_available()`` True; ``None``: decided by `stage` (`LOWERING_STAGES`).
    needs_available: bool | None = None
    #: Whether it draws inputs from the session's Hypothesis seed: its reproduce command then names the seed.
    draws_inputs: bool = False
    #: How it may share its lowering with other checks (`Batching`); None: it always runs alone.
    batch: Batching[ContextT] | None = None

    @property
    def id(self) -> str:
        """``parity::small_cnn[float16]``: the id the backend host knows the check by."""
        return f"{self.category}::{self.name}"

    def requires_available(self) -> bool:
        return self.needs_available if self.needs_available is not None else self.stage not in LOWERING_STAGES

    def location(self) -> tuple[str, int]:
        """``("pytest_backendconf/conformance/parity.py", line)``: where the check's code is (0-based line)."""
        function = inspect.unwrap(getattr(self.run, "func", self.run))  # through functools.partial
        code = getattr(function, "__code__", None)
        module = getattr(function, "__module__", None)
        if code is None or not module:
            return f"{ROOT_ID}/{self.category}", 0
        return module.replace(".", "/") + ".py", code.co_firstlineno - 1


class CheckFailed(AssertionError):
    """A conformance check failed; the message says what the backend did and what was expected.

    ``details``: data for the JSON report, as a passing check returns it (the
    numerics of a failed comparison). ``rerun``: the command that reruns
    this one comparison on the inputs the check saved, for the report.
    ``error_record``: ``{type, module, message}`` of the error the failure
    reports (an `OutputSpecError` of the backend's outputs), which the report
    keeps as the failure's error; None: the failure is the check's own.
    """

    def __init__(
        self,
        *args: object,
        details: dict | None = None,
        rerun: str | None = None,
        error_record: dict[str, str] | None = None,
    ) -> None:
        super().__init__(*args)
        self.details = details
        self.rerun = rerun
        self.error_record = error_record


class Unsupported(Exception):
    """The backend rejected the model (`UnsupportedNodeError`): counted apart, never as a pass."""

    #: Whether the backend's `UnsupportedNodeError` made it (a compile error's "not claimed" verdict,
    #: which the report counts), rather than the suite's own reading of a declaration.
    rejected: bool = False

    @classmethod
    def from_rejection(cls, exc: Exception) -> "Unsupported":
        """``The node of aten::mul is not supported in this compiler (reason) at models.py:12``."""
        first = str(exc).splitlines()[0].removesuffix(" Source code:").rstrip(".")
        reason = getattr(exc, "reason", "")
        info = getattr(exc, "debug_info", None)
        where = f" at {info.file}:{info.line}" if info is not None and info.file else ""
        made = cls(first + (f" ({reason})" if reason else "") + where)
        made.rejected = True
        return made


def fail(message: str) -> None:
    raise CheckFailed(message)


def id_matches(name: str, pattern: str) -> bool:
    """Whether a check (``parity::x[float16]``, with or without ``backendconf::``) matches a
    selection or known-failure key.

    An exact id always matches itself: ``[float16]`` in an id is not an
    fnmatch character class. Otherwise the key is an fnmatch pattern, with or
    without the ``backendconf::`` prefix.
    """
    name = name.removeprefix(f"{ROOT_ID}::")
    full = f"{ROOT_ID}::{name}"
    if pattern in (full, name):
        return True
    return fnmatch.fnmatchcase(full, pattern) or fnmatch.fnmatchcase(name, pattern)
