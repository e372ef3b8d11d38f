"""The operator × dtype matrix of the ``ops`` category, its summary line and capability declaration.

Built from the tests of a run (`ReportTest`: the JSON report's ``tests``), so the same
code serves the terminal summary, the report's ``ops`` section and
``backendconf report ops REPORT.json --capabilities``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping

from ._record import BREAKING, SKIPS, ReportTest

#: Every dtype the ops category knows, in column order.
DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
#: The integer dtypes of the quantize/dequantize overloads' checks: columns of a matrix that has them.
QUANTIZED_DTYPES = ("int8", "uint8")
PASSED, UNSUPPORTED, FAILED, NOT_UNDER_TEST = "passed", "unsupported", "failed", "not under test"
#: A cell whose failures are all listed known failures: the run is green, the operator still fails there.
KNOWN_FAILURE = "known failure"
#: The cells in which an overload does not work: left out of the declaration, flagged when declared.
NOT_PASSING = (FAILED, KNOWN_FAILURE, UNSUPPORTED)
#: An operator overload's name, ``namespace.op.overload``: the only names the declaration prints.
OVERLOAD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
_ID = re.compile(
    rf"^(?:backendconf::)?ops::(?P<overload>{OVERLOAD_NAME.pattern})\[(?P<dtype>[a-z0-9]+)-(?:sample|long)(?P<k>\d{{1,6}})\]$"
)


_OPS_CHECK = re.compile(r"^(?:backendconf::)?ops::")


def parse_id(test_id: str) -> tuple[str, str, int] | None:
    """``("aten.add.Tensor", "float16", 0)`` for ``backendconf::ops::aten.add.Tensor[float16-sample0]``.

    None for an id that is not an ops check's, or whose overload is not a valid overload name (a
    forged id in a report never reaches the matrix, nor the declaration pasted into code).
    """
    match = _ID.match(test_id)
    return (match["overload"], match["dtype"], int(match["k"])) if match else None


def _cell(outcomes: list[str]) -> str:
    if any(o in BREAKING for o in outcomes):  # an unexpected pass is an entry that is out of date
        return FAILED
    if "known_failure" in outcomes:
        return KNOWN_FAILURE
    if any(o in SKIPS for o in outcomes):
        return UNSUPPORTED
    return PASSED


def ops_matrix(tests: Iterable[ReportTest], declared: Iterable[str] | None = None) -> dict[str, Any] | None:
    """The ``ops`` section of the JSON report from its tests (``None``: no ops checks ran).

    ``overloads`` maps overload → dtype → passed / unsupported / failed /
    known failure (every failure of the cell listed) / not under test; an overload is *fully supported* when every dtype it was
    tested in passed.
    """
    from ._counts import category_counts

    outcomes: dict[str, dict[str, list[str]]] = {}
    ops_tests = []
    for test in tests:
        if not _OPS_CHECK.match(test.id):
            continue
        # Every ops check counts; a single-op quantized program (``aten.conv2d.default[int8-static-per-tensor]``)
        # is no cell of its own in the matrix.
        ops_tests.append(dataclasses.replace(test, category="ops"))
        parsed = parse_id(test.id)
        if parsed is None:
            continue
        overload, dtype, _ = parsed
        outcomes.setdefault(overload, {}).setdefault(dtype, []).append(test.outcome)
    if not outcomes:
        return None
    # The same counts as the report's summary.ops (a known failure is never counted as failed).
    counts = category_counts(ops_tests)["ops"]
    seen = {d for cells in outcomes.values() for d in cells}
    columns = DTYPES + tuple(d for d in QUANTIZED_DTYPES if d in seen)
    overloads = {
        name: {d: _cell(cells[d]) if d in cells else NOT_UNDER_TEST for d in columns}
        for name, cells in sorted(outcomes.items())
    }
    full = sorted(n for n, row in overloads.items() if all(v in (PASSED, NOT_UNDER_TEST) for v in row.values()))
    declared_set = set(declared or ())
    return {
        "dtypes": list(columns),
        "checks": counts,
        "overloads_total": len(overloads),
        "overloads_fully_supported": len(full),
        "fully_supported": full,
        "declared_but_not_passing": sorted(
            n for n in declared_set & set(overloads) if any(v in NOT_PASSING for v in overloads[n].values())
        ),
        "overloads": overloads,
    }


def summary_line(matrix: Mapping[str, Any]) -> str:
    """``ops  412/530 passed; 96 unsupported, 0 known failures, 22 failed — 131 of 164 overloads fully supported``."""
    from ._counts import outcome_parts
    from ._words import counted

    c = matrix["checks"]
    return (
        f"ops  {c[PASSED]}/{c['total']} passed; {', '.join(outcome_parts(c))} — "
        f"{matrix['overloads_fully_supported']} of {counted(matrix['overloads_total'], 'overload')} fully supported"
    )


def capabilities_text(matrix: Mapping[str, Any]) -> str:
    """A ready-to-paste ``Capabilities(supported_ops=...)`` of the overloads that passed in every dtype tested."""
    lines = ["Capabilities(supported_ops={"]
    # Only overload names (letters, digits, _ and two dots): nothing read from a report becomes code.
    lines += [f'    "{name}",' for name in matrix["fully_supported"] if OVERLOAD_NAME.fullmatch(name)]
    lines.append("})")
    partial = [
        (name, [d for d, v in row.items() if v in NOT_PASSING])
        for name, row in matrix["overloads"].items()
        if name not in matrix["fully_supported"] and any(v == PASSED for v in row.values())
    ]
    if partial:
        lines.append("# left out, passing in some dtypes only (failed or unsupported in the others):")
        lines += [f"#   {name}: not in {', '.join(dtypes)}" for name, dtypes in partial]
    return "\n".join(lines)


def flagged_lines(matrix: Mapping[str, Any]) -> list[str]:
    """The overloads a backend declares in ``supported_ops`` but fails or rejects, one line."""
    flagged = matrix.get("declared_but_not_passing") or []
    if not flagged:
        return []
    return [f"ops  declared in Capabilities.supported_ops but failed or rejected: {', '.join(flagged)}"]


def matrix_text(matrix: Mapping[str, Any]) -> str:
    """The matrix as a table: one row per overload, one column per dtype."""
    marks = {PASSED: "pass", UNSUPPORTED: "unsup", FAILED: "FAIL", KNOWN_FAILURE: "known failure", NOT_UNDER_TEST: "-"}
    width = max([len("overload")] + [len(n) for n in matrix["overloads"]])
    columns = [d for d in matrix.get("dtypes") or DTYPES if d in DTYPES + QUANTIZED_DTYPES]
    shown = [marks.get(v, "-") for row in matrix["overloads"].values() for v in row.values()]
    cell = max([8, *map(len, shown)])  # wide enough for "known failure" when a cell says it
    lines = [f"{'overload':<{width}}  " + "  ".join(f"{d:>{cell}}" for d in columns)]
    for name, row in matrix["overloads"].items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{marks.get(row.get(d), '-'):>{cell}}" for d in columns))
    lines.append(summary_line(matrix))
    return "\n".join(lines)
