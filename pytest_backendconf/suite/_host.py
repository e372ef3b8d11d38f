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
  the check during which it crossed the limit, with the growth measured.

Categories need nothing special: whatever `generate_checks` yields runs here.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import tempfile
import threading
import warnings
from typing import Any, Callable

#: Per-check seconds before the host is killed and the check fails (``--backendconf-timeout``).
DEFAULT_TIMEOUT = 120.0
#: The host's resident memory limit in MiB (``--backendconf-max-rss``).
DEFAULT_MAX_RSS_MIB = 4096
#: Seconds a fresh host may take to import torch and the backend and build the checks.
STARTUP_TIMEOUT = 300.0


@dataclasses.dataclass
class HostOptions:
    """How the pytest process asks the host to build the suite (the same as its own)."""

    backend: str
    hypothesis_profile: str
    hypothesis_seed: int
    torch_threads: int
    tmp_root: str | None
    #: ``--backendconf-zoo``: the host's context holds the same models.
    zoo: str = "synthetic"
    #: ``--backendconf-ops``: the host generates the same ops checks.
    ops_mode: str = "default"
    #: The run's ``-p`` modules, for the rerun commands the checks print.
    plugin_modules: list[str] = dataclasses.field(default_factory=list)


class BackendHost:
    """The pytest process's side: runs checks by id in a host child, replacing it when it dies."""

    def __init__(self, options: HostOptions, *, timeout: float | None, max_rss: int | None) -> None:
        self.options = options
        self.timeout = timeout
        self.max_rss = max_rss
        self._child: Any = None
        self._broken: dict[str, Any] | None = None
        self._lock = threading.Lock()
        #: How many hosts were started (a crash, a hang or the memory limit starts another).
        self.started = 0
        #: Exports and cached programs the hosts counted (for the benchmarks; this process exports nothing).
        self.exports = 0
        self.programs: set[tuple] = set()

    def run(self, check_id: str, subject: str) -> dict[str, Any]:
        """The check's outcome: ``{"outcome": passed | failed | unsupported | skipped, "message", …}``.

        :param subject: what the check was on (model, dtype), for the message when the host dies.
        """
        from ..target import ChildProcess, Ended

        with self._lock:
            if self._broken is not None:  # it cannot start: every check would pay for finding out again
                return dict(self._broken)
            if self._child is None or not self._child.alive:
                self._child = ChildProcess(
                    "pytest_backendconf.suite._host:HostHandler",
                    dataclasses.asdict(self.options),
                    startup_timeout=STARTUP_TIMEOUT,
                )
                self.started += 1
            child = self._child
        calls: list[dict] = []
        if not child.wait_ready():  # the memory at the start is the host's, not a half-started interpreter's
            ended = child.ended
            self._broken = {
                "outcome": "failed",
                "message": self._died(ended, check_id, subject, [], None, None, at_setup=True),
                "error": {"type": "BackendHostDied", "module": __name__, "message": ended.describe()},
            }
            return dict(self._broken)
        mark = child.stderr_mark()
        peak = {"rss": None}
        start_rss = child.rss()

        def watch() -> str | None:
            rss = child.rss()
            if rss is not None:
                peak["rss"] = max(rss, peak["rss"] or 0)
            if self.max_rss and rss is not None and rss > self.max_rss:
                return f"its memory grew past --backendconf-max-rss ({_mib(rss)} > {_mib(self.max_rss)})"
            return None

        result = child.request({"check": check_id}, timeout=self.timeout, on_record=calls.append, watch=watch)
        stderr = child.stderr_since(mark)
        if isinstance(result, Ended):
            with self._lock:
                self._child = None
            return {
                "outcome": "failed",
                "message": self._died(result, check_id, subject, calls, start_rss, peak["rss"]),
                "error": {"type": "BackendHostDied", "module": __name__, "message": result.describe()},
            }
        self.exports += result.pop("exports", 0)
        self.programs.update(tuple(p) for p in result.pop("programs", []))
        result["stderr"] = stderr
        rss = child.rss()
        if self.max_rss and rss is not None and rss > self.max_rss:
            # Past the limit after the check: this check pushed it over. The next check gets a fresh host.
            with self._lock:
                self._child = None
            child.kill(killed_because="memory limit")
            grew = f" (this check: {_mib(start_rss)} → {_mib(rss)})" if start_rss is not None else ""
            return {
                "outcome": "failed",
                "stderr": stderr,
                "message": f"the process running the checks grew past --backendconf-max-rss={_mib(self.max_rss)} "
                f"during this check, to {_mib(rss)}{grew}; it was replaced by a fresh one. A backend that keeps "
                f"memory per call shows up here first (reliability::memory_stays_flat names the leak). "
                f"{_subject_text(subject, calls)}"
                + (
                    f"\nthe check's own outcome was {result.get('outcome')}: {result.get('message')}"
                    if result.get("outcome") != "passed"
                    else ""
                ),
                "error": {"type": "BackendHostMemoryLimit", "module": __name__, "message": f"RSS {_mib(rss)}"},
                "warnings": result.get("warnings", []),
            }
        return result

    def _died(
        self,
        ended: Any,
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
                f"{check_id} did not finish within {ended.timed_out:g} s (--backendconf-timeout); the process "
                "running it was killed"
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

    def close(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.close()


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

    def __init__(self, options: dict, channel: Any) -> None:
        import torch

        from ..registry import _registry
        from ._context import build_context
        from ._categories import generate_checks

        opts = HostOptions(**options)
        torch.set_num_threads(max(1, int(opts.torch_threads)))
        # torch.export's first use imports its tracing machinery (seconds): do it while starting, so
        # that the first check's --backendconf-timeout measures the check, not the import.
        from .. import _compat

        _compat.import_export_tracer()
        registry = _registry._ACTIVE or _registry.BackendRegistry()
        registry.load_entry_points(select=opts.backend)
        _registry.set_active_registry(registry)
        selected = registry.get(opts.backend)
        tmp_root = opts.tmp_root if opts.tmp_root and os.path.isdir(opts.tmp_root) else None

        def tmp_dir(name: str) -> Any:
            from pathlib import Path

            return Path(tempfile.mkdtemp(prefix=f"{name}-host-", dir=tmp_root))

        self.ctx = build_context(
            selected, registry, tmp_dir, opts.hypothesis_profile, opts.hypothesis_seed, zoo=opts.zoo
        )
        # What plugin._make_context sets on the pytest process's context, the same here.
        self.ctx.ops_mode = opts.ops_mode
        self.ctx.plugin_modules = list(opts.plugin_modules)
        self.checks = {f"{c.category}::{c.name}": c for c in generate_checks(self.ctx)}
        self._reported: set[tuple] = set()
        install_breadcrumbs(self.ctx.backend, channel)

    def __call__(self, request: dict, channel: Any) -> dict:
        check = self.checks.get(request["check"])
        if check is None:
            return {
                "outcome": "failed",
                "message": f"the backend host has no check {request['check']!r}: it generated "
                "other checks than the pytest process (do the plugins register cases differently in a child "
                "process?)",
                "error": {"type": "LookupError", "module": "builtins", "message": request["check"]},
            }
        exports = self.ctx.export_count
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome = run_check(check, self.ctx)
        new = [k for k in self.ctx._programs if k not in self._reported]
        self._reported.update(new)
        outcome["exports"] = self.ctx.export_count - exports
        outcome["programs"] = [list(k) for k in new]
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
        outcome["warnings"] = list(seen.values())[:20]
        return outcome


def run_check(check: Any, ctx: Any) -> dict[str, Any]:
    """Run one check here; its outcome as the report needs it (the same in the pytest process and the host)."""
    import pytest

    from ..target import error_record
    from ..report import CheckFailed, Unsupported

    try:
        details = check.run(ctx)
    except Unsupported as exc:
        return {"outcome": "unsupported", "message": str(exc)}
    except pytest.skip.Exception as exc:
        return {"outcome": "skipped", "message": str(exc.msg)}
    except CheckFailed as exc:
        details = exc.details if isinstance(exc.details, dict) else None
        return {
            "outcome": "failed",
            "message": str(exc),
            "error": error_record(exc),
            **({"details": details} if details else {}),
        }
    except Exception as exc:
        info = pytest.ExceptionInfo.from_exception(exc)
        return {
            "outcome": "failed",
            "message": str(info.getrepr(style="short", chain=True)),
            "error": error_record(exc),
        }
    # A check may return details for the report (delegation's node counts); they are JSON data.
    return {"outcome": "passed", **({"details": details} if isinstance(details, dict) else {})}


def install_breadcrumbs(backend: Any, channel: Any) -> None:
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


def _describe_inputs(inputs: Any) -> str:
    parts = []
    for value in list(inputs)[:6] if isinstance(inputs, (list, tuple)) else []:
        dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
        if dtype is not None and shape is not None:
            parts.append(f"{str(dtype).removeprefix('torch.')}{list(shape)}")
        else:
            parts.append(type(value).__name__)
    more = ", …" if isinstance(inputs, (list, tuple)) and len(inputs) > 6 else ""
    return "[" + ", ".join(parts) + more + "]"
