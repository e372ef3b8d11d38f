"""The backend host: the conformance checks run in a child process, so that a backend that crashes,
hangs or leaks fails the check it was in, not the run.

Each pytest process (each pytest-xdist worker) keeps one host child
(`pytest_backendconf.target._child`). The host builds the same `SuiteContext` and
the same checks from the same spec data as the pytest process, keeps its
export and lowering caches across checks, and runs one check per request,
by id. Before every call into the backend it sends a breadcrumb (``execute
of method 'forward', inputs float32[1, 3, 8, 8]``), so that when it dies the
parent can say which call killed it. The parent:

- reports a host that died (exit code or signal) as a failure of the check
  it was running, with the model, dtype and last backend call, and starts a
  fresh host for the next check;
- kills a host whose check takes longer than ``--backendconf-timeout`` and
  fails that check;
- kills a host whose memory grows past ``--backendconf-max-rss`` and fails
  the check during which it crossed the limit, with the growth measured;
- remembers a lowered model that hung (or crashed the same way twice): the
  later checks that would run it again fail at once, naming the check that
  hung, instead of each waiting for its own timeout (`ModelMemory`);
- once a backend has hung, gives each later check a shorter timeout: three
  times the slowest check that finished so far, at least
  `AFTER_HANG_FLOOR` seconds. A backend that hangs on one operator hangs on
  every model containing it; each of those then costs seconds, not the
  whole ``--backendconf-timeout``.

Under pytest-xdist the workers share what they learn of hangs through a
folder of the run (`ModelMemory`'s ``shared``): a model that hung in one
worker is not run again in another, and the shorter timeout applies in every
worker after the first hang anywhere, so a run pays the full timeout once,
not once per worker.

Categories need nothing special: whatever `generate_checks` yields runs here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..checks import NOT_RUN_AGAIN, Check, CheckOutcome, outcome_from_json, outcome_to_json
from ._options import SuiteOptions, options_from_json, options_to_json
from ._outcome import run_check

if TYPE_CHECKING:
    from ..backend import Backend
    from ..target import Channel, ChildProcess, Ended

#: Per-check seconds before the host is killed and the check fails (``--backendconf-timeout``).
DEFAULT_TIMEOUT = 120.0
#: The host's resident memory limit in MiB (``--backendconf-max-rss``).
DEFAULT_MAX_RSS_MIB = 4096
#: Seconds a fresh host may take to import torch and the backend and build the checks.
STARTUP_TIMEOUT = 300.0
#: After a hang, the shortest per-check timeout (the slowest finished check times three, at least this).
AFTER_HANG_FLOOR = 10.0
#: After a hang, a check's timeout is this many times the slowest check that finished so far.
AFTER_HANG_FACTOR = 3.0


class BackendHost:
    """The pytest process's side: runs checks by id in a host child, replacing it when it dies."""

    def __init__(
        self, options: SuiteOptions, *, timeout: float | None, max_rss: int | None, shared: str | None = None
    ) -> None:
        """:param options: the run's options, from which the host builds the same suite as the pytest process.
        :param shared: a folder every pytest process of the run shares (the hangs each one saw).
        """
        self.options = options
        self.timeout = timeout
        self.max_rss = max_rss
        self._child: ChildProcess | None = None
        #: A host started ahead of need once the backend has hung (the next kill is likely).
        self._spare: ChildProcess | None = None
        self._broken: CheckOutcome | None = None
        self._lock = threading.Lock()
        #: How many hosts were started (a crash, a hang or the memory limit starts another; after a hang,
        #: one more is kept ready).
        self.started = 0
        #: Exports and cached programs the hosts counted (for the benchmarks; this process exports nothing).
        self.exports = 0
        self.programs: set[tuple] = set()
        #: The lowered models that hung or crashed deterministically in this process's hosts.
        self.models = ModelMemory(shared)
        #: Seconds of the slowest check that finished (the timeout after a hang is measured against it).
        self.slowest = 0.0
        #: What the hosts' preprocess cache found (`lowering.PreprocessCache.counts`), summed.
        self.cache_counts: dict[str, int] = {}

    def add_cache_counts(self, counts: object) -> None:
        """Add a host's preprocess-cache counts of one request (numbers only: it is the child's answer)."""
        if isinstance(counts, dict):
            for what, n in counts.items():
                if isinstance(what, str) and type(n) is int:
                    self.cache_counts[what] = self.cache_counts.get(what, 0) + n

    def check_timeout(self) -> float | None:
        """The timeout of the next check: ``--backendconf-timeout``, shortened once the backend has hung."""
        if not self.timeout or not self.models.hung:
            return self.timeout
        return min(self.timeout, max(AFTER_HANG_FLOOR, AFTER_HANG_FACTOR * self.slowest))

    def run(
        self, check_id: str, subject: str, model: tuple[str, ...] | None = None, *, runs_backend: bool = True
    ) -> CheckOutcome:
        """The check's outcome, as the host decided it or as its death decides it.

        :param subject: what the check was on (model, dtype), for the message when the host dies.
        :param model: the lowered model the check runs (`model_key`), None for a check of no one model.
        :param runs_backend: whether the check compiles or executes the model (else it only lowers it).
        """
        from ..target import Ended

        with self._lock:
            if self._broken is not None:  # it cannot start: every check would pay for finding out again
                return self._broken
            known = self.models.blocked(model, runs_backend)
            if known is not None:
                return known
            if self._child is None or not self._child.alive:
                spare, self._spare = self._spare, None
                self._child = spare if spare is not None and spare.alive else self._start()
            if self.models.hung and (self._spare is None or not self._spare.alive):
                # After a hang, hosts get killed again and again: a spare started now, while this check
                # runs, is ready when the next one needs it, instead of each paying for a torch import.
                self._spare = self._start()
            child = self._child
        calls: list[dict] = []
        if not child.wait_ready():  # the memory at the start is the host's, not a half-started interpreter's
            ended = child.ended
            assert ended is not None  # not ready: it ended
            self._broken = CheckOutcome.failure(
                self._died(ended, check_id, subject, [], None, None, at_setup=True),
                "BackendHostDied",
                __name__,
                ended.describe(),
            )
            return self._broken
        mark = child.stderr_mark()
        peak: dict[str, int | None] = {"rss": None}
        start_rss = child.rss()

        def watch() -> str | None:
            rss = child.rss()
            if rss is not None:
                peak["rss"] = max(rss, peak["rss"] or 0)
            if self.max_rss and rss is not None and rss > self.max_rss:
                return f"its memory grew past --backendconf-max-rss ({_mib(rss)} > {_mib(self.max_rss)})"
            return None

        timeout = self.check_timeout()
        started = time.monotonic()
        result = child.request({"check": check_id}, timeout=timeout, on_record=calls.append, watch=watch)
        stderr = child.stderr_since(mark)
        if not isinstance(result, Ended):
            self.slowest = max(self.slowest, time.monotonic() - started)
        if isinstance(result, Ended):
            with self._lock:
                self._child = None
                self.models.ended(model, check_id, result, calls, self._timeout_source(result, short=True))
            return CheckOutcome.failure(
                self._died(result, check_id, subject, calls, start_rss, peak["rss"]),
                "BackendHostDied",
                __name__,
                result.describe(),
                # How it ended, for the minimal reproduction: the same exit signal, or a hang.
                ended={
                    "returncode": result.returncode,
                    "timed_out": result.timed_out,
                    "killed_because": result.killed_because,
                },
            )
        self.exports += result.get("exports", 0)
        self.programs.update(tuple(p) for p in result.get("programs", []))
        self.add_cache_counts(result.get("cache"))
        outcome = dataclasses.replace(outcome_from_json(result["check"]), stderr=stderr)
        rss = child.rss()
        if self.max_rss and rss is not None and rss > self.max_rss:
            # Past the limit after the check: this check pushed it over. The next check gets a fresh host.
            with self._lock:
                self._child = None
            child.kill(killed_because="memory limit")
            grew = f" (this check: {_mib(start_rss)} → {_mib(rss)})" if start_rss is not None else ""
            return CheckOutcome.failure(
                f"the process running the checks grew past --backendconf-max-rss={_mib(self.max_rss)} "
                f"during this check, to {_mib(rss)}{grew}; it was replaced by a fresh one. A backend that keeps "
                f"memory per call shows up here first (reliability::memory_stays_flat names the leak). "
                f"{_subject_text(subject, calls)}"
                + (
                    f"\nthe check's own outcome was {outcome.outcome}: {outcome.message}"
                    if outcome.outcome != "passed"
                    else ""
                ),
                "BackendHostMemoryLimit",
                __name__,
                f"RSS {_mib(rss)}",
                stderr=stderr,
                warnings=outcome.warnings,
            )
        return outcome

    def run_batch(self, check_ids: list[str]) -> dict[str, Any] | None:
        """Run several checks as one batch (`_batching`); None when the host died or broke meanwhile.

        A host that dies in a batch is replaced and nobody is blamed: the
        caller runs every member alone, where a crash or hang is the check's
        own. The batch gets the per-check timeout; one that takes longer is
        killed and its members run alone.
        """
        from ..target import Ended

        with self._lock:
            if self._broken is not None:
                return None
            if self._child is None or not self._child.alive:
                self._child = self._start()
            child = self._child
        if not child.wait_ready():
            return None  # the next check alone reports why the host cannot start
        result = child.request({"batch": check_ids}, timeout=self.check_timeout(), watch=self._rss_limit(child))
        if isinstance(result, Ended):
            with self._lock:
                self._child = None
            return None
        rss = child.rss()
        if self.max_rss and rss is not None and rss > self.max_rss:
            with self._lock:
                self._child = None
            child.kill(killed_because="memory limit")
            return None
        self.add_cache_counts(result.get("cache"))
        batch = result.get("batch")
        return batch if isinstance(batch, dict) else None

    def _rss_limit(self, child: ChildProcess) -> Callable[[], str | None]:
        def watch() -> str | None:
            rss = child.rss()
            if self.max_rss and rss is not None and rss > self.max_rss:
                return f"its memory grew past --backendconf-max-rss ({_mib(rss)} > {_mib(self.max_rss)})"
            return None

        return watch

    def _died(
        self,
        ended: Ended,
        check_id: str,
        subject: str,
        calls: list[dict],
        start_rss: int | None,
        peak: int | None,
        *,
        at_setup: bool = False,
    ) -> str:
        from ..target import tail_text

        stderr = f"\nits stderr ended with:\n{tail_text(ended.stderr.strip(), 3000)}" if ended.stderr.strip() else ""
        if at_setup:
            why = (
                f"{ended.setup_error['type']}: {ended.setup_error['message']}"
                if ended.setup_error is not None
                else f"it {ended.describe()}"
            )
            return (
                f"the suite could not be set up in its child process (the backend host): {why}\nThe checks "
                "run in a child process that imports the plugins that registered the backend (conftest files, "
                "-p modules, entry points) and builds the same checks; --backendconf-in-process runs them in "
                "the pytest process instead." + stderr
            )
        if ended.timed_out is not None:
            head = (
                f"{check_id} did not finish within {ended.timed_out:g} s ({self._timeout_source(ended)}); the "
                "process running it was killed"
            )
        elif ended.killed_because:
            grew = f" (from {_mib(start_rss)} at the start of this check)" if start_rss is not None else ""
            head = f"the process running {check_id} was killed: {ended.killed_because}{grew}"
        else:
            head = (
                f"the backend took down the process running {check_id}: it {ended.describe()} — in the "
                "pytest process this would have ended the whole run. A backend must report failures as "
                "exceptions (BackendError), never by crashing its host process"
            )
        return f"{head}.\n{_subject_text(subject, calls)}\nA fresh process runs the next checks.{stderr}"

    def _timeout_source(self, ended: Ended, *, short: bool = False) -> str:
        if self.timeout and ended.timed_out is not None and ended.timed_out < self.timeout:
            if short:
                return "a timeout shortened after an earlier hang"
            return (
                f"shortened from --backendconf-timeout={self.timeout:g} after an earlier hang: "
                f"{AFTER_HANG_FACTOR:g} times the slowest finished check, at least {AFTER_HANG_FLOOR:g} s; "
                "its reproduce command runs it alone with the full timeout"
            )
        return "--backendconf-timeout"

    def _start(self) -> ChildProcess:
        from ..target import ChildProcess

        self.started += 1
        return ChildProcess(
            "pytest_backendconf.suite._host:HostHandler", options_to_json(self.options), startup_timeout=STARTUP_TIMEOUT
        )

    def close(self) -> None:
        with self._lock:
            children = [self._child, self._spare]
            self._child = self._spare = None
        for child in children:
            if child is not None:
                child.close()


class ModelMemory:
    """The lowered models that hung, or crashed the same way twice, in this pytest process's hosts.

    A lowered model is a case in one dtype (all its methods are lowered
    together), or one operator overload in one dtype for the ``ops`` category
    (its samples differ in shapes only). A hang is remembered at once: the
    next check on that model would wait for the same timeout. A crash is
    remembered only when it is deterministic: the same model ended the host
    the same way (the same exit code or signal) in the same backend call
    (preprocess, compile or execute) twice; one crash may be a flaky driver.
    What a hang or crash in ``preprocess`` blocks is every later check on the
    model; one in ``compile`` or ``execute`` blocks the checks that run the
    model on the backend (not those that only lower it).
    """

    def __init__(self, shared: str | os.PathLike[str] | None = None) -> None:
        """:param shared: a folder the run's pytest processes share: each hang is written there as a file,
        and the hangs of the other processes are read from it (pytest-xdist workers learn of each other's).
        """
        self._known: dict[tuple[str, ...], dict[str, str]] = {}
        self._crashes: dict[tuple[str, ...], dict[tuple[str, str], str]] = {}
        self._shared = os.fspath(shared) if shared is not None else None
        #: How many checks failed at once instead of running (each would have waited or crashed again).
        self.saved = 0
        self._hung = False

    @property
    def hung(self) -> bool:
        """Whether a backend call has hung in this run (later checks get a shorter timeout)."""
        if not self._hung and self._shared is not None:
            self._read_shared()
        return self._hung

    @hung.setter
    def hung(self, value: bool) -> None:
        self._hung = value

    def _write_shared(self, model: tuple[str, ...], record: dict[str, str]) -> None:
        if self._shared is None:
            return
        try:
            os.makedirs(self._shared, exist_ok=True)
            name = hashlib.sha256(repr(model).encode()).hexdigest()[:16]
            final = os.path.join(self._shared, f"{name}.json")
            partial = f"{final}.{os.getpid()}.partial"  # renamed into place: a reader never sees half a file
            with open(partial, "w", encoding="utf-8") as out:
                json.dump({"model": list(model), **record}, out)
            os.replace(partial, final)
        except OSError:
            pass  # sharing saves time only: without it each worker finds the hang for itself

    def _read_shared(self) -> None:
        assert self._shared is not None
        try:
            names = [n for n in os.listdir(self._shared) if n.endswith(".json")]
        except OSError:
            return
        for name in names:
            try:
                with open(os.path.join(self._shared, name), encoding="utf-8") as file:
                    record = json.load(file)
                model = tuple(str(part) for part in record.pop("model"))
                entry = {key: str(record[key]) for key in ("check", "how", "call", "kind")}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # a file this run did not write whole: ignore it
            self._known.setdefault(model, entry)
            self._hung = True

    def ended(
        self,
        model: tuple[str, ...] | None,
        check_id: str,
        ended: Ended,
        calls: list[dict],
        timeout_source: str = "--backendconf-timeout",
    ) -> None:
        """Note how the host running ``check_id`` on ``model`` ended (``timeout_source``: what set its timeout)."""
        crumbs = [c for c in calls if c.get("kind") == "call"]
        if model is None or not crumbs or ended.killed_because or ended.setup_error is not None:
            return  # no backend call was running: the hang or crash is not the model's
        last = crumbs[-1]
        call = f"{last['call']}(){' ' + last['detail'] if last.get('detail') else ''}"
        if ended.timed_out is not None:
            self._hung = True
            how = f"did not finish within {ended.timed_out:g} s ({timeout_source})"
            record = {"check": check_id, "how": how, "call": call, "kind": last["call"]}
            self._known.setdefault(model, record)
            self._write_shared(model, record)
            return
        seen = self._crashes.setdefault(model, {})
        key = (ended.describe(), last["call"])
        if key in seen and seen[key] != check_id:
            how = f"took down its process the same way twice (it {ended.describe()}; also in {seen[key]})"
            self._known.setdefault(model, {"check": check_id, "how": how, "call": call, "kind": last["call"]})
        seen.setdefault(key, check_id)

    def known(self, model: tuple[str, ...] | None) -> dict[str, str] | None:
        """What is remembered of a model that hung or crashed deterministically, or None."""
        return self._known.get(model) if model is not None else None

    def blocked(self, model: tuple[str, ...] | None, runs_backend: bool) -> CheckOutcome | None:
        """The failure of a check on a model that hung or crashed before, or None: run it."""
        if model is not None and model not in self._known and self._shared is not None:
            self._read_shared()  # another pytest process of the run may have seen it hang
        known = self._known.get(model) if model is not None else None
        if model is None or known is None or (known["kind"] != "preprocess" and not runs_backend):
            return None
        self.saved += 1
        what = f"{model[0]} {model[1]}" + (f" in {model[2]}" if len(model) > 2 and model[2] else "")
        return CheckOutcome.failure(
            f"not run: the lowered {what} {known['how']} in {known['check']}, during "
            f"{known['call']}; this check would run that model again, so it fails at once instead of "
            f"waiting for it. Fix that first: run {known['check']} alone (its reproduce command), then "
            "this one.",
            NOT_RUN_AGAIN,
            __name__,
            f"{known['check']}: {known['how']}",
        )


def model_key(category: str, name: str, case: str | None, dtype: str | None) -> tuple[str, ...] | None:
    """The lowered model a check runs: ``("model", case, dtype)`` or ``("operator", overload, dtype)``.

    None for a check of no one model (the backend as a whole), whose hang says nothing about others.
    """
    if case is not None:
        return ("model", case, dtype or "")
    if category == "ops":
        from ..report import parse_ops_id

        parsed = parse_ops_id(f"ops::{name}")
        if parsed is not None:
            return ("operator", parsed[0], parsed[1])
    return None


def _subject_text(subject: str, calls: list[dict]) -> str:
    crumbs = [c for c in calls if c.get("kind") == "call"]
    if not crumbs:
        return f"Subject: {subject}; no backend call had started in this check."
    last = crumbs[-1]
    return (
        f"Subject: {subject}; the last backend call was {last['call']}(){' ' + last['detail'] if last['detail'] else ''}"
        f" (backend call {len(crumbs)} of this check)."
    )


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


# --- the host child --------------------------------------------------------------------------------


class HostHandler:
    """In the child: the suite as the pytest process built it; runs one check per request."""

    def __init__(self, options: dict[str, Any], channel: Channel) -> None:
        from .. import _compat
        from ..registry import BackendRegistry, active_registry, set_active_registry
        from ._context import build_context
        from ._categories import generate_checks

        opts = options_from_json(options)
        # torch's thread count is the pytest process's already: the child protocol set it (`target._child`).
        # torch.export's first use imports its tracing machinery (seconds): do it while starting, so
        # that the first check's --backendconf-timeout measures the check, not the import.
        _compat.import_export_tracer()
        registry = active_registry() or BackendRegistry()
        registry.load_entry_points(select=opts.backend)
        set_active_registry(registry)
        tmp_root = opts.tmp_root if opts.tmp_root and os.path.isdir(opts.tmp_root) else None

        def tmp_dir(name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=f"{name}-host-", dir=tmp_root))

        self.ctx = build_context(opts, registry, tmp_dir)
        self.checks: dict[str, Check] = {c.id: c for c in generate_checks(self.ctx)}
        self._reported: set[tuple] = set()
        self._cache_reported: dict[str, int] = {}
        install_breadcrumbs(self.ctx.backend, channel)

    def __call__(self, request: dict[str, Any], channel: Channel) -> dict[str, Any]:
        """``{"check": outcome_to_json(outcome), "exports": n, "programs": [...]}``; a batch's answer for a batch."""
        if "batch" in request:
            return {**self.batch(request["batch"]), "cache": self._cache_counts()}
        check = self.checks.get(request["check"])
        if check is None:
            missing = CheckOutcome.failure(
                f"the backend host has no check {request['check']!r}: it generated "
                "other checks than the pytest process (do the plugins register cases differently in a child "
                "process?)",
                "LookupError",
                "builtins",
                request["check"],
            )
            return {"check": outcome_to_json(missing)}
        exports = self.ctx.export_count
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome = run_check(check, self.ctx)
        new = [k for k in self.ctx.program_keys() if k not in self._reported]
        self._reported.update(new)
        seen: dict[tuple, dict] = {}
        for w in caught:
            record = {
                "category": w.category.__name__,
                "module": w.category.__module__,
                "message": str(w.message),
                "filename": w.filename,
                "lineno": w.lineno,
            }
            seen.setdefault((record["category"], record["message"], record["filename"], record["lineno"]), record)
        outcome = dataclasses.replace(outcome, warnings=tuple(list(seen.values())[:20]))
        return {
            "check": outcome_to_json(outcome),
            "exports": self.ctx.export_count - exports,
            "programs": [list(k) for k in new],
            "cache": self._cache_counts(),
        }

    def _cache_counts(self) -> dict[str, int]:
        """The preprocess cache's counts since the last answer (empty without a cache)."""
        from ..lowering import active_cache

        cache = active_cache()
        if cache is None:
            return {}
        counts = dict(cache.counts)
        before, self._cache_reported = self._cache_reported, counts
        return {what: n - before.get(what, 0) for what, n in counts.items()}

    def batch(self, check_ids: list[str]) -> dict[str, Any]:
        """Several checks lowered as one (`_batching`): ``{"batch": {"decided", "alone", "split"}}``."""
        found = [self.checks.get(i) for i in check_ids]
        checks = [c for c in found if c is not None and c.batch is not None]
        batching = checks[0].batch if checks else None
        if batching is None or len(checks) != len(found):
            return {"batch": None}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a member run alone reports its own warnings
            try:
                return {"batch": batching.run(self.ctx, checks)}
            except Exception:  # the runner broke: the members run alone
                return {"batch": None}


def install_breadcrumbs(backend: Backend, channel: Channel) -> None:
    """Send a record before every call into the backend: the parent names the last one if the host dies.

    The methods are wrapped on the backend's class, so that the suite's
    stand-ins (subclasses that call the class's methods) leave breadcrumbs too.
    """
    cls = type(backend)
    methods: dict[int, str] = {}

    def describe(name: str, args: tuple) -> str:
        if name == "compile" and args and isinstance(args[0], dict):
            return f"of method(s) {', '.join(map(repr, args[0]))}"
        if name == "execute" and len(args) >= 2:
            method = methods.get(id(args[0]))
            where = f"of method {method!r}, " if method else ""
            return f"{where}inputs {_describe_inputs(args[1])}"
        if name == "preprocess" and len(args) >= 2 and isinstance(args[1], dict) and args[1]:
            return f"with compile spec keys {sorted(map(str, args[1]))}"
        return ""

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            channel.send({"kind": "call", "call": name, "detail": describe(name, args)})
            result = original(self, *args, **kwargs)
            if name == "compile" and isinstance(result, dict):
                methods.update({id(handle): method for method, handle in result.items()})
            return result

        wrapper.__backendconf_breadcrumb__ = True  # type: ignore[attr-defined]
        return wrapper

    for name in ("preprocess", "compile", "execute"):
        original = getattr(cls, name, None)
        if callable(original) and not getattr(original, "__backendconf_breadcrumb__", False):
            try:
                setattr(cls, name, wrap(name, original))
            except (TypeError, AttributeError):  # a class that cannot be patched: no breadcrumbs for it
                print(f"backendconf: cannot follow {cls.__name__}.{name} calls", file=sys.stderr)


def _describe_inputs(inputs: object) -> str:
    parts = []
    for value in list(inputs)[:6] if isinstance(inputs, (list, tuple)) else []:
        dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
        if dtype is not None and shape is not None:
            parts.append(f"{str(dtype).removeprefix('torch.')}{list(shape)}")
        else:
            parts.append(type(value).__name__)
    more = ", …" if isinstance(inputs, (list, tuple)) and len(inputs) > 6 else ""
    return "[" + ", ".join(parts) + more + "]"
