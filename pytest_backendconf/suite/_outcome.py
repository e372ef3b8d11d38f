"""Where a check's `CheckOutcome` is made: `run_check`, the same in the pytest process, the host and a batch.

Below the host (`_host`) and the categories (the ops category's batches make
their members' outcomes here too), so that an outcome decided in a batch is
built exactly as the check run alone builds it. The item keeps the outcome
in its stash under `OUTCOME_KEY`, as pytest's skipping plugin keeps its
xfail verdict, for the gating plugin to read.
"""

from __future__ import annotations

import time

import pytest

from ..checks import Check, CheckFailed, CheckOutcome, ContextT, NotNeeded, Unsupported
from ..errors import CompilerError, UnsupportedNodeError
from ._failure_text import failure_text

#: The outcome of the check an item ran (or was decided for it); read by `_gating` when its report is made.
OUTCOME_KEY = pytest.StashKey[CheckOutcome]()


def run_check(check: Check[ContextT], ctx: ContextT) -> CheckOutcome:
    """Run one check here, on the context its ``run`` takes; its outcome as the report needs it.

    The raised exception stays on the outcome (``exception``, never serialized), so that the pytest
    process running a check itself can raise it again where the check raised it.
    """
    from ..target import error_record

    started = time.perf_counter()

    def took() -> float:
        return round(time.perf_counter() - started, 6)

    try:
        details = check.run(ctx)
    except Unsupported as exc:
        return CheckOutcome("unsupported", str(exc), details=_verdict_of(exc), seconds=took())
    except NotNeeded as exc:
        return CheckOutcome("not_needed", str(exc), seconds=took())
    except pytest.skip.Exception as exc:
        return CheckOutcome("skipped", str(exc.msg), seconds=took(), exception=exc)
    except CheckFailed as exc:
        details = exc.details if isinstance(exc.details, dict) else None
        rerun = exc.rerun if isinstance(exc.rerun, str) else None
        return CheckOutcome(
            "failed",
            str(exc),
            details={**(details or {}), **(_verdict_of(exc) or {})} or None,
            error=exc.error_record if isinstance(exc.error_record, dict) else error_record(exc),
            seconds=took(),
            rerun=rerun,
            exception=exc,
        )
    except Exception as exc:
        return CheckOutcome(
            "failed",
            failure_text(pytest.ExceptionInfo.from_exception(exc)),
            details=_verdict_of(exc),
            error=error_record(exc),
            seconds=took(),
            exception=exc,
        )
    # A check may return details for the report (delegation's node counts); they are JSON data.
    return CheckOutcome("passed", details=details if isinstance(details, dict) and details else None, seconds=took())


def compile_verdict(exc: BaseException | None) -> str | None:
    """Which of `COMPILE_VERDICTS` a check's exception came from (its causes followed); None: no compile error."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, Unsupported):
            if exc.rejected:
                return "unsupported"
        elif isinstance(exc, UnsupportedNodeError):
            return "unsupported"
        elif isinstance(exc, CompilerError):
            return "compiler_failure"
        elif getattr(exc, "compile_verdict", None) == "undecided":
            return "undecided"
        exc = exc.__cause__ or exc.__context__
    return None


def _verdict_of(exc: BaseException) -> dict[str, str] | None:
    verdict = compile_verdict(exc)
    return None if verdict is None else {"compile_error": verdict}
