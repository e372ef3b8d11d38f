"""TorchScript reliability: repeated calls, inputs left alone, determinism, memory, threads.

A C++ backend that crashes or hangs takes down the process running the
check: the backend host reports that as the failure of the check it was in
(with the last backend call), starts a fresh host, and the rest of the suite
runs on. These checks make the calls that find such faults; what a
TorchScript backend cannot take part in says *not applicable*.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import TYPE_CHECKING, Iterator

import pytest
import torch

from ...checks import Check, CheckFailed
from ...torchscript import lower_in_fresh_process
from . import _session as ts

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext


def reliability_checks(ctx: SuiteContext) -> Iterator[Check]:
    for case in ts.spec()["reliability_cases"]:
        dtype = ctx.first_dtype(case) if case in ctx.cases else None
        if dtype is None:
            continue
        for name, run in (
            ("repeated_calls", _repeated_calls),
            ("inputs_unchanged", _inputs_unchanged),
            ("deterministic_preprocess", _deterministic_preprocess),
            ("threads", _threads),
        ):
            yield Check(
                "reliability",
                f"{name}[{case}]",
                functools.partial(run, case=case, dtype=dtype),
                stage="preprocess" if name == "deterministic_preprocess" else "execute",
                case=case,
            )
    yield Check("reliability", "memory", _memory, stage="execute")


@ts.torchscript_check
def _repeated_calls(ctx: SuiteContext, case: str, dtype: str) -> None:
    """The same call, made again and again, returns the same outputs bit for bit (and neither crashes nor hangs)."""
    ts.require_available(ctx)
    module, _ = ts.lowered(ctx, case, dtype)
    args = ts.inputs(ctx, case, dtype)
    with torch.no_grad():
        first = module(*args)
        for call in range(1, ts.spec()["repeat_calls"]):
            why = ts.differences(first, module(*args))
            if why:
                raise CheckFailed(f"call {call + 1} with the same inputs differs from the first: {why}")


@ts.torchscript_check
def _inputs_unchanged(ctx: SuiteContext, case: str, dtype: str) -> None:
    """execute leaves its inputs as they were."""
    ts.require_available(ctx)
    module, _ = ts.lowered(ctx, case, dtype)
    args = ts.inputs(ctx, case, dtype)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        module(*args)
    for i, (was, now) in enumerate(zip(before, args)):
        if isinstance(was, torch.Tensor) and not torch.equal(was, now):
            raise CheckFailed(f"the call wrote into its input {i} ({now.dtype}{list(now.shape)})")


@ts.torchscript_check
def _deterministic_preprocess(ctx: SuiteContext, case: str, dtype: str) -> None:
    """Lowering the same module in two fresh processes gives the same processed module (what torch.jit.save
    stores): preprocess is a function of the module and the compile spec."""
    ts.require_available(ctx)
    ts.lowered(ctx, case, dtype)  # unsupported cases end here
    runs = ctx.memo(("torchscript", "fresh lowerings"), lambda: _lower_twice(ctx))
    for run in runs:
        if "ended" in run:
            raise CheckFailed(f"the process lowering afresh ended before answering: {run['ended']}\n{run['stderr']}")
    index = runs[0]["cases"].index(case)
    first, second = (run["fingerprints"][index] for run in runs)
    if isinstance(first, dict) or isinstance(second, dict):
        error = first if isinstance(first, dict) else second
        raise CheckFailed(f"lowering model {case} afresh failed: {error['type']}: {error['message']}")
    if first != second:
        raise CheckFailed(
            f"model {case} lowered in two fresh processes gave different processed modules (sha256 {first[:12]} "
            f"and {second[:12]}): preprocess must be a function of the module and the compile spec"
        )


def _lower_twice(ctx: SuiteContext) -> list[dict]:
    """Every reliability case that lowers, scripted to a file, lowered in two fresh processes."""
    record = ts.loaded(ctx)
    folder = ctx.tmp_dir("torchscript-fresh")
    items, cases = [], []
    for case in ts.spec()["reliability_cases"]:
        dtype = ctx.first_dtype(case) if case in ctx.cases else None
        if dtype is None:
            continue
        try:
            ts.lowered(ctx, case, dtype)
        except Exception:
            continue
        model = ts.scripted(ctx, case, dtype)
        path = os.path.join(folder, f"{case}.pt")
        torch.jit.save(model.module, path)
        items.append({"path": path, "spec": record.method_compile_spec(list(model.methods))})
        cases.append(case)
    runs = [lower_in_fresh_process(record.library_path(), record.name, items) for _ in range(2)]
    return [{**run, "cases": cases} for run in runs]


@ts.torchscript_check
def _threads(ctx: SuiteContext, case: str, dtype: str) -> None:
    """Backends declaring thread_safe: calls from several threads at once give each call's own outputs."""
    if not ctx.capabilities.thread_safe:
        pytest.skip("not applicable: the backend does not declare thread_safe in its capabilities")
    ts.require_available(ctx)
    module, _ = ts.lowered(ctx, case, dtype)
    spec = ts.spec()
    seeds = list(range(spec["threads"]))
    calls = {seed: ts.inputs(ctx, case, dtype, "forward", seed) for seed in seeds}
    with torch.no_grad():
        alone = {seed: module(*args) for seed, args in calls.items()}
    failures: list[str] = []

    def worker(seed: int) -> None:
        for _ in range(spec["calls_per_thread"]):
            with torch.no_grad():
                why = ts.differences(alone[seed], module(*calls[seed]))
            if why:
                failures.append(f"thread {seed}: {why}")
                return

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise CheckFailed("calls from several threads differ from the same calls alone: " + "; ".join(failures[:3]))


def _rss() -> int:
    with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@ts.torchscript_check
def _memory(ctx: SuiteContext) -> None:
    """Calls do not keep memory: after a warm-up, a second window of calls grows the process no more than the
    first (a leak keeps growing; allocator caches settle)."""
    if not os.path.exists(f"/proc/{os.getpid()}/statm"):
        pytest.skip("not applicable: resident memory is read from /proc, which this system lacks")
    ts.require_available(ctx)
    spec = ts.spec()
    data, module = ts.runtime_probe(ctx)
    # 1 MiB per input: a backend keeping its inputs shows at once.
    args = ts.probe_inputs(data["memory_shapes"], torch.rand)

    def window(calls: int) -> int:
        start = _rss()
        with torch.no_grad():
            for _ in range(calls):
                module(*args)
        return _rss() - start

    window(spec["memory_warmup_calls"])
    first = window(spec["memory_window_calls"])
    second = window(spec["memory_window_calls"])
    floor = spec["memory_rss_floor_mib"] * 2**20
    if second > floor and second >= spec["memory_ratio"] * max(first, 0):
        third = window(spec["memory_window_calls"])
        if third > floor:
            raise CheckFailed(
                f"memory keeps growing with calls: {first / 2**20:.1f} MiB, then {second / 2**20:.1f} MiB, then "
                f"{third / 2**20:.1f} MiB over windows of {spec['memory_window_calls']} calls on 1 MiB inputs"
            )
