"""availability: the host/target tables of docs/backend-contract.md#availability, one check per row of ``availability.toml``.

Each row is put into effect with a *stand-in*: a copy of the vendor's backend
whose class overrides ``is_available``/``compile``/``execute`` to force the
row's condition and count calls. Host rows run in this process. Target rows
load archives in the session's extra process (`ExtraProcess`), where the
backend's host-only modules and torch's tracing modules cannot be imported
and the stand-in is registered under the backend's name. The serialization
category sends its target loads and fresh lowerings to the same process.

That process is a `pytest_backendconf._child` child running `ExtraProcessHandler`.
"""

from __future__ import annotations

import atexit
import collections
import copy
import dataclasses
import functools
import os
import sys
import threading
import time
import warnings
import weakref
from importlib import resources
from typing import Any, Iterator

import torch

from pytest_backendconf import _archive, _registry, _target
from pytest_backendconf._check import Check, Unsupported, fail
from pytest_backendconf.errors import (
    BackendContractError,
    BackendUnavailableError,
    BackendUnavailableWarning,
    UnsupportedNodeError,
)

from ._session_work import FreshLowerer, Lowering, Scenario, items_at_hand
from ._spec import section

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.cache
def table() -> dict[str, Any]:
    """``availability.toml``: ``texts`` and the ``row`` list, in table order."""
    return tomllib.loads(resources.files(__package__).joinpath("availability.toml").read_text())


def checks(ctx: Any) -> Iterator[Check]:
    for row in table()["row"]:
        yield Check(
            "availability",
            row["id"],
            functools.partial(OUTCOMES[row["expect"]], row=row),
            stage="is_available" if row["where"] == "host" else "target",
            # A row whose stand-in decides is_available() runs wherever the backend is; the others
            # need the backend itself available.
            needs_available=row.get("stand_in", {}).get("available", "backend") == "backend",
        )


# --- the stand-in -------------------------------------------------------------------------


class StandIn:
    """A copy of ``backend`` that forces availability conditions and counts calls.

    The copy's class is a subclass of the backend's own, so the backend's own
    code sees the forced answers too (a ``preprocess`` that asks
    ``self.is_available()`` gets the simulated answer). Objects whose class
    cannot be swapped get a delegating proxy with the same name and methods.

    :param available: ``True``, ``False``, or ``"backend"`` (ask the backend).
    :param compile: ``"backend"`` or ``"fails"``; so is ``execute``.
    """

    def __init__(
        self,
        backend: Any,
        *,
        available: Any = "backend",
        compile: str = "backend",
        execute: str = "backend",
        row: str = "",
    ) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.row = row
        base = type(backend)
        stand = self

        def is_available(this: Any) -> Any:
            stand.calls["is_available"] += 1
            return base.is_available(this) if available == "backend" else available

        def compile_(this: Any, processed: dict, method_compile_spec: dict) -> Any:
            stand.calls["compile"] += 1
            if compile == "fails":
                raise RuntimeError(stand.simulated("compile()"))
            return base.compile(this, processed, method_compile_spec)

        def execute_(this: Any, handle: Any, inputs: list) -> Any:
            stand.calls["execute"] += 1
            if execute == "fails":
                raise RuntimeError(stand.simulated("execute()"))
            return base.execute(this, handle, inputs)

        def unavailable_reason(this: Any) -> str:
            if available is False:
                return f"simulated by pytest-backendconf for availability row {row}"
            explain = getattr(base, "unavailable_reason", None)
            return explain(this) if callable(explain) else ""

        overrides = {
            "is_available": is_available,
            "compile": compile_,
            "execute": execute_,
            "unavailable_reason": unavailable_reason,
        }
        try:
            # __slots__ = () keeps the layout, so __class__ can be assigned.
            cls = type(base.__name__, (base,), {**overrides, "__slots__": (), "__module__": base.__module__})
            obj = copy.copy(backend)
            obj.__class__ = cls
        except Exception:  # slots, metaclasses, uncopyable state: fall back to delegating
            obj = _Delegate(backend, overrides)
        self.backend = obj

    def simulated(self, what: str) -> str:
        return f"simulated by pytest-backendconf: {what} cannot work here (availability row {self.row})"

    def expect_no_calls(self, where: str, *methods: str) -> None:
        called = {m: self.calls[m] for m in methods if self.calls[m]}
        if called:
            fail(
                f"{where}: {', '.join(f'{m}() was called {n} time(s)' for m, n in called.items())} although "
                "is_available() returned False; docs/backend-contract.md#availability forbids calling them then"
            )


class _Delegate:
    """The stand-in for a backend whose class cannot be subclassed in place."""

    def __init__(self, backend: Any, overrides: dict[str, Any]) -> None:
        self._backend = backend
        self.name = backend.name
        self.capabilities = getattr(backend, "capabilities", None)
        for name, function in overrides.items():
            setattr(self, name, functools.partial(function, backend))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class _PreprocessOnly:
    """The backend, but unavailable to the lowering: it preprocesses and never compiles.

    Target rows get their archives this way, so that their verdict does not
    depend on the host compiling. The backend's own code is not affected.
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.name = backend.name

    def is_available(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def load_with(backend: Any, data: bytes) -> Any:
    """`pytest_backendconf.load` of ``data``, with ``backend`` instead of the registered one."""
    return _archive.read_archive(data).instantiate(backend)


# --- host rows ---------------------------------------------------------------------------


def subjects(ctx: Any) -> list[tuple[str, str]]:
    """(case, dtype) pairs the rows are checked with: suite.toml's cases, first dtype each."""
    found = []
    for name in section("availability")["cases"]:
        if ctx.first_dtype(name) is not None:
            found.append((name, ctx.first_dtype(name)))
    if not found:
        raise Unsupported(
            f"none of the availability cases {section('availability')['cases']} runs in a dtype the backend declares"
        )
    return found


def calls_for(ctx: Any, case: str, dtype: str) -> dict[str, list[tuple[tuple, dict]]]:
    """Per method, the example calls every row makes (one per seed in suite.toml)."""
    seeds = section("availability")["seeds"]
    return {m: [ctx.example(case, dtype, m, seed=s) for s in seeds] for m in ctx.cases[case].methods}


def _lower(ctx: Any, case: str, dtype: str, backend: Any) -> tuple[Any, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = ctx.lower(case, dtype, backend=backend)
    return lowered, caught


def _each_supported(ctx: Any, check: Any) -> None:
    """Run ``check(case, dtype)`` for every subject; unsupported only if the backend rejects all."""
    rejected = []
    for case, dtype in subjects(ctx):
        try:
            check(case, dtype)
        except UnsupportedNodeError as exc:
            rejected.append(f"{case}: {Unsupported.from_rejection(exc)}")
    if len(rejected) == len(subjects(ctx)):
        raise Unsupported("; ".join(rejected))


def unavailable_on_host(ctx: Any, *, row: dict) -> None:
    texts = table()["texts"]
    warning = texts["warning"].format(name=ctx.name)

    def check(case: str, dtype: str) -> None:
        where = f"row {row['id']}, {case} ({dtype})"
        stand_in = StandIn(ctx.backend, **row["stand_in"], row=row["id"])
        try:
            lowered, caught = _lower(ctx, case, dtype, stand_in.backend)
        except UnsupportedNodeError:
            raise
        except Exception as exc:
            stand_in.expect_no_calls(f"{where}, lowering", "compile", "execute")
            fail(
                f"{where}: with is_available() False, lowering must succeed with a BackendUnavailableWarning; "
                f"it raised {type(exc).__name__}: {exc}"
            )
        texts_seen = [str(w.message) for w in caught if issubclass(w.category, BackendUnavailableWarning)]
        if not any(warning in t for t in texts_seen):
            others = [f"{w.category.__name__}: {w.message}" for w in caught]
            fail(f"{where}: lowering did not warn {warning!r}; warnings seen: {others or 'none'}")
        stand_in.expect_no_calls(f"{where}, lowering", "compile", "execute")
        try:
            data = _archive.to_bytes(lowered)
        except Exception as exc:
            fail(f"{where}: saving the module lowered while unavailable raised {type(exc).__name__}: {exc}")
        _expect_unavailable(f"{where}: loading the saved archive", lambda: load_with(stand_in.backend, data))
        for method, [(args, kwargs), *_] in calls_for(ctx, case, dtype).items():
            _expect_unavailable(
                f"{where}: calling {method}()", lambda m=method, a=args, k=kwargs: getattr(lowered, m)(*a, **k)
            )
        stand_in.expect_no_calls(f"{where}, load and call", "compile", "execute")

    _each_supported(ctx, check)


def _expect_unavailable(what: str, action: Any) -> None:
    prefix = table()["texts"]["unavailable_error"]
    try:
        action()
    except BackendUnavailableError as exc:
        if not str(exc).startswith(prefix):
            fail(f"{what} raised BackendUnavailableError, but its text does not start {prefix!r}: {exc}")
        return
    except Exception as exc:
        fail(f"{what} must raise BackendUnavailableError starting {prefix!r}; it raised {type(exc).__name__}: {exc}")
    fail(f"{what} succeeded; with is_available() False it must raise BackendUnavailableError starting {prefix!r}")


def violation_on_host(ctx: Any, *, row: dict) -> None:
    violation = table()["texts"]["violation"]

    def check(case: str, dtype: str) -> None:
        where = f"row {row['id']}, {case} ({dtype})"
        stand_in = StandIn(ctx.backend, **row["stand_in"], row=row["id"])
        try:
            _lower(ctx, case, dtype, stand_in.backend)
        except UnsupportedNodeError:
            raise
        except BackendContractError as exc:
            if violation not in str(exc):
                fail(f"{where}: the BackendContractError does not name {violation!r}: {exc}")
        except Exception as exc:
            fail(
                f"{where}: is_available() True with compile() failing must be reported as a "
                f"BackendContractError naming {violation!r}; lowering raised {type(exc).__name__}: {exc}"
            )
        else:
            fail(
                f"{where}: is_available() returned True and compile() raised ({stand_in.calls['compile']} "
                "call(s)), yet lowering returned a module: the contract violation was not reported"
            )
        if stand_in.calls["execute"]:
            fail(f"{where}: execute() was called {stand_in.calls['execute']} time(s) after compile() failed")

    _each_supported(ctx, check)


def compiles_once(ctx: Any, *, row: dict) -> None:
    if ctx.backend.is_available() is not True:
        raise Unsupported(
            f"backend {ctx.name!r} reports is_available() == False on this host, so row {row['id']} "
            "cannot be shown here; run the suite where the backend is available"
        )

    def check(case: str, dtype: str) -> None:
        where = f"row {row['id']}, {case} ({dtype})"
        stand_in = StandIn(ctx.backend, row=row["id"])
        try:
            lowered, caught = _lower(ctx, case, dtype, stand_in.backend)
        except UnsupportedNodeError:
            raise
        except Exception as exc:
            fail(f"{where}: is_available() returned True on this host, but lowering raised {type(exc).__name__}: {exc}")
        warned = [str(w.message) for w in caught if issubclass(w.category, BackendUnavailableWarning)]
        if warned:
            fail(f"{where}: is_available() returned True, yet lowering warned: {warned[0]}")
        if stand_in.calls["compile"] != 1:
            fail(
                f"{where}: compile() was called {stand_in.calls['compile']} time(s) while lowering; "
                "with the backend available it must be called exactly once, with every method's blob"
            )
        calls = calls_for(ctx, case, dtype)
        for method, examples in calls.items():
            for seed, (args, kwargs) in zip(section("availability")["seeds"], examples):
                actual = getattr(lowered, method)(*args, **kwargs)
                _match_eager(ctx, case, dtype, method, seed, args, kwargs, actual, where)
        if stand_in.calls["compile"] != 1:
            fail(
                f"{where}: calls compiled again: compile() ran {stand_in.calls['compile']} times in all; "
                "a module compiled at lowering must reuse its handles"
            )

    _each_supported(ctx, check)


def _match_eager(
    ctx: Any, case: str, dtype: str, method: str, seed: int, args: tuple, kwargs: dict, actual: Any, where: str
) -> None:
    from .parity import tolerance  # parity imports Hypothesis: not in the target process

    expected = getattr(ctx.module(case, dtype), method)(*args, **kwargs)
    rtol, atol = tolerance(ctx, dtype)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        fail(
            f"{where}: {case}.{method} (example seed {seed}) differs from eager PyTorch "
            f"(rtol={rtol}, atol={atol}):\n{exc}"
        )


# --- the session's extra process ------------------------------------------------------------
#
# Each extra process costs a torch import, and the fresh lowering a torch
# tracing import on top, so one process per session does everything in two
# phases: the *target* phase loads archives with host-only modules blocked
# (the target rows here, the serialization category's round trips), then the
# blocker is lifted and the *host* phase lowers the serialization category's
# cases afresh. Results stream back one JSON line per item, so a check waits
# only for its own. Items a crash or timeout kept from running are retried
# once in a new process, so one defect costs no other check its result.


class ExtraProcess:
    """One child process (`pytest_backendconf._child`) doing a batch of items, read as it goes.

    A scenario's result is ``{"loaded", "error", "outputs", "errors",
    "blocked", "returncode", "stderr"}`` (outputs and errors per method, one
    per call; errors ``{"type", "message"}``); a lowering's is ``{"archive"}``
    (a path) or ``{"error"}``. If the process crashes or times out, the item
    it was on gets that as its error; later items get ``TargetNotRunError``.

    A process started with scenarios only never leaves the target phase, so
    it stays open for more scenarios (`take`): under pytest-xdist each worker
    reaches its models' target checks one model at a time, and a process per
    model (a torch import each) made ``-n 2`` slower than a serial run.
    """

    _live: "weakref.WeakSet[ExtraProcess]" = weakref.WeakSet()

    def __init__(self, ctx: Any, scenarios: list[Scenario], lowerings: list[Lowering], *, timeout: float) -> None:
        from pytest_backendconf._child import ChildProcess

        self.scenarios = sorted(scenarios, key=lambda s: s.last)
        self.lowerings = sorted(lowerings, key=lambda item: item.start)
        self.keys = [s.key for s in self.scenarios] + [item.key for item in self.lowerings]
        self.workdir = str(ctx.tmp_dir("backendconf-process"))
        self.blocked = list(_target.blocked_modules(ctx.capabilities))
        self.timeout = timeout
        self._records: dict[str, dict] = {}
        self._running: str | None = None
        self._end: Any = None
        self._lock = threading.RLock()
        self._deadline = time.monotonic() + timeout
        #: Open for more scenarios: target phase only, and nothing in it that may take it down.
        self.reusable = not self.lowerings and not any(s.last for s in self.scenarios)
        #: The keys of each request not answered yet, in order.
        self._batches: list[list[str]] = [list(self.keys)]
        # A fresh lowering must not depend on the hash seed: a pinned one gets another one there.
        self._child = ChildProcess(
            "pytest_backendconf.conformance.availability:ExtraProcessHandler",
            {"backend": ctx.name, "backend_version": ctx.registered.source.version, "workdir": self.workdir},
            blocked=self.blocked,
            startup_timeout=timeout,
            vary_hash_seed=True,
            refuse_tracing=True,
        )
        self._child.send(
            {
                "scenarios": [_scenario_message(s) for s in self.scenarios],
                "lowerings": [dataclasses.asdict(item) for item in self.lowerings],
            }
        )
        ExtraProcess._live.add(self)
        # Once the session that wanted it is gone, so is a process still working for it.
        weakref.finalize(self, self._child.kill)

    def take(self, scenarios: list[Scenario]) -> bool:
        """Run these scenarios here too, if this process is still open for them (see the class)."""
        with self._lock:
            if not self.reusable or self._end is not None or not self._child.alive or any(s.last for s in scenarios):
                return False
            keys = [s.key for s in scenarios]
            self._child.send({"scenarios": [_scenario_message(s) for s in scenarios], "lowerings": []})
            self.scenarios += scenarios
            self.keys += keys
            self._batches.append(keys)
            self._deadline = time.monotonic() + self.timeout  # each request gets the whole timeout
            return True

    def result(self, key: str) -> dict:
        """The item's result, as soon as the process has sent it."""
        from pytest_backendconf._child import Ended

        with self._lock:
            while key not in self._records and self._end is None:
                record = self._child.receive(max(0.0, self._deadline - time.monotonic()))
                if record is None:
                    self._finish(self._child.kill(timed_out=self.timeout))
                elif isinstance(record, Ended):
                    self._finish(record)
                elif record.get("kind") == "started":
                    self._running = record["key"]
                elif record.get("kind") == "item":
                    self._records[record["key"]] = self._decode(record)
                    self._running = None
                elif record.get("kind") == "result":
                    self._answered(self._batches.pop(0) if self._batches else [])
            return self._records[key]

    def _answered(self, batch: list[str]) -> None:
        """One request is answered: the process is done, or idle until `take` brings more."""
        if not self.reusable:
            self._finish(None)
            return
        for key in batch:  # the handler gave up on the request (its error is in stderr)
            self._records.setdefault(
                key,
                {
                    "loaded": False,
                    "errors": {},
                    "outputs": {},
                    "blocked": self.blocked,
                    "returncode": None,
                    "stderr": self._child.stderr(),
                    "error": {
                        "type": "TargetNotRunError",
                        "message": f"{key} did not run: the process answered "
                        f"without it; stderr: {_target.tail_text(self._child.stderr())}",
                    },
                },
            )

    def _decode(self, record: dict) -> dict:
        from pytest_backendconf._child import unpack_value

        if "outputs" not in record:
            return {k: v for k, v in record.items() if k != "kind"}
        outputs = unpack_value(record["outputs"], "target outputs") if record["outputs"] else {}
        return {
            "loaded": record["loaded"],
            "error": record["error"],
            "outputs": outputs,
            "errors": record["errors"],
            "blocked": self.blocked,
            "returncode": None,
            "stderr": "",
        }

    def _finish(self, ended: Any) -> None:
        """The process is done (``ended`` None: it answered everything it was asked)."""
        self._child.close()
        stderr = self._child.stderr()
        code = ended.returncode if ended is not None else None
        timed_out = ended is not None and ended.timed_out is not None
        self._end = (code, stderr, timed_out)
        for key in self.keys:
            if key in self._records:
                continue
            if ended is not None and ended.setup_error is not None:
                error = {"type": ended.setup_error["type"], "message": ended.setup_error["message"]}
            elif key == self._running:
                how = (
                    f"did not finish within {self.timeout} s and was killed"
                    if timed_out
                    else f"exited with code {code}"
                )
                error = {
                    "type": "TargetTimeoutError" if timed_out else "TargetCrashError",
                    "message": f"the process {how} while on {key}; stderr: {_target.tail_text(stderr)}",
                }
            else:
                error = {
                    "type": "TargetNotRunError",
                    "message": f"{key} did not run: the process ended early (exit code {code}, while on "
                    f"{self._running}); stderr: {_target.tail_text(stderr)}",
                }
            self._records[key] = {
                "loaded": False,
                "error": error,
                "outputs": {},
                "errors": {},
                "blocked": self.blocked,
                "returncode": code,
                "stderr": stderr,
            }

    @classmethod
    def kill_unread(cls) -> None:
        """At exit: a process whose checks were deselected has nobody waiting for it."""
        for extra in list(cls._live):
            extra._child.kill()


atexit.register(ExtraProcess.kill_unread)


class Session:
    """Which process each item was placed in, per suite session; retries items a crash kept from running."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.placed: dict[str, ExtraProcess] = {}
        self.retried: set[str] = set()
        self.lock = threading.RLock()
        #: Processes started (the benchmarks and tests read it).
        self.started = 0
        self._open: ExtraProcess | None = None

    def place(self, scenarios: list[Scenario], lowerings: list[Lowering]) -> None:
        """Start one process for the items not placed yet (none if there are none)."""
        with self.lock:
            scenarios = [s for s in scenarios if s.key not in self.placed]
            lowerings = [item for item in lowerings if item.key not in self.placed]
            if not scenarios and not lowerings:
                return
            if not lowerings and self._open is not None and self._open.take(scenarios):
                self.placed.update({s.key: self._open for s in scenarios})
                return
            timeout = section("availability")["extra_process_timeout"]
            process = ExtraProcess(self.ctx, scenarios, lowerings, timeout=timeout)
            self.started += 1
            if process.reusable:
                self._open = process
            self.placed.update({key: process for key in process.keys})

    def result(self, key: str) -> dict:
        with self.lock:
            process = self.placed[key]
        result = process.result(key)
        if _not_run(result) and key not in self.retried:
            with self.lock:
                if self.placed[key] is process:  # the first to notice retries everything that did not run
                    lost = [s for s in process.scenarios if _not_run(process.result(s.key))]
                    lost_lowerings = [item for item in process.lowerings if _not_run(process.result(item.key))]
                    for item in [*lost, *lost_lowerings]:
                        self.retried.add(item.key)
                        del self.placed[item.key]
                    # Each scenario that may crash gets a process of its own this time.
                    self.place([s for s in lost if not s.last], lost_lowerings)
                    for scenario in (s for s in lost if s.last):
                        self.place([scenario], [])
            return self.result(key)
        return result


def _scenario_message(s: Scenario) -> dict:
    from pytest_backendconf._child import pack_value

    return {
        "key": s.key,
        "archive": s.archive,
        "stand_in": s.stand_in,
        "row": s.row,
        "calls": pack_value(s.calls, f"inputs of {s.key}"),
    }


def _not_run(result: dict) -> bool:
    return bool(result.get("error")) and result["error"]["type"] == "TargetNotRunError"


_SESSIONS: "weakref.WeakKeyDictionary[Any, Session]" = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def session(ctx: Any) -> Session:
    """The session's extra processes; the first use starts one with everything both categories can name now."""
    with _SESSIONS_LOCK:
        if ctx not in _SESSIONS:
            _SESSIONS[ctx] = found = Session(ctx)
            scenarios = availability_scenarios(ctx)
            more_scenarios, lowerings = items_at_hand(ctx)
            found.place(scenarios + more_scenarios, lowerings)
        return _SESSIONS[ctx]


class ExtraProcessHandler:
    """In the child: the target phase with the blocker in place, then the host phase without it."""

    def __init__(self, options: dict, channel: Any) -> None:
        self.registry = _registry._ACTIVE
        self.real = _registry.lookup_backend(options["backend"])
        self.backend_version = options["backend_version"]
        self.workdir = options["workdir"]
        self.channel = channel
        self.blocker = channel.blocker
        _target.prepare_target(channel, self.real.name)

    def __call__(self, request: dict, channel: Any) -> dict:
        for scenario in request["scenarios"]:
            channel.send({"kind": "started", "key": scenario["key"]})
            channel.send(
                {"kind": "item", "key": scenario["key"], **_run_scenario(scenario, self.real.backend, channel)}
            )
        # The host phase: lifting the blocker and the tracing guard lets the compiler and torch's tracing work from here on.
        if self.blocker in sys.meta_path:
            sys.meta_path.remove(self.blocker)
        if channel.tracing_guard is not None:
            channel.tracing_guard.lift()
        _registry.set_active_registry(self.registry)
        if request["lowerings"]:
            try:
                lowerer = FreshLowerer(self.real, self.backend_version, self.registry)
            except Exception as exc:
                for item in request["lowerings"]:
                    channel.send(
                        {"kind": "item", "key": item["key"], "error": f"setting up failed: {type(exc).__name__}: {exc}"}
                    )
                return {}
            for item in request["lowerings"]:
                channel.send({"kind": "started", "key": item["key"]})
                channel.send({"kind": "item", "key": item["key"], **lowerer.lower(item, self.workdir)})
        return {}


def _run_scenario(scenario: dict, backend: Any, channel: Any) -> dict:
    from pytest_backendconf._child import error_record, pack_value, unpack_value

    options = scenario["stand_in"]
    if options is not None:
        backend = StandIn(backend, **options, row=scenario["row"]).backend
    _registry.set_active_registry(_registry_of(backend))
    record: dict[str, Any] = {"loaded": False, "error": None, "outputs": None, "errors": {}}
    try:
        wrapper = _target.load_on_target(channel, lambda: _archive.load(scenario["archive"]))
        record["loaded"] = True
    except Exception as exc:
        record["error"] = error_record(exc)
        return record
    outputs: dict[str, list] = {}
    calls = unpack_value(scenario["calls"], "target inputs")
    for method, examples in calls.items():
        values, errors = outputs.setdefault(method, []), record["errors"].setdefault(method, [])
        for args, kwargs in examples:
            try:
                values.append(_target.call_on_target(channel, getattr(wrapper, method), args, kwargs))
                errors.append(None)
            except Exception as exc:
                values.append(None)
                errors.append(error_record(exc))
    record["outputs"] = pack_value(outputs, "target outputs")
    return record


class _OneBackend:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def backendconf_register_backends(self, register: Any) -> None:
        register(self.backend)


def _registry_of(backend: Any) -> Any:
    registry = _registry.BackendRegistry()
    registry.add_plugin(_OneBackend(backend), _registry.Source("a suite's extra process"))
    return registry


# --- target rows -------------------------------------------------------------------------------

#: Per session: the cases whose archives could not be made, and why.
_ARCHIVE_PROBLEMS: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


def _scenario_key(row: dict, case: str) -> str:
    # Rows with the backend itself and intact blobs share one scenario (and one load).
    kind = row["id"] if "stand_in" in row or row["blobs"] != "intact" else "backend"
    return f"availability:{kind}/{case}"


def availability_scenarios(ctx: Any) -> list[Scenario]:
    """Every target row's scenario for every subject, archives written now."""
    try:
        found_subjects = subjects(ctx)
    except Unsupported:
        return []
    directory = ctx.tmp_dir("availability-archives")
    problems = _ARCHIVE_PROBLEMS.setdefault(ctx, {})
    scenarios: dict[str, Scenario] = {}
    for case, dtype in found_subjects:
        try:
            made = _archives(ctx, case, dtype, directory)
        except UnsupportedNodeError as exc:
            problems[case] = f"unsupported: {Unsupported.from_rejection(exc)}"
            continue
        except Exception as exc:
            problems[case] = f"preprocessing it on the host failed: {type(exc).__name__}: {exc}"
            continue
        calls = calls_for(ctx, case, dtype)
        for row in table()["row"]:
            key = _scenario_key(row, case)
            if row["where"] == "target" and key not in scenarios:
                scenarios[key] = Scenario(
                    key, made[row["blobs"]], calls, row.get("stand_in"), row["id"], last=row["blobs"] != "intact"
                )
    return list(scenarios.values())


def _archives(ctx: Any, case: str, dtype: str, directory: Any) -> dict[str, str]:
    """Intact and truncated archives of one case, preprocessed without compiling."""
    from pytest_backendconf._lowering import LoweredModule

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendUnavailableWarning)
        lowered = ctx.lower(case, dtype, backend=_PreprocessOnly(ctx.backend)).lowered
    truncated = LoweredModule(
        ctx.backend,
        lowered.methods,
        {m: b[: len(b) // 2] for m, b in lowered.blobs.items()},
        lowered.debug,
        backend_version=lowered.backend_version,
    )
    paths = {}
    for kind, module in (("intact", lowered), ("truncated", truncated)):
        paths[kind] = os.path.join(str(directory), f"{case}-{kind}.bcpt")
        _archive.save(module, paths[kind])
    return paths


def _target_results(ctx: Any, row: dict) -> Iterator[tuple[str, str, str, dict]]:
    """(case, dtype, where, result) of this row's scenario for every subject that has an archive."""
    found = session(ctx)
    problems = _ARCHIVE_PROBLEMS.get(ctx, {})
    ran = False
    for case, dtype in subjects(ctx):
        problem = problems.get(case)
        if problem is not None and not problem.startswith("unsupported"):
            fail(f"row {row['id']}, {case} ({dtype}): no archive for the target: {problem}")
        if problem is None:
            ran = True
            yield (
                case,
                dtype,
                f"row {row['id']}, {case} ({dtype}) on the target",
                found.result(_scenario_key(row, case)),
            )
    if not ran:
        raise Unsupported("; ".join(problems.values()))


def _error_text(result: dict) -> str:
    error = result["error"]
    return f"{error['type']}: {error['message']}" if error else "no error"


def unavailable_on_target(ctx: Any, *, row: dict) -> None:
    prefix = table()["texts"]["unavailable_error"]
    for _case, _dtype, where, result in _target_results(ctx, row):
        if result["loaded"]:
            fail(
                f"{where}: the archive loaded although is_available() is False there; load must raise "
                f"BackendUnavailableError starting {prefix!r}"
            )
        error = result["error"]
        if error["type"] != "BackendUnavailableError" or not error["message"].startswith(prefix):
            fail(
                f"{where}: load must raise BackendUnavailableError starting {prefix!r}; it raised {_error_text(result)}"
            )


def violation_on_target(ctx: Any, *, row: dict) -> None:
    violation = table()["texts"]["violation"]
    for _case, _dtype, where, result in _target_results(ctx, row):
        if result["loaded"]:
            fail(
                f"{where}: is_available() returned True and compile() raised, yet the archive loaded: "
                "the contract violation was not reported"
            )
        error = result["error"]
        if error["type"] != "BackendContractError" or violation not in error["message"]:
            fail(f"{where}: load must raise BackendContractError naming {violation!r}; it raised {_error_text(result)}")


def blob_not_ready(ctx: Any, *, row: dict) -> None:
    for _case, _dtype, where, result in _target_results(ctx, row):
        if result["loaded"]:
            fail(
                f"{where}: the archive with blobs cut to half their length loaded; compile() must reject a "
                "blob that is not ready, so that load fails with a clear error"
            )
        error = result["error"]
        if error["type"] in ("TargetCrashError", "TargetTimeoutError", "TargetNotRunError"):
            fail(
                f"{where}: loading blobs cut to half their length must fail with a clear error, never a crash "
                f"or a hang: {_error_text(result)}"
            )
        if not error["message"].strip():
            fail(f"{where}: loading truncated blobs raised {error['type']} with an empty message")


def loads_on_target(ctx: Any, *, row: dict) -> None:
    _runs_on_target(ctx, row, first_call_only=True)


def runs_on_target(ctx: Any, *, row: dict) -> None:
    _runs_on_target(ctx, row, first_call_only=False)


def _runs_on_target(ctx: Any, row: dict, *, first_call_only: bool) -> None:
    seeds = section("availability")["seeds"]
    for case, dtype, where, result in _target_results(ctx, row):
        if not result["loaded"]:
            fail(
                f"{where}: the archive did not load with {', '.join(result['blocked'])} blocked: {_error_text(result)}"
            )
        for method, examples in calls_for(ctx, case, dtype).items():
            for i, (seed, (args, kwargs)) in enumerate(zip(seeds, examples)):
                if first_call_only and i:
                    break
                error = result["errors"][method][i]
                if error is not None:
                    fail(
                        f"{where}: call {i + 1} of {method}() (example seed {seed}) raised "
                        f"{error['type']}: {error['message']}"
                    )
                _match_eager(ctx, case, dtype, method, seed, args, kwargs, result["outputs"][method][i], where)


#: ``expect`` in availability.toml → the procedure that checks the row's outcome.
OUTCOMES = {
    "unavailable_on_host": unavailable_on_host,
    "violation_on_host": violation_on_host,
    "compiles_once": compiles_once,
    "unavailable_on_target": unavailable_on_target,
    "loads_on_target": loads_on_target,
    "blob_not_ready": blob_not_ready,
    "violation_on_target": violation_on_target,
    "runs_on_target": runs_on_target,
}
