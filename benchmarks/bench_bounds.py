"""Hostile-input bounds of docs/ci-gating.md: what a large or forged report or known-failures file costs.

Each figure is one measured time (CPU seconds of this process, the minimum
of a few rounds) against the bound the docs state; the inputs are built
here, from the shapes the hostile-input review used: a report of many
distinct models × distinct checks (a matrix of n² cells for n checks), and
a known-failures file of 16,000 entries.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench_timing import Figure, Settings, judged


def cpu_seconds(run: Callable[[], Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(max(1, rounds)):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def sparse_report(n: int) -> dict[str, Any]:
    """A report of ``n`` checks, each of its own model and its own column (every cell of a matrix distinct)."""
    from pytest_backendconf.report import OUTCOMES, REPORT_SCHEMA, REPORT_SCHEMA_VERSION

    tests = [
        {
            "id": f"backendconf::parity::model{i}[col{i}]",
            "category": "parity",
            "case": f"model{i}",
            "stage": "execute",
            "outcome": "failed" if i % 7 == 0 else "passed",
            "duration": 0.1,
            "error": {"type": "CheckFailed", "module": "m", "message": f"mismatch {i}"} if i % 7 == 0 else None,
            "reason": None,
            "known_failure": None,
            "reproduce": f"pytest --backend=x '--backendconf-select=backendconf::parity::model{i}[col{i}]'",
        }
        for i in range(n)
    ]
    failed = sum(1 for t in tests if t["outcome"] == "failed")
    counts = {o: 0 for o in OUTCOMES}
    counts.update(passed=n - failed, failed=failed)
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": list(REPORT_SCHEMA_VERSION),
        "backend": {"name": "x", "version": "1", "available": True},
        "environment": {"torch": "2.13.0", "python": "3.11"},
        "run": {"duration": 1.0, "exit_status": 1, "select": [], "xdist_workers": 0},
        "summary": {"parity": {"total": n, **counts, "score": (n - failed) / n}},
        "errors": {"total": failed, "by_type": {"CheckFailed": failed}, "by_stage": {"execute": failed}},
        "tests": tests,
    }


def bounds_figures(settings: Settings) -> list[Figure]:
    from pytest_backendconf.cli._main import main
    from pytest_backendconf.report._known_failures import KnownFailureIndex, load_known_failures

    small = settings.name == "tiny"
    rounds = 1 if small else 3
    figures = []
    with tempfile.TemporaryDirectory(prefix="backendconf-bench-bounds-") as folder:
        # 1. The HTML page of a report with many distinct models and columns (the review's 454 KB file).
        n = 200 if small else 1_600
        report = Path(folder, "report.json")
        report.write_text(json.dumps(sparse_report(n)))
        page = Path(folder, "page.html")

        def html() -> None:
            assert main(["report", "html", str(report), "-o", str(page)]) == 0

        seconds = cpu_seconds(html, rounds)
        kb = report.stat().st_size / 1e3
        figures.append(
            Figure(
                "bounds.report_html",
                f"report html of a {kb:,.0f} KB report, {n} models × {n} checks",
                seconds,
                "s",
                "< 5 s",
                judged(seconds < 5),
                f"page {page.stat().st_size / 1e6:.2f} MB, {page.stat().st_size / report.stat().st_size:.1f}× the "
                f"report (a matrix would have {n * n:,} cells)",
            )
        )
        # 2. A known-failures file of 16,000 entries: loaded, indexed, and every entry looked up once.
        entries = 1_000 if small else 16_000
        known = Path(folder, "known.toml")
        known.write_text(
            "\n".join(
                f'"backendconf::ops::aten.op{i}.default[float16-sample0]" = {{ reason = "r{i}" }}'
                for i in range(entries)
            )
            + '\n"backendconf::parity::*[[]bfloat16]" = { reason = "a pattern" }\n'
        )
        ids = [f"backendconf::ops::aten.op{i}.default[float16-sample0]" for i in range(0, entries, 8)]

        def known_failures() -> None:
            index = KnownFailureIndex(load_known_failures(known, "--backendconf-known-failures"))
            for test_id in ids:
                index.entry_for(test_id, test_id)

        seconds = cpu_seconds(known_failures, rounds)
        figures.append(
            Figure(
                "bounds.known_failures",
                f"load a known-failures file of {entries:,} entries and look {len(ids):,} checks up",
                seconds,
                "s",
                "< 2 s",
                judged(seconds < 2),
                f"{known.stat().st_size / 1e3:,.0f} KB of TOML",
            )
        )
    return figures


# --- known-failure matching against a hostile file -----------------------------------------------

#: Characters of test ids, for the classes of `hostile_patterns`.
_ID_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-,= "


def hostile_patterns(n: int) -> list[str]:
    """``n`` distinct patterns of about 1,000 characters that every check id's literal filters let through.

    Each shares the literal prefix (``backendconf::``) and suffix (``]``) of
    every id, needs fewer characters than an id has, and spends the 16
    wildcards a pattern may have (7 classes of ~130 characters, 8 ``*``), so
    `KnownFailureIndex` must run each one's regex against each id: the worst
    a file the reader admits can do. (The issue's file, 500 patterns with
    hundreds of ``*`` each, is refused at load by the wildcard cap.)
    """
    patterns = []
    width = len(_ID_CHARACTERS)
    for i in range(n):  # distinct by the rotation and the length of their classes
        rotated = _ID_CHARACTERS[i % width :] + _ID_CHARACTERS[: i % width]
        klass = (rotated * 3)[: 133 - i // width]
        patterns.append("backendconf::" + "".join(f"*[{klass}]" for _ in range(7)) + "*]")
    return patterns


def default_suite_ids(n: int) -> list[str]:
    """``n`` check ids of the shapes the default suite has (ops, parity, serialization...)."""
    shapes = (
        "backendconf::ops::aten.{k}.default[float32-sample{i}]",
        "backendconf::parity::model_{k}[float16]",
        "backendconf::serialization::round_trip[model_{k}]",
        "backendconf::contract::execute_profiled_events[model_{k}]",
    )
    return [shapes[i % len(shapes)].format(k=f"op{i}", i=i % 7) for i in range(n)]


def known_failures_figures(settings: Settings) -> list[Figure]:
    """Milliseconds per check id for the worst known-failures file the reader admits (`hostile_patterns`)."""
    from pytest_backendconf.report._known_failures import KnownFailureIndex, load_known_failures

    small = settings.name == "tiny"
    ids = default_suite_ids(40 if small else 400)
    with tempfile.TemporaryDirectory(prefix="backendconf-bench-known-") as folder:
        known = Path(folder, "known.toml")
        known.write_text("".join(f'"{p}" = {{ reason = "r" }}\n' for p in hostile_patterns(500)))
        index = KnownFailureIndex(load_known_failures(known, "--backendconf-known-failures"))
        size = known.stat().st_size

        def look_up() -> None:
            for test_id in ids:
                index.entry_for(test_id, test_id)

        per_id = cpu_seconds(look_up, 1 if small else 3) / len(ids) * 1e3
    return [
        Figure(
            "known_failures.per_check_ms",
            f"look a check up in {size / 1e3:,.0f} KB of known failures: 500 patterns of ~1,000 characters",
            per_id,
            "ms",
            "≤ 10 ms",
            judged(per_id <= 10),
            f"{per_id / 10:.2f}× the target; every pattern shares the ids' prefix and suffix, so each runs its "
            f"regex; {len(ids)} ids of the default suite's shapes",
        )
    ]
