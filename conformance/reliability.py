"""reliability: crashes, hangs, input mutation, nondeterminism, races and leaks each fail their own check.

docs/benchmarks.md: such a backend is reported as a clear failure of the matching
check while the rest of the suite still runs. Crashes and hangs cannot be
caught in the pytest process, so one child process per session runs
``compile`` and ``execute`` for every case of ``[reliability]`` in
``suite.toml`` and reports each step as it goes; the parent learns which
step crashed (the child died) or hung (no report in time, the child is
killed). Once the child has run, the in-process checks of a case that
crashed or hung there are skipped instead of taking the session down.

The other checks run in-process on the lowered module: inputs compared
with copies, outputs compared bit for bit, eight threads against the
single-threaded results, and memory (RSS, tracemalloc) over windows of
calls. Timeouts, repetitions, cases and limits are in ``suite.toml``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import gc
import os
import threading
import tracemalloc
import weakref
from typing import Any, Iterator

import pytest
import torch

from pytest_backendconf import UnsupportedNodeError
from pytest_backendconf.suite import SuiteContext
from pytest_backendconf._compat import tree_leaves, tree_map
from pytest_backendconf.checks import Check, Unsupported, fail

from ._spec import section

#: Overrides ``execute_timeout_s`` (seconds), for slow devices and for the project's own tests.
TIMEOUT_ENV = "BACKENDCONF_EXECUTE_TIMEOUT"


def checks(ctx: SuiteContext) -> Iterator[Check]:
    spec = section("reliability")
    yield Check("reliability", "execute_does_not_crash_the_process", check_no_crash, stage="execute")
    yield Check("reliability", "execute_returns_in_time", check_no_hang, stage="execute")
    per_case = (
        (check_execute_leaves_inputs_alone, spec.get("cases", ())),
        (check_execute_is_deterministic, spec.get("cases", ())),
        (check_execute_is_thread_safe, spec.get("cases", ())),
        (check_memory_stays_flat, spec.get("memory_cases", ())),
    )
    for check, names in per_case:
        for name in names:
            dtype = ctx.first_dtype(name)
            if dtype is not None:
                yield Check(
                    "reliability",
                    f"{check.__name__.removeprefix('check_')}[{name}]",
                    functools.partial(check, case_name=name, dtype=dtype),
                    stage="execute",
                    case=name,
                )


# --- the child process: crashes and hangs -------------------------------------------------


@dataclasses.dataclass
class Probe:
    """compile() then execute() of one (case, method) in the child, and what became of it."""

    case: str
    dtype: str
    method: str
    #: ok, raised (a Python exception: not this category's business), crashed, hung, not_run, not_lowered
    status: str = "not_run"
    step: str = ""
    detail: str = ""

    @property
    def where(self) -> str:
        return f"{self.case}.{self.method} [{self.dtype}]"

    def what(self) -> str:
        """``execute() (call 2 of 3) of nested_nml.forward [float32]``."""
        if self.step == "compile":
            return f"compile() of {self.case} [{self.dtype}] (before running {self.method})"
        return f"execute() ({self.step.replace(':', ' ').replace('/', ' of ')}) of {self.where}"


@dataclasses.dataclass
class IsolatedRun:
    probes: list[Probe]
    timeout: float
    #: Why the child could not run the probes at all (then the checks cannot tell).
    setup_error: str | None = None
    stderr: str = ""

    def of_case(self, case: str) -> list[Probe]:
        return [p for p in self.probes if p.case == case]

    def first(self, status: str) -> Probe | None:
        return next((p for p in self.probes if p.status == status), None)


_RUNS: "weakref.WeakKeyDictionary[SuiteContext, IsolatedRun]" = weakref.WeakKeyDictionary()
_RUNS_LOCK = threading.Lock()


def isolated_run(ctx: SuiteContext) -> IsolatedRun:
    """The session's child-process run, started on first use (about two seconds: torch's import)."""
    with _RUNS_LOCK:
        if ctx not in _RUNS:
            _RUNS[ctx] = _run_child(ctx)
        return _RUNS[ctx]


def execute_timeout() -> float:
    override = os.environ.get(TIMEOUT_ENV)
    if override:
        try:
            return float(override)
        except ValueError:
            raise pytest.UsageError(f"{TIMEOUT_ENV}={override!r} must be a number of seconds") from None
    return float(section("reliability").get("execute_timeout_s", 20))


def _run_child(ctx: SuiteContext) -> IsolatedRun:
    from pytest_backendconf.target import ChildProcess, pack_value

    spec = section("reliability")
    run = IsolatedRun(probes=[], timeout=execute_timeout())
    payload = []
    calls = int(spec.get("probe_calls", 3))
    for name in spec.get("cases", ()):
        dtype = ctx.first_dtype(name)
        if dtype is None:
            continue
        try:
            lowered = ctx.lower(name, dtype).lowered
        except Exception:
            # Rejected or broken at lowering: the in-process checks of the case report it.
            run.probes.append(Probe(name, dtype, "*", status="not_lowered"))
            continue
        for method in ctx.cases[name].methods:
            run.probes.append(Probe(name, dtype, method))
            payload.append(
                {
                    "blobs": {m: base64.b64encode(b).decode("ascii") for m, b in lowered.blobs.items()},
                    "specs": {m: s.compile_spec for m, s in lowered.methods.items()},
                    "method": method,
                    "calls": pack_value(
                        [ctx.flat_inputs(name, dtype, method, seed) for seed in range(calls)],
                        f"probe inputs of {name}.{method}",
                    ),
                }
            )
    live = [p for p in run.probes if p.status != "not_lowered"]
    child = ChildProcess(
        "pytest_backendconf.conformance.reliability:ProbeRunner",
        {"backend": ctx.name},
        startup_timeout=float(spec.get("child_startup_timeout_s", 120)),
    )
    try:
        child.send({"probes": payload, "timeout": run.timeout})
        _follow(child, live, run)
    finally:
        child.close()
        run.stderr = child.stderr()
    return run


def _follow(child: Any, probes: list[Probe], run: IsolatedRun) -> None:
    """Read the child's reports; the probe under way when it dies crashed, when it falls silent hung."""
    from pytest_backendconf.target import Ended

    current: Probe | None = None
    while True:
        record = child.receive(run.timeout)
        if record is None:  # silence: the step under way hangs
            child.kill(timed_out=run.timeout)
            if current is not None:
                current.status = "hung"
            return
        if isinstance(record, Ended):
            if record.setup_error is not None:
                run.setup_error = (
                    f"creating backend in the child failed: {record.setup_error['type']}: "
                    f"{record.setup_error['message']}"
                )
            elif record.timed_out is not None:
                run.setup_error = f"the child process did not start within {child.startup_timeout:g} s"
            elif current is not None:
                current.status, current.detail = "crashed", f" ({exit_status(record.returncode)})"
            elif any(p.status == "not_run" for p in probes):
                run.setup_error = f"the child process {record.describe()}, before running every probe"
            return
        kind = record.get("kind")
        if kind == "begin":
            current = probes[record["probe"]]
            current.step = record["step"]
        elif kind == "end":
            probe = probes[record["probe"]]
            if record["error"] is not None:
                probe.status, probe.detail = "raised", record["error"]
            elif probe.status == "not_run":
                probe.status = "ok"
            current = None
        elif kind == "result":
            return


def exit_status(code: int | None) -> str:
    from pytest_backendconf.target import exit_status as status

    return status(code).replace(" (", ", ").rstrip(")")


def _stderr_tail(text: str, limit: int = 1500) -> str:
    text = text.strip()
    if not text:
        return ""
    return "\nthe child's stderr ended with:\n" + (text if len(text) <= limit else "..." + text[-limit:])


class ProbeRunner:
    """In the child: the backend as the session created it; compile and execute every probe, report each step."""

    def __init__(self, options: dict, channel: Any) -> None:
        from pytest_backendconf.registry import lookup_backend

        self.backend = lookup_backend(options["backend"]).backend

    def __call__(self, request: dict, channel: Any) -> dict:
        import faulthandler

        from pytest_backendconf.target import unpack_value

        def send(probe: int, step: str, kind: str, error: str | None = None) -> None:
            channel.send({"kind": kind, "probe": probe, "step": step, "error": error})

        for i, probe in enumerate(request["probes"]):
            send(i, "compile", "begin")
            try:
                blobs = {m: base64.b64decode(b) for m, b in probe["blobs"].items()}
                handle = self.backend.compile(blobs, probe["specs"])[probe["method"]]
            except Exception as exc:
                send(i, "compile", "end", f"{type(exc).__name__}: {exc}")
                continue
            send(i, "compile", "end")
            calls = unpack_value(probe["calls"], "probe inputs")
            for k, inputs in enumerate(calls):
                step = f"call:{k + 1}/{len(calls)}"
                send(i, step, "begin")
                # Where a hung call is stuck, for the failure message (before the parent kills us).
                faulthandler.dump_traceback_later(max(request["timeout"] - 1.0, 0.5))
                try:
                    self.backend.execute(handle, list(inputs))
                    send(i, step, "end")
                except Exception as exc:
                    send(i, step, "end", f"{type(exc).__name__}: {exc}")
                finally:
                    faulthandler.cancel_dump_traceback_later()
        return {}


def check_no_crash(ctx: SuiteContext) -> None:
    run = isolated_run(ctx)
    crashed = run.first("crashed")
    if crashed is not None:
        fail(
            f"{crashed.what()} crashed the process{crashed.detail}. It ran in a child process; in "
            "the pytest process it would have ended the whole session. A backend must report "
            "failures as exceptions (BackendError), never by crashing its host process." + _stderr_tail(run.stderr)
        )
    _skip_if_not_told(run, "crash")


def check_no_hang(ctx: SuiteContext) -> None:
    run = isolated_run(ctx)
    hung = run.first("hung")
    if hung is not None:
        fail(
            f"{hung.what()} did not return within {run.timeout:g} s; the child process running it was "
            f"killed (the limit is execute_timeout_s in suite.toml, or ${TIMEOUT_ENV})." + _stderr_tail(run.stderr)
        )
    if run.setup_error and "did not start" in run.setup_error:
        fail(f"the child process running execute() did not report back: {run.setup_error}")
    _skip_if_not_told(run, "hang")


def _skip_if_not_told(run: IsolatedRun, what: str) -> None:
    """Without a verdict on every probe the check cannot pass; it says why it cannot tell."""
    if run.setup_error:
        pytest.skip(f"cannot tell whether execute() can {what}: {run.setup_error}")
    other = run.first("hung" if what == "crash" else "crashed")
    unknown = [p.where for p in run.probes if p.status == "not_run"]
    if other is not None or unknown:
        pytest.skip(
            f"cannot tell whether execute() can {what} on {', '.join(unknown) or 'every case'}: "
            f"{other.what() if other else 'the child'} {'hung' if what == 'crash' else 'crashed'} first"
        )


def _guard(ctx: SuiteContext, case_name: str) -> None:
    """Skip an in-process check of a case that crashed or hung in the child: it would take pytest down.

    The child runs for the crash and hang checks, which come first; a session
    that selected neither (a reproduce command for one check) does not pay
    for it, and runs the check unguarded, as parity does.
    """
    with _RUNS_LOCK:
        run = _RUNS.get(ctx)
    if run is None:
        return
    for probe in run.of_case(case_name):
        if probe.status in ("crashed", "hung"):
            pytest.skip(f"not run in-process: {probe.what()} {probe.status} in the child process")
        if probe.status == "not_run" and not run.setup_error:
            culprit = run.first("crashed") or run.first("hung")
            pytest.skip(
                f"not run in-process: {case_name} was not probed in the child process, because "
                f"{culprit.what() if culprit else 'the child'} {culprit.status if culprit else 'stopped'} first"
            )


# --- in-process checks -------------------------------------------------------------------


def _lowered(ctx: SuiteContext, case_name: str, dtype: str) -> Any:
    _guard(ctx, case_name)
    try:
        return ctx.lower(case_name, dtype)
    except UnsupportedNodeError as exc:
        raise Unsupported(str(exc).splitlines()[0]) from exc


def check_execute_leaves_inputs_alone(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    lowered = _lowered(ctx, case_name, dtype)
    for method in ctx.cases[case_name].methods:
        args, kwargs = ctx.example(case_name, dtype, method)
        before = _clone((args, kwargs))
        getattr(lowered, method)(*args, **kwargs)
        for i, (old, new) in enumerate(zip(tree_leaves(before), tree_leaves((args, kwargs)))):
            diff = _difference(old, new) if isinstance(old, torch.Tensor) else None
            if diff is not None:
                fail(
                    f"execute() changed input {i} of {case_name}.{method} [{dtype}] in place (max "
                    f"difference {diff:g}); inputs belong to the caller: copy them before writing"
                )


def check_execute_is_deterministic(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    lowered = _lowered(ctx, case_name, dtype)
    for method in ctx.cases[case_name].methods:
        run = getattr(lowered, method)
        same = ctx.example(case_name, dtype, method, seed=0)
        other = ctx.example(case_name, dtype, method, seed=1)
        # Fresh copies for every call, so that only the backend's state can differ.
        first = run(*_clone(same[0]), **same[1])
        again = [run(*_clone(same[0]), **same[1])]
        run(*_clone(other[0]), **other[1])
        again.append(run(*_clone(same[0]), **same[1]))
        for label, output in zip(("right after", "after a call with other inputs"), again):
            diff = _tree_difference(first, output)
            if diff is not None:
                fail(
                    f"{case_name}.{method} [{dtype}]: the same inputs gave different outputs {label} "
                    f"(max difference {diff:g}); execute() must be deterministic, bit for bit"
                )


def check_execute_is_thread_safe(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    if not ctx.capabilities.thread_safe:
        pytest.skip(f"backend {ctx.name!r} does not declare thread_safe")
    lowered = _lowered(ctx, case_name, dtype)
    spec = section("reliability")
    n_threads, per_thread = int(spec.get("threads", 8)), int(spec.get("calls_per_thread", 6))
    with _one_intra_op_thread():
        for method in ctx.cases[case_name].methods:
            _check_threads(ctx, lowered, case_name, dtype, method, n_threads, per_thread)


def _check_threads(
    ctx: SuiteContext, lowered: Any, case_name: str, dtype: str, method: str, n_threads: int, per_thread: int
) -> None:
    """Each call from the threads must give what the same call gives alone."""
    run = getattr(lowered, method)
    examples = [ctx.example(case_name, dtype, method, seed=s) for s in range(n_threads * per_thread)]
    alone = [run(*_clone(a), **k) for a, k in examples]
    if any(_tree_difference(out, run(*_clone(a), **k)) is not None for out, (a, k) in zip(alone, examples)):
        # Threads cannot be blamed for differences the backend makes on its own.
        pytest.skip(
            f"{case_name}.{method} [{dtype}] gives different outputs for the same inputs even "
            "from one thread (see execute_is_deterministic), so calls from threads cannot be compared"
        )
    together: list[Any] = [None] * len(examples)
    errors: list[str] = []
    barrier = threading.Barrier(n_threads)

    def worker(t: int) -> None:
        try:
            barrier.wait()
            for i in range(t * per_thread, (t + 1) * per_thread):
                together[i] = run(*_clone(examples[i][0]), **examples[i][1])
        except Exception as exc:
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(execute_timeout() * per_thread)
    where = f"{case_name}.{method} [{dtype}] from {n_threads} threads at once ({per_thread} calls each)"
    if any(thread.is_alive() for thread in threads):
        fail(f"calling {where} did not finish within {execute_timeout() * per_thread:g} s: a deadlock?")
    if errors:
        fail(f"calling {where} raised, though each call alone succeeds:\n  " + "\n  ".join(errors[:4]))
    diffs = [_tree_difference(a, b) for a, b in zip(alone, together)]
    wrong = [(i, d) for i, d in enumerate(diffs) if d is not None]
    if wrong:
        i, diff = wrong[0]
        fail(
            f"calling {where}: {len(wrong)} of {len(examples)} calls gave outputs different from the "
            f"same call alone (first: thread {i // per_thread}, inputs of seed {i}, max difference "
            f"{diff:g}). The backend declares thread_safe: execute() must not share mutable state "
            "between calls without a lock."
        )


def check_memory_stays_flat(ctx: SuiteContext, *, case_name: str, dtype: str) -> None:
    lowered = _lowered(ctx, case_name, dtype)
    spec = section("reliability")
    calls = [(getattr(lowered, m), *ctx.example(case_name, dtype, m)) for m in ctx.cases[case_name].methods]

    def window(n: int) -> tuple[int | None, int]:
        for _ in range(n):
            for run, args, kwargs in calls:
                run(*args, **kwargs)
        # The young generations hold this window's cyclic garbage; a full
        # collection of a session's objects costs a good part of a second.
        gc.collect(1)
        return _rss(), tracemalloc.get_traced_memory()[0]

    size = int(spec.get("memory_window_calls", 80))
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        with _one_intra_op_thread():
            samples = [window(int(spec.get("memory_warmup_calls", 40))), window(size), window(size)]
            suspects = _growing(samples, spec)
            if suspects:
                samples.append(window(size))  # a leak keeps growing; a settling cache does not
                suspects = [k for k in _growing(samples[1:], spec) if k in suspects]
    finally:
        if started:
            tracemalloc.stop()
    for kind in suspects:
        values = _measures(samples, 0 if kind == "RSS" else 1)
        assert values is not None  # _growing names only measures taken here
        growth = [(b - a) / 2**20 for a, b in zip(values, values[1:])]
        per_call = growth[1] * 2**20 / size
        fail(
            f"{case_name} [{dtype}] keeps memory it does not free: {kind} grew by "
            + ", then ".join(f"{g:.1f} MiB" for g in growth)
            + f" over successive windows of {size} calls of {', '.join(ctx.cases[case_name].methods)} "
            f"after a warm-up, about {per_call / 1024:.0f} KiB per call (limits in suite.toml: "
            f"memory_{'rss' if kind == 'RSS' else 'python'}_floor_mib per window, memory_ratio)"
        )


def _measures(samples: list[tuple[int | None, int]], index: int) -> list[int] | None:
    """One measure (0: RSS, 1: Python allocations) across ``samples``; None where it cannot be taken."""
    values = [s[index] for s in samples]
    known = [v for v in values if v is not None]
    return known if len(known) == len(values) else None


def _growing(samples: list[tuple[int | None, int]], spec: dict) -> list[str]:
    """Which measures grew over the last window by more than the floor and the ratio of the one before."""
    found = []
    ratio = float(spec.get("memory_ratio", 0.5))
    floors = {
        "RSS": float(spec.get("memory_rss_floor_mib", 8)),
        "Python allocations (tracemalloc)": float(spec.get("memory_python_floor_mib", 1)),
    }
    for index, (kind, floor) in enumerate(floors.items()):
        values = _measures(samples, index)
        if values is None:
            continue
        before, last = values[-2] - values[-3], values[-1] - values[-2]
        if last > floor * 2**20 and last >= ratio * before:
            found.append(kind)
    return found


def _rss() -> int | None:
    """Resident memory from /proc (Linux); None elsewhere, where tracemalloc alone judges."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """torch's intra-op (OpenMP) threads, limited to one for many small calls.

    Many threads each starting an OpenMP team oversubscribe the CPU, and on
    a busy machine a team's barriers turn a 0.2 ms call into tens of
    milliseconds. What these checks measure (races, leaks per call) does not
    depend on torch's own threads.
    """
    intra_op = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(intra_op)


# --- values ----------------------------------------------------------------------------


def _clone(tree: Any) -> Any:
    return tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, tree)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _difference(a: Any, b: Any) -> float | None:
    """None if bit-identical, else the max absolute difference (inf for shape, dtype or NaN changes)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None if type(a) is type(b) and a == b else float("inf")
    if a.dtype != b.dtype or a.shape != b.shape:
        return float("inf")
    if a.is_floating_point() and a.element_size() in _SAME_SIZE_INT:
        bits = _SAME_SIZE_INT[a.element_size()]
        if torch.equal(a.contiguous().view(bits), b.contiguous().view(bits)):
            return None
    elif torch.equal(a, b):
        return None
    diff = (a.double() - b.double()).abs().nan_to_num(nan=float("inf"))
    return float(diff.max()) if diff.numel() else float("inf")


def _tree_difference(a: Any, b: Any) -> float | None:
    leaves_a, leaves_b = tree_leaves(a), tree_leaves(b)
    if len(leaves_a) != len(leaves_b):
        return float("inf")
    diffs = [d for d in map(_difference, leaves_a, leaves_b) if d is not None]
    return max(diffs) if diffs else None
