"""A check's outcome as a record: what the backend host sends back, and what a batch decides.

Below the host (`_host`) and the categories (the ops category's batches make
their members' outcomes here too), so that an outcome decided in a batch is
built exactly as the check run alone builds it.
"""

from __future__ import annotations

from typing import Any


def run_check(check: Any, ctx: Any) -> dict[str, Any]:
    """Run one check here; its outcome as the report needs it (the same in the pytest process and the host)."""
    import pytest

    from ..target import error_record
    from ..report import CheckFailed, Unsupported

    try:
        details = check.run(ctx)
    except Unsupported as exc:
        return {"outcome": "unsupported", "message": str(exc)}
    except pytest.skip.Exception as exc:
        return {"outcome": "skipped", "message": str(exc.msg)}
    except CheckFailed as exc:
        details = exc.details if isinstance(exc.details, dict) else None
        return {
            "outcome": "failed",
            "message": str(exc),
            "error": error_record(exc),
            **({"details": details} if details else {}),
        }
    except Exception as exc:
        info = pytest.ExceptionInfo.from_exception(exc)
        return {
            "outcome": "failed",
            "message": str(info.getrepr(style="short", chain=True)),
            "error": error_record(exc),
        }
    # A check may return details for the report (delegation's node counts); they are JSON data.
    return {"outcome": "passed", **({"details": details} if isinstance(details, dict) else {})}
