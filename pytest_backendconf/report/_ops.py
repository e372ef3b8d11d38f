"""The operator × dtype matrix of the ``ops`` category, its summary line and capability declaration.

Built from the results of a run (the JSON report's ``tests``), so the same
code serves the terminal summary, the report's ``ops`` section and
``backendconf report ops REPORT.json --capabilities``.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

#: Every dtype the ops category knows, in column order.
DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
PASSED, UNSUPPORTED, FAILED, NOT_UNDER_TEST = "passed", "unsupported", "failed", "not under test"
#: Report outcomes that count as a failure of a cell.
_FAILING = ("failed", "error", "known_failure", "unexpected_pass")
_ID = re.compile(r"^(?:backendconf::)?ops::(?P<overload>[^\[]+)\[(?P<dtype>[a-z0-9]+)-(?:sample|long)(?P<k>\d+)\]$")


def parse_id(test_id: str) -> tuple[str, str, int] | None:
    """``("aten.add.Tensor", "float16", 0)`` for ``backendconf::ops::aten.add.Tensor[float16-sample0]``."""
    match = _ID.match(test_id)
    return (match["overload"], match["dtype"], int(match["k"])) if match else None


def _cell(outcomes: list[str]) -> str:
    if any(o in _FAILING for o in outcomes):
        return FAILED
    if any(o in ("unsupported", "skipped") for o in outcomes):
        return UNSUPPORTED
    return PASSED


def ops_matrix(tests: Iterable[Mapping[str, Any]], declared: Iterable[str] | None = None) -> dict[str, Any] | None:
    """The ``ops`` section of the JSON report from its ``tests`` entries (``None``: no ops checks ran).

    ``overloads`` maps overload → dtype → passed / unsupported / failed /
    not under test; an overload is *fully supported* when every dtype it was
    tested in passed.
    """
    outcomes: dict[str, dict[str, list[str]]] = {}
    counts = {"total": 0, PASSED: 0, UNSUPPORTED: 0, FAILED: 0}
    for test in tests:
        parsed = parse_id(str(test.get("id", "")))
        if parsed is None or test.get("outcome") is None:
            continue
        overload, dtype, _ = parsed
        outcome = test["outcome"]
        outcomes.setdefault(overload, {}).setdefault(dtype, []).append(outcome)
        counts["total"] += 1
        counts[_cell([outcome])] += 1
    if not outcomes:
        return None
    overloads = {
        name: {d: _cell(cells[d]) if d in cells else NOT_UNDER_TEST for d in DTYPES}
        for name, cells in sorted(outcomes.items())
    }
    full = sorted(n for n, row in overloads.items() if all(v in (PASSED, NOT_UNDER_TEST) for v in row.values()))
    declared_set = set(declared or ())
    return {
        "dtypes": list(DTYPES),
        "checks": counts,
        "overloads_total": len(overloads),
        "overloads_fully_supported": len(full),
        "fully_supported": full,
        "declared_but_not_passing": sorted(
            n for n in declared_set & set(overloads) if any(v in (FAILED, UNSUPPORTED) for v in overloads[n].values())
        ),
        "overloads": overloads,
    }


def summary_line(matrix: Mapping[str, Any]) -> str:
    """``ops  412/530 passed; 96 unsupported; 22 failed — 131 of 164 overloads fully supported``."""
    c = matrix["checks"]
    return (
        f"ops  {c[PASSED]}/{c['total']} passed; {c[UNSUPPORTED]} unsupported; {c[FAILED]} failed — "
        f"{matrix['overloads_fully_supported']} of {matrix['overloads_total']} overloads fully supported"
    )


def capabilities_text(matrix: Mapping[str, Any]) -> str:
    """A ready-to-paste ``Capabilities(supported_ops=...)`` of the overloads that passed in every dtype tested."""
    lines = ["Capabilities(supported_ops={"]
    lines += [f'    "{name}",' for name in matrix["fully_supported"]]
    lines.append("})")
    partial = [
        (name, [d for d, v in row.items() if v in (FAILED, UNSUPPORTED)])
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


def read_matrix(path: str) -> dict[str, Any]:
    """The ops matrix of a ``--backendconf-report`` file; `ReportError` names the file and the fix."""
    import json
    from pathlib import Path

    from ..errors import ReportError

    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"cannot read report {path!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ReportError(f"report {path!r} is not JSON ({exc}); pass the file --backendconf-report wrote") from None
    if not isinstance(document, dict) or document.get("schema") != "backendconf-report":
        raise ReportError(f"{path!r} is not a backendconf report; pass the file --backendconf-report wrote")
    tests = document.get("tests")
    matrix = ops_matrix(tests if isinstance(tests, list) else [])
    if matrix is None:
        raise ReportError(
            f"report {path!r} has no ops checks: run the suite with the ops category "
            f"(e.g. `pytest --backend=NAME -m ops --backendconf-report={path}`)"
        )
    return matrix


def matrix_text(matrix: Mapping[str, Any]) -> str:
    """The matrix as a table: one row per overload, one column per dtype."""
    marks = {PASSED: "pass", UNSUPPORTED: "unsup", FAILED: "FAIL", NOT_UNDER_TEST: "-"}
    width = max([len("overload")] + [len(n) for n in matrix["overloads"]])
    lines = [f"{'overload':<{width}}  " + "  ".join(f"{d:>8}" for d in DTYPES)]
    for name, row in matrix["overloads"].items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{marks[row[d]]:>8}" for d in DTYPES))
    lines.append(summary_line(matrix))
    return "\n".join(lines)
