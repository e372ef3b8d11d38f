"""The text a failed check shows for an exception that is not a `CheckFailed`: one block a vendor can act on.

A backend's error reaches the check through the suite's own modules (the
lowered module, the method checks, Hypothesis, pytest), and Python's
traceback of it runs through all of them, chained two or three times. The
vendor needs what went wrong and where in *their* code: this text keeps the
exception's own message (a symbolicated `BackendRuntimeError` names the
node and the model's source line) and the backend's frames of the error's
origin, and leaves out the suite's frames, the chain's "direct cause"
banners and the advice Hypothesis appends (``@reproduce_failure`` on a
function the vendor cannot edit): the item adds the suite's own reproduce
line instead.

An exception with no frame outside the suite that is not one of the
package's own errors is a fault of the suite, not of the backend: it keeps
pytest's whole traceback, so that the fault can be found.
"""

from __future__ import annotations

import contextlib
import traceback
from types import TracebackType
from typing import Iterator

import pytest

from ..checks import CheckFailed
from ..errors import BackendConfError

#: Module prefixes of the suite's own frames (the reference backend is a backend: its frames stay).
_SUITE_MODULES = ("pytest_backendconf.", "hypothesis.", "_pytest.", "pytest.", "pluggy.", "_hypothesis_")
_BACKEND_MODULES = ("pytest_backendconf.reference.",)
#: Where a Hypothesis test body records how many notes its exception had when it left the body.
_OWN_NOTES = "_backendconf_own_notes"


def is_suite_frame(module: str) -> bool:
    """Whether a frame of this module belongs to the suite (dropped) rather than to the backend or the model."""
    name = module + "."
    return name.startswith(_SUITE_MODULES) and not name.startswith(_BACKEND_MODULES)


@contextlib.contextmanager
def notes_before_hypothesis(context: str = "") -> Iterator[None]:
    """Around a Hypothesis test body: the notes an exception leaves it with are its own.

    Hypothesis adds notes to the exception of the failing example after the
    body raised it (the failing call of the harness's function, and its
    advice); `failure_text` keeps only the notes counted here. ``context``
    (the inputs drawn, in words) is added to an exception that is not a
    `CheckFailed` (whose message says so itself).
    """
    try:
        yield
    except CheckFailed:
        raise
    except Exception as exc:
        notes = [*(getattr(exc, "__notes__", None) or ()), *([context] if context else [])]
        if context:
            vars(exc)["__notes__"] = notes  # what ``add_note`` does (3.11+), on every Python
        setattr(exc, _OWN_NOTES, len(notes))
        raise


def own_notes(exc: BaseException) -> list[str]:
    """The exception's notes, without those Hypothesis added after the test body (`notes_before_hypothesis`)."""
    notes = [str(n) for n in getattr(exc, "__notes__", None) or ()]
    count = getattr(exc, _OWN_NOTES, None)
    return notes if count is None else notes[:count]


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes, outermost first (as Python shows them, last)."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found and len(found) < 10:
        found.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return found


def _backend_frames(tb: TracebackType | None) -> traceback.StackSummary:
    frames = [
        (frame, line)
        for frame, line in traceback.walk_tb(tb)
        if not is_suite_frame(frame.f_globals.get("__name__", ""))
    ]
    return traceback.StackSummary.extract(iter(frames), capture_locals=False)


def _headline(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def failure_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """The failure block of a check that raised ``excinfo`` (not a `CheckFailed`: its message is its text)."""
    exc = excinfo.value
    chain = _chain(exc)
    # The error's origin: the innermost exception raised from the backend's own code.
    origin = next(((e, frames) for e in reversed(chain) if (frames := _backend_frames(e.__traceback__))), None)
    if origin is None and not isinstance(exc, BackendConfError):
        return str(excinfo.getrepr(style="short", chain=True))  # the suite's own fault: all of it
    lines = [_headline(exc), *own_notes(exc)]
    if origin is not None:
        cause, frames = origin
        lines.append("where it was raised (most recent call last; the suite's own frames left out):")
        lines += [line.rstrip("\n") for line in frames.format()]
        if cause is not exc:  # the backend's own exception, under the suite's symbolicated one
            lines.append(_headline(cause))
    return "\n".join(lines)


def failure_text_of(exc: BaseException) -> str:
    """`failure_text` of an exception being handled (its traceback attached)."""
    return failure_text(pytest.ExceptionInfo.from_exception(exc))
