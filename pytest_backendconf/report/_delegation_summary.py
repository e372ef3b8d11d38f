"""The delegation category's line in the terminal summary.

``delegation  52/55 passed (94.5%); 120 not needed (lowered whole); 1,710 of
2,044 nodes delegated (83.7%) in 50 model runs; …``: the score is the
category's (`category_counts`: passed over the checks that needed partial
delegation, as in the JSON and HTML reports), and the node counts each
passing model run returns say how much of the graphs a backend cannot run
whole it still runs. A backend that lowers every model whole (the reference
backend) needs no partial delegation, and the line says so instead of
counting those runs as passes.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ._counts import outcome_parts
from ._record import ReportTest
from ._words import counted

__all__ = ["delegation_line"]


def delegation_line(results: Iterable[ReportTest], counts: Mapping[str, Any]) -> str | None:
    """The line for ``counts`` (the category's `category_counts`), with the node counts of ``results``."""
    results = [r for r in results if r.category == "delegation"]
    if not results:
        return None
    runs = [r for r in results if not r.id.split("::")[-1].startswith("target[")]
    if not counts["scored"]:
        return f"{'delegation':<14} not needed: the backend lowers all {len(runs)} model runs whole"
    nodes = [r.details["delegation"] for r in runs if r.outcome == "passed" and r.details and "delegation" in r.details]
    delegated = sum(c["delegated"] for c in nodes)
    total = sum(c["total"] for c in nodes)
    share = f" ({100 * delegated / total:.1f}%)" if total else ""
    scored, passed = counts["scored"], counts["passed"]
    return (
        f"{'delegation':<14} {passed}/{scored} passed ({100 * passed / scored:.1f}%); "
        f"{counts['not_needed']} not needed (lowered whole); "
        f"{delegated:,} of {total:,} nodes delegated{share} in {counted(len(nodes), 'model run')}; "
        f"{', '.join(outcome_parts(counts))} — score = passed / all {scored} that needed partial delegation"
    )
