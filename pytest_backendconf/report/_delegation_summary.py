"""The delegation category's line in the terminal summary.

``delegation  52/55 runs partially delegated; 1,710 of 2,044 nodes delegated
(83.7%)``: how much of the graphs a backend cannot run whole it still runs,
from the node counts each check returns. A backend that lowers every model
whole (the reference backend) needs no partial delegation, and the line says
so instead of counting those runs as passes.
"""

from __future__ import annotations

from typing import Any, Iterable

NOT_NEEDED = "not needed"


def delegation_line(results: Iterable[Any]) -> str | None:
    runs = [r for r in results if r.category == "delegation" and not r.id.split("::")[-1].startswith("target[")]
    if not runs:
        return None
    not_needed = [r for r in runs if r.outcome == "skipped" and (r.reason or "").startswith(NOT_NEEDED)]
    needed = [r for r in runs if r not in not_needed]
    if not needed:
        return f"{'delegation':<14} not needed: the backend lowers all {len(runs)} model runs whole"
    counts = [
        r.details["delegation"] for r in needed if r.outcome == "passed" and r.details and "delegation" in r.details
    ]
    delegated = sum(c["delegated"] for c in counts)
    total = sum(c["total"] for c in counts)
    share = f" ({100 * delegated / total:.1f}%)" if total else ""
    failing = {}
    for r in needed:
        if r.outcome not in ("passed", "skipped"):
            failing[r.outcome] = failing.get(r.outcome, 0) + 1
    rest = "".join(f", {n} {outcome.replace('_', ' ')}" for outcome, n in sorted(failing.items()))
    return (
        f"{'delegation':<14} {len(counts)}/{len(needed)} model runs partially delegated; "
        f"{delegated:,} of {total:,} nodes delegated{share}; {len(not_needed)} not needed (lowered whole){rest}"
    )
