"""The preprocess cache's worth: a warm rerun against the cold run that filled the cache.

Also a pytest plugin (``-p bench_cache``) that registers ``hidden_cost``: the reference backend with
a ``preprocess`` that first sleeps `HIDDEN_COST_S`, as a compiler whose lowering is most of a
check's cost (a TVM build, an NPU toolchain). ``benchmarks/run.py --only cache`` runs the suite's
`CACHE_SHARD` of the default suite four times, from an empty cache folder then again over it, for ``hidden_cost`` and
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
#: What is measured: one shard of four of the default suite (``--backendconf-shard=1/4``), i.e. whole
#: models of every category in the suite's own proportions (ops checks are most of it). The whole
#: default suite at 0.3 s a lowering takes more than half an hour cold on 2 shared cores. `contract`'s
#: checks call preprocess directly, on purpose (determinism, read-only program), and pay it on every run.
CACHE_SHARD = "1/4"


class HiddenCost(ReferenceBackend):
    """The reference backend with a preprocess that takes `HIDDEN_COST_S` longer."""

    name = "hidden_cost"

    def preprocess(self, program: Any, compile_spec: dict, debug_handles: Any) -> bytes:
        time.sleep(HIDDEN_COST_S)
        return super().preprocess(program, compile_spec, debug_handles)


def backendconf_register_backends(register: Callable[[Any], None]) -> None:
    register(HiddenCost())


def cache_figures(settings: Any, run_suite: Callable[..., Any]) -> list[Figure]:
    """Cold then warm runs of shard `CACHE_SHARD` of the default suite, for ``hidden_cost`` then ``reference``."""
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
            options = (
                "-p",
                "bench_cache",
                f"--backendconf-cache={folder / 'cache'}",
                f"--backendconf-shard={CACHE_SHARD}",
            )
            cold = run_suite(settings, backend=backend, extra_args=options)
            warm = run_suite(settings, backend=backend, extra_args=options)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        ratio = warm.wall / cold.wall
        detail = (
            f"cold {cold.wall:.1f} s, warm {warm.wall:.1f} s (wall; CPU {cold.cpu:.1f} s, {warm.cpu:.1f} s); "
            f"{_summary(cold)} then {_summary(warm)}; exit codes {cold.returncode}, {warm.returncode}; "
            f"default suite, shard {CACHE_SHARD} ({max(s['items'] for s in cold.stats)} checks)"
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
