"""The conformance report's JSON document: its schema version, its sections and the score summary.

This module owns the ``backendconf-report`` document (documented in
``docs/ci-gating.md``): the pytest plugin and ``backendconf replay`` write it
with `report_document` from their tests (`ReportTest`, ``_record``), and
`read_report` (``_reading``) reads it back. It never imports torch at import
time.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..checks import CATEGORIES, COMPILE_VERDICTS
from ._counts import category_counts, non_strict_counts, outcome_parts
from ._machine import describe_machine
from ._record import ReportTest

if TYPE_CHECKING:
    from ._known_failures import KnownFailure
    from ..registry import RegisteredBackend

REPORT_SCHEMA = "backendconf-report"
#: (major, minor): a consumer accepts any minor version of the major it knows.
# 1.1: "ops" and tests[].numerics; 1.2: backend.capabilities, backend.not_under_test;
# 1.3: summary.<category>.not_needed and .scored (the score's denominator), ops.checks = summary.ops;
# tests[].reproduction (a failure's minimal reproduction); 1.4: tests[].check_outcome (the check's own
# verdict: not_needed counts from it, not from the reason's words); 1.5: run.shard (a --backendconf-shard
# run: its index, count and checks, and the collection's size and digest) and a joined report's run.shards;
# 1.7: tests[].rerun (every failure's rerun command: the saved comparison's, else the reproduce command);
# 1.8: tests[].verdict (the test's outcome before known failures applied: a gate judges it again from there);
# ops.samples (the count, digest and source of the sample set the ops checks were made from);
# 1.9: errors.compile_errors (compile errors by verdict, from tests[].details.compile_error) and every
# declared capability in backend.capabilities (dynamic_shapes, batch_ops, target_runtime_modules added)
REPORT_SCHEMA_VERSION = (1, 9)


def summarize(tests: Iterable[ReportTest], categories: Iterable[str] = CATEGORIES) -> dict[str, dict[str, Any]]:
    """Counts per outcome and the score of each category (`category_counts` of the tests)."""
    return category_counts(tests, categories)


def error_counts(tests: Iterable[ReportTest]) -> dict[str, Any]:
    """How many tests that did not work failed with each exception type, and in each stage."""
    by_type: dict[str, int] = {}
    by_stage: dict[str, int] = {}
    total = 0
    for test in tests:
        if not test.failing:
            continue
        total += 1
        by_stage[test.stage] = by_stage.get(test.stage, 0) + 1
        kind = str(test.error.get("type")) if test.error is not None else "unknown"
        by_type[kind] = by_type.get(kind, 0) + 1
    return {
        "total": total,
        "by_type": dict(sorted(by_type.items())),
        "by_stage": dict(sorted(by_stage.items())),
        "compile_errors": compile_error_counts(tests),
    }


def compile_error_counts(tests: Iterable[ReportTest]) -> dict[str, int]:
    """How many tests ended in a compile error of each verdict: the backend did not claim the node
    (``unsupported``), claimed it and its compiler failed (``compiler_failure``), or the harness could
    not tell (``undecided``: preprocess failed naming no node)."""
    counts = dict.fromkeys(COMPILE_VERDICTS, 0)
    for test in tests:
        verdict = (test.details or {}).get("compile_error")
        if verdict in counts:
            counts[verdict] += 1
    return counts


def compile_errors_line(counts: dict[str, int]) -> str | None:
    """``compile errors: 12 not claimed (unsupported), 3 compiler failures, 1 undecided …``; None when none."""
    if not any(counts.get(v, 0) for v in COMPILE_VERDICTS):
        return None
    failures = counts.get("compiler_failure", 0)
    return (
        f"compile errors: {counts.get('unsupported', 0)} not claimed by the backend (unsupported), "
        f"{failures} compiler failure{'s' if failures != 1 else ''} on claimed nodes (failed), "
        f"{counts.get('undecided', 0)} undecided (no node named: the harness could not tell)"
    )


def score_line(category: str, counts: dict[str, Any]) -> str:
    """``parity   160/165 passed (97.0%); 5 unsupported, … — score = passed / all 165``."""
    scored, passed = counts.get("scored", counts["total"]), counts["passed"]
    share = f" ({100 * passed / scored:.1f}%)" if scored else ""
    return (
        f"{category:<14} {passed}/{scored} passed{share}; "
        f"{', '.join(outcome_parts(counts))} — score = passed / all {scored}"
    )


def _version(distribution: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def declared(capabilities: Any) -> dict[str, Any]:
    """The backend's `Capabilities` as JSON: what its scores were measured against."""

    def name(dtype: Any) -> str:
        return str(dtype).removeprefix("torch.")

    def tolerance(value: Any) -> Any:
        # (rtol, atol), or {dtype: (rtol, atol)} under an op or model name (per-op/per-model overrides)
        if isinstance(value, dict):
            return {name(d): tolerance(pair) for d, pair in sorted(value.items(), key=lambda i: name(i[0]))}
        return [float(v) for v in value]

    c = capabilities
    written = {
        "supported_ops": None if c.supported_ops is None else sorted(c.supported_ops),
        "dtypes": None if c.dtypes is None else sorted(name(d) for d in c.dtypes),
        "tolerances": None
        if c.tolerances is None
        else {name(d): tolerance(pair) for d, pair in sorted(c.tolerances.items(), key=lambda i: name(i[0]))},
        "host_only_modules": list(c.host_only_modules),
        "target_runtime_modules": list(c.target_runtime_modules),
    }
    # Every declared field, so that a score is read against the whole declaration (a field added to
    # Capabilities later is listed too: the flags are JSON as they are).
    return {f.name: written.get(f.name, getattr(c, f.name)) for f in dataclasses.fields(c)}


def not_under_test(capabilities: Any) -> list[str]:
    """What the suite did not check because the backend's declaration left it out, in words.

    Two backends' scores are comparable only when these match: a backend
    that declares fewer dtypes is measured on fewer checks.
    """
    from ..cases import FLOAT_DTYPES

    found = []
    dtypes = declared(capabilities)["dtypes"]
    if dtypes is not None:
        left_out = [d for d in FLOAT_DTYPES if d not in dtypes]
        if left_out:
            found.append(f"dtypes {', '.join(left_out)} (not in Capabilities.dtypes)")
    if not capabilities.thread_safe:
        found.append("calls from several threads (thread_safe=False)")
    if not capabilities.fault_injection:
        found.append("runtime symbolication by fault injection (fault_injection=False)")
    return found


def ops_matrix_of(
    selected: RegisteredBackend, tests: list[ReportTest], samples: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The report's ``ops``: the operator x dtype matrix of the run's ``ops`` checks, with the sample
    set they were made from (``samples``: count, digest, source), or None when none ran."""
    from ._ops import ops_matrix

    declared = getattr(selected.backend, "capabilities", None)
    matrix = ops_matrix(tests, getattr(declared, "supported_ops", None))
    if matrix is not None and samples is not None:
        matrix["samples"] = samples
    return matrix


def backend_entry(selected: RegisteredBackend) -> dict[str, Any]:
    """The report's ``backend``: the registered backend, where it came from and what it declared."""
    from ..capabilities import capabilities_of

    available, unavailable_reason = selected.availability()
    source = selected.source
    capabilities = capabilities_of(selected.backend)
    return {
        "name": selected.name,
        "source": source.description,
        "distribution": source.distribution,
        "version": source.version,
        "available": available,
        "unavailable_reason": unavailable_reason or None,
        "capabilities": declared(capabilities),
        "not_under_test": not_under_test(capabilities),
    }


def run_entry(
    started: float,
    exitstatus: int,
    *,
    select: Iterable[str] = (),
    workers: int = 0,
    shard: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report's ``run``: when it started, how long it took, how it ended, what it selected.

    :param shard: a ``--backendconf-shard`` run's `report._shards.shard_entry`; None for a whole run.
    """
    return {
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(),
        "duration": round(time.time() - started, 3),
        "exit_status": exitstatus,
        "select": list(select),
        "xdist_workers": workers,
        "shard": shard,
    }


def known_failures_entry(path: Path | None, known: list[KnownFailure], stale: set[str] | None) -> dict | None:
    """The report's ``known_failures``: the file the run applied, or None."""
    if path is None:
        return None
    return {
        "file": str(path),
        "entries": len(known),
        "stale": sorted(p for p in stale or () if any(e.pattern == p for e in known)),
    }


def report_document(
    tests: list[ReportTest],
    *,
    backend: dict[str, Any],
    run: dict[str, Any],
    pytest_version: str | None,
    categories: Iterable[str] = CATEGORIES,
    hypothesis: dict[str, Any] | None = None,
    known_failures: dict[str, Any] | None = None,
    ops: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report document (schema in docs/ci-gating.md): the suite's ``--backendconf-report`` and
    ``backendconf replay --report`` both write it here.

    :param backend: `backend_entry` of the run's backend (replay: the archives' backends).
    :param run: `run_entry` of the run.
    :param pytest_version: None where pytest is not used (replay on a device).
    :param categories: the categories the summary lists, with zeros where none ran.
    :param hypothesis: the run's Hypothesis profile, seed and whether it is
        derandomized (the suite's choice), or None when none was made.
    """
    import torch

    return {
        "schema": REPORT_SCHEMA,
        "schema_version": list(REPORT_SCHEMA_VERSION),
        "backend": backend,
        "environment": {
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "platform": platform.platform(),
            **describe_machine(),
            "pytest": pytest_version,
            "pytest_backendconf": _version("pytest-backendconf"),
        },
        "hypothesis": hypothesis,
        "run": run,
        # The checks non-strict entries listed are counted apart, never silently (docs/ci-gating.md).
        "known_failures": None if known_failures is None else {**known_failures, **non_strict_counts(tests)},
        "summary": summarize(tests, categories),
        "errors": error_counts(tests),
        "ops": ops,
        "tests": [test.to_json() for test in tests],
    }
