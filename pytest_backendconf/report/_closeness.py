"""The closeness distribution per category, for the HTML report.

Every comparison the suite makes records its closeness (error / allowed
error; below 1 is within the tolerance of the reference) in
``tests[].numerics``. A vendor reads at a glance how near the limit a
category runs: most checks far below 1 is comfortable, a cluster just
under 1 is one kernel change from failing, and checks at 1 or more passed
only by the three-way rule (no worse than eager PyTorch's own error).
"""

from __future__ import annotations

import html
import math
from typing import Iterable

from ._record import ReportTest

#: Upper bounds of the bins, and their labels.
BINS = ((0.1, "< 0.1"), (0.5, "0.1 – 0.5"), (1.0, "0.5 – 1"), (math.inf, "≥ 1"))


def _value(numerics: object) -> float | None:
    if not isinstance(numerics, dict):
        return None
    value = numerics.get("closeness")
    if not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)  # "inf" and "nan" are written as strings
    except (TypeError, ValueError):
        return None


def distribution(tests: Iterable[ReportTest]) -> dict[str, dict[str, list[int]]]:
    """category -> bin label -> [passed, failed] counts of the checks with numerics."""
    found: dict[str, dict[str, list[int]]] = {}
    for test in tests:
        value = _value((test.details or {}).get("numerics"))
        if value is None or math.isnan(value):
            continue
        label = next((label for bound, label in BINS if value < bound), BINS[-1][1])  # inf: the last bin
        counts = found.setdefault(test.category, {label: [0, 0] for _, label in BINS})
        counts[label][0 if test.outcome == "passed" else 1] += 1
    return found


def closeness_table(tests: Iterable[ReportTest]) -> str:
    """An HTML table: one row per category, one column per closeness bin (passed, and failed if any)."""
    found = distribution(tests)
    if not found:
        return ""
    head = "".join(f'<th scope="col">{html.escape(label)}</th>' for _, label in BINS)
    rows = []
    for category, counts in sorted(found.items()):
        cells = "".join(
            f"<td>{passed}" + (f' <span class="failed">({failed} failed)</span>' if failed else "") + "</td>"
            for passed, failed in (counts[label] for _, label in BINS)
        )
        rows.append(f'<tr><th scope="row">{html.escape(category)}</th>{cells}</tr>')
    return (
        '<table class="closeness"><caption>checks by closeness to the reference (error / allowed error; '
        "≥ 1 passes only when no worse than eager PyTorch's own error)</caption>"
        f'<thead><tr><th scope="col">category</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
