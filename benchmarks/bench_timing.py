"""What every benchmark shares: how hard to measure (`Settings`), a row of the table (`Figure`),
interleaved and best-of timing, and the machine the figures were taken on."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
import timeit
from typing import Any, Callable

MET, MISSED, INFO, SKIPPED = "met", "MISSED", "info", "skipped"


# --- settings and figures ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    """How hard to measure: the full run, ``--quick``, or the smoke test's tiny sizes."""

    name: str
    #: Interleaved rounds of each group of call timings; the minimum is kept.
    rounds: int
    #: Seconds each timed function runs per round (the loop count is calibrated to it).
    round_time: float
    #: Seconds one group of interleaved timings may take; slow functions get fewer rounds (at least 3).
    group_budget: float
    scaling_sizes: tuple[int, ...]
    #: Rounds of each lowering in the scaling figures.
    scaling_rounds: int
    #: Nodes of the chain in the archive figures (torch.export.load of it is slow).
    archive_chain: int
    #: Handles per symbolication call (all of the archive's handles, repeated).
    symbolicate_handles: int
    #: ``None``: the whole default suite; else the ``--backendconf-select`` patterns.
    suite_select: tuple[str, ...] | None
    run_suite: bool = True
    suite_workers: int = 0
    #: torch threads for the in-process timings. One by default: with more, a
    #: small kernel's OpenMP barrier waits for a thread that another process
    #: has descheduled, and costs milliseconds on a loaded machine.
    threads: int = 1
    #: Also run the suite with OMP_NUM_THREADS=1, to show what threads cost it.
    suite_one_thread: bool = False
    #: Also run the suite writing a golden folder, twice beside two more plain runs (the golden figure).
    suite_golden: bool = True
    #: The five-engine comparison (``bench_peers``: eager, reference, ONNX Runtime,
    #: ExecuTorch XNNPACK, OpenVINO CPU); it lowers every benchmark model with each installed backend.
    run_peers: bool = True

    @classmethod
    def full(cls) -> "Settings":
        return cls(
            "full",
            rounds=100,
            round_time=0.004,
            group_budget=8.0,
            scaling_sizes=(10, 100, 1_000, 10_000),
            scaling_rounds=3,
            archive_chain=1_000,
            symbolicate_handles=200_000,
            suite_select=None,
            suite_one_thread=True,
        )

    @classmethod
    def quick(cls) -> "Settings":
        return cls(
            "quick",
            rounds=30,
            round_time=0.002,
            group_budget=1.5,
            scaling_sizes=(10, 100, 1_000),
            scaling_rounds=2,
            archive_chain=200,
            symbolicate_handles=100_000,
            suite_select=("backendconf::symbolication::*",),
        )

    @classmethod
    def tiny(cls) -> "Settings":
        """For tests: every figure computed once, as fast as possible."""
        return cls(
            "tiny",
            rounds=2,
            round_time=0.0005,
            group_budget=0.1,
            scaling_sizes=(10, 100),
            scaling_rounds=1,
            archive_chain=50,
            symbolicate_handles=1_000,
            suite_select=None,
            run_suite=False,
            run_peers=False,
        )


@dataclasses.dataclass
class Figure:
    """One row of the table."""

    key: str
    label: str
    value: float | None
    unit: str
    target: str
    status: str
    detail: str = ""

    def value_text(self) -> str:
        if self.value is None:
            return "—"
        v = self.value
        if float(v).is_integer() and self.unit in ("tests", ""):
            text = f"{v:,.0f}"
        else:
            text = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return f"{text} {self.unit}".rstrip()


def judged(ok: bool) -> str:
    return MET if ok else MISSED


# --- timing ----------------------------------------------------------------------------


def interleaved(functions: dict[str, Callable[[], Any]], settings: Settings) -> dict[str, float]:
    """Seconds per call of each function: the minimum over ``settings.rounds`` rounds.

    Each round runs every function once in turn (the order rotates, so none
    always runs first), each for about ``settings.round_time`` seconds, so a
    burst of load from elsewhere hits all of them alike. Many short rounds
    beat a few long ones: the minimum needs only one quiet moment per function.
    """
    names = list(functions)
    timers = {name: timeit.Timer(functions[name]) for name in names}
    numbers, cost = {}, 0.0
    for name in names:
        timers[name].timeit(2)  # warm up: first-call caches, lazy imports
        once = max(timers[name].timeit(3) / 3, 1e-7)
        numbers[name] = max(1, int(settings.round_time / once))
        cost += numbers[name] * once
    rounds = max(min(3, settings.rounds), min(settings.rounds, int(settings.group_budget / cost)))
    best = {name: float("inf") for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            best[name] = min(best[name], timers[name].timeit(numbers[name]) / numbers[name])
    return best


def best_of(
    function: Callable[[], Any], rounds: int, budget: float = 0.0, clock: Callable[[], float] = time.process_time
) -> float:
    """The minimum time of a slow function: ``rounds`` calls, more while within ``budget`` seconds.

    The clock is this process's CPU time by default: a run of 0.1 s to 2 s
    rarely finds a quiet moment on a loaded machine, and time spent
    descheduled is not the function's. (Single-threaded code only; the
    benchmark sets torch to one thread.)
    """
    times: list[float] = []
    spent = 0.0
    while len(times) < rounds or (spent < budget and len(times) < 100):
        start = clock()
        function()
        times.append(clock() - start)
        spent += times[-1]
    return min(times)


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cpus": affinity,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "torch_threads_default": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
