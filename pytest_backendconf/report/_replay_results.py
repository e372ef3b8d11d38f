"""Replayed bundles as report entries: category ``replay``, one test per bundle.

``backendconf replay --report`` and the suite's ``--backendconf-replay-on-target``
both record a replay here, so that a bundle has the same id, fields and
outcome wherever it was replayed.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ._record import ReportTest

CATEGORY = "replay"


def replay_test_id(result: Any) -> str:
    """``backendconf::replay::<archive stem>.<method>[<n>]`` of a `target.BundleResult`."""
    return f"backendconf::{CATEGORY}::{archive_stem(result.archive)}.{result.method}[{result.index}]"


def archive_stem(path: str) -> str:
    name = os.path.basename(path)
    return name[: -len(".bcpt")] if name.endswith(".bcpt") else name


def replay_test_results(results: Sequence[Any]) -> list[ReportTest]:
    """One `ReportTest` per `target.BundleResult`."""
    return [
        ReportTest(
            id=replay_test_id(r),
            category=CATEGORY,
            case=archive_stem(r.archive),
            stage="execute",
            reproduce=f"backendconf replay {r.archive}",
            outcome=r.outcome,
            verdict=r.outcome,  # no known failures apply to a replay
            duration=r.duration,
            error=r.error,
            details={
                "archive": r.archive,
                "method": r.method,
                "bundle": r.index,
                "check": r.check,
                **({"numerics": r.numerics} if r.numerics is not None else {}),
            },
            # A bundle's comparison is its check: it passed or failed (an error is the archive's, not the check's).
            check_outcome=r.outcome if r.outcome in ("passed", "failed") else None,
        )
        for r in results
    ]
