"""The preprocess cache's worth: a warm rerun against the cold run that filled the cache.

Also a pytest plugin (``-p bench_cache``) that registers ``hidden_cost``: the reference backend with
a ``preprocess`` that first sleeps `HIDDEN_COST_S`, as a compiler whose lowering is most of a
check's cost (a TVM build, an NPU toolchain). ``benchmarks/run.py --only cache`` runs the suite's
`CACHE_SELECT` four times, from an empty cache folder then again over it, for ``hidden_cost`` and
for the reference backend, and gives each warm run as a fraction of its cold one.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from backendconf_reference import ReferenceBackend

from bench_timing import INFO, SKIPPED, Figure, judged

#: Seconds the hidden-cost backend's preprocess sleeps before lowering as the reference backend does.
HIDDEN_COST_S = 0.3
#: The warm rerun's wall time may be at most this fraction of the cold run's (docs/benchmarks.md).
TARGET = 0.40
#: The categories measured: every lowering of them goes through the suite's shared lowering (and so
#: the cache). The whole default suite at 0.3 s a lowering takes more than half an hour on 2 cores:
#: its 1,666 ops checks each lower once. `contract` is left out because its checks call preprocess
#: directly, on purpose (determinism, read-only program), and so always pay it.
CACHE_SELECT = ("backendconf::parity::*", "backendconf::serialization::*", "backendconf::symbolication::*")


class HiddenCost(ReferenceBackend):
    """The reference backend with a preprocess that takes `HIDDEN_COST_S` longer."""

    name = "hidden_cost"

    def preprocess(self, program: Any, compile_spec: dict, debug_handles: Any) -> bytes:
        time.sleep(HIDDEN_COST_S)
        return super().preprocess(program, compile_spec, debug_handles)


def backendconf_register_backends(register: Callable[[Any], None]) -> None:
    register(HiddenCost())


def cache_figures(settings: Any, run_suite: Callable[..., Any]) -> list[Figure]:
    """Cold then warm runs of `CACHE_SELECT`, for ``hidden_cost`` then ``reference``."""
    if not settings.run_suite:
        return [
            Figure(key, label, None, "×", target, SKIPPED, "not run in this mode")
            for key, label, target in (
                ("cache.hidden_cost", "warm rerun / cold run, 0.3 s preprocess", f"≤ {TARGET:.2f}"),
                ("cache.reference", "warm rerun / cold run, reference backend", "—"),
            )
        ]
    figures = []
    for backend, key, label in (
        ("hidden_cost", "cache.hidden_cost", f"warm rerun / cold run, {HIDDEN_COST_S} s preprocess"),
        ("reference", "cache.reference", "warm rerun / cold run, reference backend"),
    ):
        folder = Path(tempfile.mkdtemp(prefix="backendconf-bench-cache-"))
        try:
            options = ("-p", "bench_cache", f"--backendconf-cache={folder / 'cache'}")
            cold = run_suite(settings, backend=backend, extra_args=options, select=CACHE_SELECT)
            warm = run_suite(settings, backend=backend, extra_args=options, select=CACHE_SELECT)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        ratio = warm.wall / cold.wall
        detail = (
            f"cold {cold.wall:.1f} s, warm {warm.wall:.1f} s (wall; CPU {cold.cpu:.1f} s, {warm.cpu:.1f} s); "
            f"{_summary(cold)} then {_summary(warm)}; exit codes {cold.returncode}, {warm.returncode}; "
            f"{', '.join(CACHE_SELECT)}"
        )
        is_target = backend == "hidden_cost"
        figures.append(
            Figure(
                key,
                label,
                ratio,
                "×",
                f"≤ {TARGET:.2f}" if is_target else "—",
                judged(ratio <= TARGET) if is_target else INFO,
                detail,
            )
        )
    return figures


def _summary(run: Any) -> str:
    """``N of M reused`` from the run's terminal summary line of the cache."""
    for line in run.output.splitlines():
        if "preprocess cache" in line and " reused" in line:
            return line.split(": ", 2)[-1].split(",")[0]
    return "no cache line"
