"""The suite's extra process: one child process per session that loads archives on the target and lowers afresh.

Categories hand it their work (`_session_work` has the records: a `Scenario`
to load and call on the target, a `Lowering` to redo in a fresh process),
place it with `session(ctx, category).place` and read each item's result with
`session(ctx, category).result`. What runs inside the process is
`handler`; the child-process protocol is
`pytest_backendconf.target._child`.

Each extra process costs a torch import, and the fresh lowering a torch
tracing import on top, so one process per session does everything in two
phases: the *target* phase loads archives with host-only modules blocked
(the availability category's target rows, the serialization category's
round trips), then the blocker is lifted and the *host* phase lowers the
serialization category's cases afresh. Results stream back one JSON line
per item, so a check waits only for its own. Items a crash or timeout kept
from running are retried once in a new process, so one defect costs no
other check its result.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from pytest_backendconf.target import blocked_modules, tail_text, target_command

from .._session_work import Lowering, Scenario, items_at_hand
from .._spec import section

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext


class ExtraProcess:
    """One child process (`pytest_backendconf.target._child`) doing a batch of items, read as it goes.

    A scenario's result is ``{"loaded", "error", "outputs", "errors",
    "blocked", "returncode", "stderr"}`` (outputs and errors per method, one
    per call; errors ``{"type", "message"}``); a lowering's is ``{"archive"}``
    (a path) or ``{"error"}``. If the process crashes or times out, the item
    it was on gets that as its error; later items get ``TargetNotRunError``.

    A process stays open (`take`) for more work of its phase: one whose
    requests held scenarios only is still on the target and takes more
    scenarios, or lowerings, which take it into the host phase; from there it
    takes more lowerings. Under pytest-xdist each worker reaches its models'
    target checks and fresh lowerings one model at a time, and a process per
    model (a torch import each) made ``-n 2`` slower than a serial run. A
    process that ran a scenario that may take it down (``last``) takes nothing more.
    """

    _live: "weakref.WeakSet[ExtraProcess]" = weakref.WeakSet()

    def __init__(
        self, ctx: SuiteContext, scenarios: list[Scenario], lowerings: list[Lowering], *, timeout: float
    ) -> None:
        from pytest_backendconf.target import open_child, target_command

        self.scenarios = sorted(scenarios, key=lambda s: s.last)
        self.lowerings = list(lowerings)
        self.keys = [s.key for s in self.scenarios] + [item.key for item in self.lowerings]
        self.workdir = str(ctx.tmp_dir("backendconf-process"))
        self.blocked = list(blocked_modules(ctx.capabilities))
        self.timeout = timeout
        self._records: dict[str, dict] = {}
        self._running: str | None = None
        self._end: Any = None
        self._lock = threading.RLock()
        self._deadline = time.monotonic() + timeout
        #: "target" until a request brings lowerings, then "host" (the blocker is lifted for good).
        self.phase = "host" if self.lowerings else "target"
        #: Open for more work of its phase: nothing in it that may take it down.
        self.reusable = not any(s.last for s in self.scenarios)
        #: The keys of each request not answered yet, in order.
        self._batches: list[list[str]] = [list(self.keys)]
        #: With a target command, scenarios run on the device and lowerings here (`Session.place` splits them).
        self.on_device = target_command() is not None and not self.lowerings
        # A fresh lowering must not depend on the hash seed: a pinned one gets another one there.
        self._child = open_child(
            "pytest_backendconf.conformance.extra_process.handler:ExtraProcessHandler",
            {"backend": ctx.name, "backend_version": ctx.registered.source.version, "workdir": self.workdir},
            blocked=self.blocked,
            startup_timeout=timeout,
            vary_hash_seed=True,
            refuse_tracing=True,
            on_target=self.on_device,
        )
        self._child.send(
            {
                "scenarios": [_scenario_message(s, self._child) for s in self.scenarios],
                "lowerings": [dataclasses.asdict(item) for item in self.lowerings],
            }
        )
        ExtraProcess._live.add(self)
        # Once the session that wanted it is gone, so is a process still working for it.
        weakref.finalize(self, self._child.kill)

    def take(self, scenarios: list[Scenario], lowerings: list[Lowering]) -> bool:
        """Do these items here too, if this process is still open for them (see the class)."""
        with self._lock:
            if not self.reusable or self._end is not None or not self._child.alive or any(s.last for s in scenarios):
                return False
            if scenarios and self.phase == "host":
                return False
            if (lowerings and self.on_device) or (scenarios and not self.on_device and target_command() is not None):
                return False
            keys = [s.key for s in scenarios] + [item.key for item in lowerings]
            self._child.send(
                {
                    "scenarios": [_scenario_message(s, self._child) for s in scenarios],
                    "lowerings": [dataclasses.asdict(item) for item in lowerings],
                }
            )
            self.scenarios += scenarios
            self.lowerings += lowerings
            self.keys += keys
            self._batches.append(keys)
            if lowerings:
                self.phase = "host"
            self._deadline = time.monotonic() + self.timeout  # each request gets the whole timeout
            return True

    def result(self, key: str) -> dict:
        """The item's result, as soon as the process has sent it."""
        from pytest_backendconf.target import Ended

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
        if not self.reusable and not self._batches:
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
                        f"without it; stderr: {tail_text(self._child.stderr())}",
                    },
                },
            )

    def _decode(self, record: dict) -> dict:
        from pytest_backendconf.target import unpack_value

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
            if ended is not None and ended.unreachable and key == self._running:
                error = {"type": "TargetUnreachable", "message": f"while on {key}: {ended.describe()}"}
            elif ended is not None and ended.setup_error is not None:
                error = {"type": ended.setup_error["type"], "message": ended.setup_error["message"]}
            elif key == self._running:
                how = (
                    f"did not finish within {self.timeout} s and was killed"
                    if timed_out
                    else f"exited with code {code}"
                )
                error = {
                    "type": "TargetTimeoutError" if timed_out else "TargetCrashError",
                    "message": f"the process {how} while on {key}; stderr: {tail_text(stderr)}",
                }
            else:
                error = {
                    "type": "TargetNotRunError",
                    "message": f"{key} did not run: the process ended early (exit code {code}, while on "
                    f"{self._running}); stderr: {tail_text(stderr)}",
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

    def __init__(self, ctx: SuiteContext) -> None:
        self.ctx = ctx
        self.placed: dict[str, ExtraProcess] = {}
        self.retried: set[str] = set()
        self.lock = threading.RLock()
        #: Processes started (the benchmarks and tests read it).
        self.started = 0
        #: Processes open for more work, the newest first.
        self._open: list[ExtraProcess] = []
        #: The categories that have placed their work at hand (`session`).
        self.asked: set[str] = set()

    def place(self, scenarios: list[Scenario], lowerings: list[Lowering]) -> None:
        """Start one process for the items not placed yet (none if there are none)."""
        with self.lock:
            scenarios = [s for s in scenarios if s.key not in self.placed]
            lowerings = [item for item in lowerings if item.key not in self.placed]
            if not scenarios and not lowerings:
                return
            if scenarios and lowerings and target_command() is not None:
                # The device loads archives; lowering afresh needs the compiler, which stays here.
                self.place(scenarios, [])
                self.place([], lowerings)
                return
            # Lowerings alone go to a process already in the host phase if there is one, so that a
            # process still on the target stays there for the next scenarios.
            wanted = "host" if not scenarios else "target"
            for process in sorted(self._open, key=lambda p: p.phase != wanted):
                if process.take(scenarios, lowerings):
                    self.placed.update(
                        {key: process for key in [s.key for s in scenarios] + [i.key for i in lowerings]}
                    )
                    return
            timeout = section("availability")["extra_process_timeout"]
            process = ExtraProcess(self.ctx, scenarios, lowerings, timeout=timeout)
            self.started += 1
            if process.reusable:
                self._open.insert(0, process)
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
                    stale: list[Scenario | Lowering] = [*lost, *lost_lowerings]
                    for item in stale:
                        self.retried.add(item.key)
                        del self.placed[item.key]
                    # Each scenario that may crash gets a process of its own this time.
                    self.place([s for s in lost if not s.last], lost_lowerings)
                    for scenario in (s for s in lost if s.last):
                        self.place([scenario], [])
            return self.result(key)
        if result.get("error") and result["error"]["type"] == "TargetUnreachable":
            # The link to the device broke while this key ran there: the check's error, never its verdict.
            from pytest_backendconf.errors import TargetUnreachable

            raise TargetUnreachable(result["error"]["message"])
        return result


def _scenario_message(s: Scenario, child: Any) -> dict:
    from pytest_backendconf.target import pack_value

    return {
        "key": s.key,
        "archive": child.file(s.archive),
        "stand_in": s.stand_in,
        "row": s.row,
        "calls": pack_value(s.calls, f"inputs of {s.key}"),
    }


def _not_run(result: dict) -> bool:
    return bool(result.get("error")) and result["error"]["type"] == "TargetNotRunError"


_SESSIONS: "weakref.WeakKeyDictionary[Any, Session]" = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def session(ctx: SuiteContext, asking: str) -> Session:
    """The session's extra processes. A category's first use places everything at hand for it then.

    In the default order the availability category asks first and one
    process does everything at hand for both categories. Under pytest-xdist a
    worker that runs no availability check never loads its target rows.
    """
    with _SESSIONS_LOCK:
        found = _SESSIONS.get(ctx)
        if found is None:
            _SESSIONS[ctx] = found = Session(ctx)
        if asking not in found.asked:
            found.asked.add(asking)
            found.place(*items_at_hand(ctx, asking))
        return found
