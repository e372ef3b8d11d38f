"""Child processes: the one way this package runs work in another interpreter.

A `ChildProcess` starts ``python -m pytest_backendconf.target._child`` and talks to
it in JSON lines (values with tensors travel in the archive's own encoding,
`pack_value` / `unpack_value`, never pickle). The first line sets the child up,
always the same way: the parent's ``sys.path``, an import blocker for the
given modules (installed before anything else is imported), the plugins that
register backends in the parent, and a *handler* named as
``pytest_backendconf…:factory``. The factory builds the handler from the
setup's options; every later line is a request the handler answers. The
child runs torch with its parent's intra-op thread count (`torch_threads`):
a kernel splits its work by the thread count, and the order of a float sum
changes its last bits, so host and target must agree to compare exactly. While it
works it may stream records (`Channel.send`); its return value ends the
request as the ``result`` record.

The parent learns how the child ended: an exit code or a signal (a crash), a
request that took longer than its timeout (the child is killed, after its
threads' stacks were dumped to its stderr), or a memory limit a watcher
enforced. Each comes back as an `Ended` record with the tail of the child's
stderr. The module knows nothing about what the work is: the target runner,
the availability and serialization categories, the reliability probes and
the suite's check host all hand it their own handler.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import importlib.abc
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
from typing import Any, Callable, Iterable, Mapping, Sequence, TextIO

from .._validation import check_type, field

#: Modules whose handler factories the child may be asked to run.
_HANDLER_PACKAGE = "pytest_backendconf."
#: How much of a child's stderr is kept for messages (the end of it).
STDERR_KEPT = 64 * 1024


# --- values --------------------------------------------------------------------------------------


def pack_value(value: object, where: str) -> dict[str, Any]:
    """``value`` (tensors, scalars, lists/tuples/dicts of them) as one JSON-compatible document."""
    from ..archive import to_message

    return to_message(value, where)


def unpack_value(message: object, where: str) -> Any:
    """Inverse of `pack_value`; anything malformed is an `ArchiveError` naming ``where``."""
    from ..archive import from_message

    return from_message(message, where)


def error_record(exc: BaseException) -> dict[str, str]:
    """``{"type", "module", "message"}`` of an exception, for a message to the other side."""
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}


def check_error_record(value: object, where: str) -> dict[str, str]:
    """``value`` when it is an `error_record` (three strings); else `InvalidField` naming ``where``."""
    record = check_type(value, "object", where)
    for key in ("type", "module", "message"):
        field(record, key, "string", where)
    return record


def check_record(record: object, where: str = "record") -> dict[str, Any]:
    """``record`` when it has the shape the protocol itself reads; else `InvalidField` naming ``where``.

    Every record is an object with a string ``kind``; ``ready`` carries the
    child's ``pid`` and ``setup_error`` an `error_record`. What a handler's
    own records hold is checked by whoever reads them.
    """
    checked = check_type(record, "object", where)
    kind = field(checked, "kind", "string", where)
    if kind == "ready":
        field(checked, "pid", "integer", where)
    elif kind == "setup_error":
        check_error_record(checked.get("error"), f"{where}.error")
    return checked


def tail_text(text: str | bytes | None, limit: int = 2000) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text or ""
    return text if len(text) <= limit else "..." + text[-limit:]


def exit_status(code: int | None) -> str:
    """``exit code 3`` or ``signal 11 (SIGSEGV)``."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# --- the parent's side ---------------------------------------------------------------------------


@dataclasses.dataclass
class Ended:
    """The child is gone before answering: how it ended.

    :param returncode: the process's exit status (negative: the signal that killed it).
    :param timed_out: the parent killed it because a request took longer than its timeout.
    :param killed_because: why else the parent killed it (a watcher's reason), or ``""``.
    :param setup_error: the child could not set up (``{"type", "module", "message"}``).
    """

    returncode: int | None
    stderr: str
    timed_out: float | None = None
    killed_because: str = ""
    setup_error: dict[str, str] | None = None
    #: A device's link or runner failed (`_link`): not the work's own end (reported as ``TargetUnreachable``).
    unreachable: str = ""

    @property
    def crashed(self) -> bool:
        return self.timed_out is None and not self.killed_because and self.setup_error is None and not self.unreachable

    def describe(self) -> str:
        """``exited with exit code 3``, ``was killed by signal 11 (SIGSEGV)``, ``did not answer within 5 s``."""
        if self.unreachable:
            return f"lost the device: {self.unreachable}"
        if self.setup_error is not None:
            return f"could not set up: {self.setup_error['type']}: {self.setup_error['message']}"
        if self.timed_out is not None:
            return f"did not answer within {self.timed_out:g} s and was killed"
        if self.killed_because:
            return f"was stopped: {self.killed_because}"
        if self.returncode is not None and self.returncode < 0:
            return f"was killed by {exit_status(self.returncode)}"
        return f"exited with code {self.returncode} before answering"


class Child(abc.ABC):
    """The parent's side of one child interpreter running one handler, wherever the interpreter runs.

    Holds what every child shares: its records as they arrive, the tail of its
    stderr, whether it is set up, and how it ended. A subclass says how a message
    reaches the interpreter and how it is stopped: `ChildProcess` on this
    machine, `_link.DeviceChild` on a device behind a target link.

    :param startup_timeout: seconds the child may take to be ready.
    """

    #: Whether the interpreter is on a device (`_link.DeviceChild`), not on this machine.
    on_device = False

    def __init__(self, *, startup_timeout: float) -> None:
        self.startup_timeout = startup_timeout
        self.ended: Ended | None = None
        self.pid: int | None = None
        self._ready = False
        self._setup_error: dict[str, str] | None = None
        self._stderr = bytearray()
        self._stderr_total = 0
        self._stderr_lock = threading.Lock()
        #: The child's records in order; ``None`` once it is gone.
        self._records: queue.Queue[dict[str, Any] | None] = queue.Queue()

    # -- talking ---------------------------------------------------------------------------

    @abc.abstractmethod
    def file(self, path: str | os.PathLike[str]) -> str | dict[str, str]:
        """How a message names the file at ``path`` for this child."""

    @abc.abstractmethod
    def send(self, message: Mapping[str, Any]) -> None:
        """Queue one message for the child (never blocks)."""

    def receive(self, timeout: float | None) -> dict[str, Any] | Ended | None:
        """The next record from the child, `Ended` once it is gone, ``None`` after ``timeout`` seconds."""
        if self.ended is not None:
            return self.ended
        if not self._ready and not self._wait_ready():
            return self.ended
        try:
            record = self._records.get(timeout=timeout)
        except queue.Empty:
            return None
        if record is None:
            return self._finish()
        return record

    def request(
        self,
        message: Mapping[str, Any],
        *,
        timeout: float | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        watch: Callable[[], str | None] | None = None,
    ) -> dict[str, Any] | Ended:
        """Send one request and wait for its ``result`` record.

        :param timeout: seconds from the child being ready; then it is killed.
        :param on_record: called with every other record of this request.
        :param watch: called about ten times a second while waiting; a
            returned text kills the child (`Ended.killed_because`).
        """
        self.send(message)
        if not self.wait_ready():
            return self._finish()  # not ready: it ended
        deadline = None if timeout is None else time.monotonic() + timeout
        next_watch = 0.0
        while True:
            now = time.monotonic()
            # Checked on the clock, not only in silence: a child streaming records can hang or leak too.
            if watch is not None and now >= next_watch:
                next_watch = now + 0.05
                why = watch()
                if why:
                    return self.kill(killed_because=why)
            if deadline is not None and now >= deadline:
                return self.kill(timed_out=timeout)
            record = self.receive(0.05 if deadline is None else max(0.0, min(0.05, deadline - now)))
            if isinstance(record, Ended):
                return record
            if record is not None:
                if record.get("kind") == "result":
                    return record
                if on_record is not None:
                    on_record(record)

    def wait_ready(self) -> bool:
        """Wait until the child is set up; ``False`` if it ended instead (see `ended`)."""
        return self._ready or self._wait_ready()

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while not self._ready:
            try:
                record = self._records.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill(timed_out=self.startup_timeout)  # counted as the request's time: it never began
                return False
            if record is None:
                self._finish()
                return False
            if record.get("kind") == "ready":
                self._ready, self.pid = True, record["pid"]
            elif record.get("kind") == "setup_error":
                self._setup_error = record["error"]
        return True

    # -- state -------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether the child may still answer."""

    def stderr(self) -> str:
        with self._stderr_lock:
            return bytes(self._stderr).decode("utf-8", "replace")

    def stderr_mark(self) -> int:
        """A position in the child's stderr, for `stderr_since`."""
        with self._stderr_lock:
            return self._stderr_total

    def stderr_since(self, mark: int) -> str:
        """What the child wrote to stderr since ``mark`` (as much of it as is kept)."""
        with self._stderr_lock:
            new = min(self._stderr_total - mark, len(self._stderr))
            return bytes(self._stderr[len(self._stderr) - new :]).decode("utf-8", "replace") if new > 0 else ""

    def add_stderr(self, chunk: bytes) -> None:
        """Keep ``chunk`` of the child's stderr (the end of it, `STDERR_KEPT`): the reader of its stream calls it."""
        with self._stderr_lock:
            self._stderr += chunk
            self._stderr_total += len(chunk)
            del self._stderr[:-STDERR_KEPT]

    @abc.abstractmethod
    def rss(self) -> int | None:
        """The child's resident memory in bytes, where it can be watched (else ``None``)."""

    # -- ending ------------------------------------------------------------------------------

    @abc.abstractmethod
    def kill(self, *, timed_out: float | None = None, killed_because: str = "") -> Ended:
        """Stop the child now; how it ended, with ``timed_out`` or ``killed_because`` as the reason."""

    @abc.abstractmethod
    def close(self, timeout: float = 10.0) -> None:
        """Let the child finish and wait for it; kill it if it does not go."""

    @abc.abstractmethod
    def _finish(self) -> Ended:
        """Wait for the child to be gone and record how it ended (`ended`)."""


class ChildProcess(Child):
    """One child interpreter on this machine running one handler; requests are answered in order.

    Starting it returns at once (importing torch in the child takes seconds);
    the setup and any requests are queued and the first `request` or
    `receive` waits for the child to be ready.

    :param handler: ``"pytest_backendconf.<module>:<factory>"``; the child calls
        ``factory(options, channel)`` once and the result with each request.
    :param blocked: modules the child cannot import (see `ImportBlocker`).
    :param plugins: modules or plugin file paths that register backends;
        ``None``: those of the active pytest session (`active_plugins`).
    :param startup_timeout: seconds the child may take to be ready.
    :param vary_hash_seed: give the child a different ``PYTHONHASHSEED`` than
        a pinned one of this process (for checks that results do not depend on it).
    :param refuse_tracing: a simulated target: ``torch.export.export`` and
        ``torch.compile`` raise in the child (`TracingCallGuard`, on
        ``Channel.tracing_guard``) until its handler lifts the guard.
    """

    def __init__(
        self,
        handler: str,
        options: Mapping[str, Any] | None = None,
        *,
        blocked: Sequence[str] = (),
        plugins: Sequence[str] | None = None,
        startup_timeout: float = 120.0,
        vary_hash_seed: bool = False,
        refuse_tracing: bool = False,
    ) -> None:
        if not handler.startswith(_HANDLER_PACKAGE):
            raise ValueError(f"a child handler must live in {_HANDLER_PACKAGE}*, not {handler!r}")
        super().__init__(startup_timeout=startup_timeout)
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        if vary_hash_seed and env.get("PYTHONHASHSEED", "random") != "random":
            seed = env["PYTHONHASHSEED"]
            env["PYTHONHASHSEED"] = str((int(seed) + 1) % 2**32) if seed.isdigit() else "random"
        self._process = subprocess.Popen(
            [sys.executable, "-m", "pytest_backendconf.target._child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            # Its own process group: killing it also kills the processes it started.
            start_new_session=os.name == "posix",
        )
        for target in (self._read_records, self._read_stderr, self._write):
            threading.Thread(target=target, daemon=True).start()
        self.send(
            {
                "kind": "setup",
                "sys_path": [p for p in sys.path if p],
                "blocked": list(blocked),
                "plugins": [
                    os.path.abspath(p) if is_path(p) else p for p in (active_plugins() if plugins is None else plugins)
                ],
                "handler": handler,
                "options": dict(options or {}),
                "refuse_tracing": refuse_tracing,
                "torch_threads": torch_threads(),
            }
        )

    def file(self, path: str | os.PathLike[str]) -> str:
        """Here, by its absolute path."""
        return os.path.abspath(os.fspath(path))

    def send(self, message: Mapping[str, Any]) -> None:
        self._outbox.put(json.dumps(message).encode("utf-8") + b"\n")

    @property
    def alive(self) -> bool:
        return self.ended is None and self._process.poll() is None

    def rss(self) -> int | None:
        """Linux's count from ``/proc`` (``None`` elsewhere or once the child is gone)."""
        try:
            with open(f"/proc/{self._process.pid}/statm", encoding="ascii") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def kill(self, *, timed_out: float | None = None, killed_because: str = "") -> Ended:
        """Stop the child and everything it started; a hung child first dumps its stacks to stderr."""
        if self._process.poll() is None:
            if timed_out is not None and hasattr(signal, "SIGUSR1"):
                try:
                    self._process.send_signal(signal.SIGUSR1)  # faulthandler: where is it stuck?
                    self._process.wait(0.5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill_group()
        ended = self._finish()
        ended.timed_out, ended.killed_because = timed_out, killed_because
        return ended

    def close(self, timeout: float = 10.0) -> None:
        """Let the child finish (its stdin closes) and wait for it; kill it if it does not go."""
        if self.ended is None:
            self._outbox.put(None)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()
        if self.ended is None:
            self._finish()

    def _kill_group(self) -> None:
        try:
            if os.name == "posix":
                os.killpg(self._process.pid, signal.SIGKILL)
            else:  # pragma: no cover
                self._process.kill()
        except (OSError, ProcessLookupError):
            pass

    def _finish(self) -> Ended:
        if self.ended is None:
            code = self._process.wait()
            time.sleep(0.05)  # the last of stderr, still in the pipe
            self.ended = Ended(returncode=code, stderr=self.stderr(), setup_error=self._setup_error)
        return self.ended

    # -- threads -----------------------------------------------------------------------------

    def _read_records(self) -> None:
        stream = self._process.stdout
        assert stream is not None
        for line in stream:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # half a line from a child that died writing it
            self._records.put(record)
        self._records.put(None)

    def _read_stderr(self) -> None:
        stream = self._process.stderr
        assert stream is not None
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                return
            self.add_stderr(chunk)

    def _write(self) -> None:
        stream = self._process.stdin
        assert stream is not None
        while True:
            data = self._outbox.get()
            try:
                if data is None:
                    stream.close()
                    return
                stream.write(data)
                stream.flush()
            except (OSError, ValueError):
                return  # the child is gone; its end is reported by the reader


# --- sys.path, plugins, blocked modules (both sides) ---------------------------------------------


def active_plugins() -> list[str]:
    """The plugin modules (names) and conftest files (paths) that registered backends in this session."""
    from ..registry import active_registry, defines_hooks

    registry = active_registry()
    if registry is None:
        return []
    found = []
    for plugin in registry.plugin_manager.get_plugins():
        if not isinstance(plugin, types.ModuleType) or not defines_hooks(plugin):
            continue
        file = getattr(plugin, "__file__", None)
        if file and (os.path.basename(file) == "conftest.py" or plugin.__name__ == "__main__"):
            found.append(os.path.abspath(file))
        else:
            found.append(plugin.__name__)
    return found


def torch_threads() -> int | None:
    """This process's intra-op thread count, for its children; ``None`` if it has not imported torch."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None and hasattr(torch, "get_num_threads") else None


def is_path(plugin: str) -> bool:
    return plugin.endswith(".py") or os.sep in plugin


class ImportBlocker(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that refuses the given modules and their submodules."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(dict.fromkeys(names))

    def allow(self, names: Sequence[str]) -> None:
        """Stop blocking exactly ``names`` (a backend's ``target_runtime_modules``)."""
        allowed = set(names)
        self.names = tuple(n for n in self.names if n not in allowed)

    def add(self, names: Sequence[str]) -> list[str]:
        """Block ``names`` too; return those of them that are imported already."""
        self.names = tuple(dict.fromkeys(self.names + tuple(names)))
        new = ImportBlocker(names)
        return sorted(m for m in sys.modules if new.blocks(m))

    def blocks(self, fullname: str) -> bool:
        return any(fullname == n or fullname.startswith(n + ".") for n in self.names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> None:
        if self.blocks(fullname):
            raise ImportError(f"blocked on the target: {fullname} is host-only", name=fullname)
        return None


class TracingCallGuard:
    """On a simulated target: ``torch.export.export`` and ``torch.compile`` refuse, and each call is recorded.

    A runtime may import one of torch's tracing modules without tracing (a
    backend declares those in ``capabilities.target_runtime_modules``, and the
    blocker lets them in), so the import cannot tell a runtime from a compiler;
    the call can. The guard detects the call: a ``compile`` that re-exports its
    program or hands it to ``torch.compile`` needs the host. Calls are recorded
    as well as refused, so a backend that swallows the error is caught by
    `check`. Installed before the plugins import, so a module that binds
    ``from torch.export import export`` gets the guarded function; `lift`
    (the host phase of a child) turns it back into the original, wherever it
    was bound.
    """

    ENTRY_POINTS = (("torch.export", "export", "torch.export.export"), ("torch", "compile", "torch.compile"))

    def __init__(self) -> None:
        #: Named in the error once the child knows which backend it loads.
        self.backend_name: str | None = None
        self.calls: list[str] = []
        self.active = False
        self._saved: list[tuple[types.ModuleType, str, Callable[..., object]]] = []

    def install(self) -> None:
        import torch.export  # noqa: F401  (both owners are in sys.modules from here on)

        for module_name, attr, label in self.ENTRY_POINTS:
            owner = sys.modules[module_name]
            original = getattr(owner, attr)
            self._saved.append((owner, attr, original))
            setattr(owner, attr, self._guarded(original, label))
        self.active = True

    def lift(self) -> None:
        """The host phase: the entry points work again (and are no longer recorded)."""
        self.active = False
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()

    def _guarded(self, original: Callable[..., Any], label: str) -> Callable[..., Any]:
        import functools

        @functools.wraps(original)
        def refuse_on_target(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return original(*args, **kwargs)
            self.calls.append(label)
            raise self.error(label)

        return refuse_on_target

    def error(self, labels: str) -> Exception:
        from ..errors import BackendContractError

        who = f"backend {self.backend_name!r}" if self.backend_name else "a backend plugin"
        return BackendContractError(
            f"{who} called {labels} on the target; a target loads and runs compiled blobs and does not "
            "trace: export and compile on the host, in preprocess() (importing a module declared in "
            "capabilities.target_runtime_modules is fine, calling a tracing entry point is not)"
        )

    def mark(self) -> int:
        """A position in the record of calls, for `check`."""
        return len(self.calls)

    def check(self, since: int = 0) -> None:
        """Raise if anything called a tracing entry point since ``since`` (even if it caught the error)."""
        if len(self.calls) > since:
            raise self.error(", ".join(dict.fromkeys(self.calls[since:])))


def install_blocker(names: Sequence[str]) -> ImportBlocker:
    blocker = ImportBlocker(names)
    sys.meta_path.insert(0, blocker)
    for loaded in [m for m in sys.modules if blocker.blocks(m)]:
        del sys.modules[loaded]
    return blocker


def import_plugins(specs: Sequence[str]) -> None:
    """Import the plugins named by `active_plugins` in the parent; they form the active registry."""
    from ..registry import BackendRegistry, Source, set_active_registry, source_of_module
    from ..errors import PluginLoadError

    registry = BackendRegistry()
    for spec in specs:
        try:
            if is_path(spec):
                module = _import_file(spec)
                kind = "conftest" if os.path.basename(spec) == "conftest.py" else "plugin file"
                source = Source(f"{kind} {spec}")
            else:
                module = importlib.import_module(spec)
                source = source_of_module(module, f"plugin {spec}")
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {spec!r} failed to import in a child process: {type(exc).__name__}: {exc}. A plugin "
                "that registers a backend must import without the backend's host-only modules."
            ) from exc
        registry.add_plugin(module, source)
    set_active_registry(registry)


def _import_file(path: str) -> types.ModuleType:
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # as pytest's default "prepend" import mode does
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --- the child's side ----------------------------------------------------------------------------


class Channel:
    """The child's line to its parent: records go out one JSON line each, from any thread."""

    def __init__(self, stream: TextIO, blocker: ImportBlocker, tracing_guard: TracingCallGuard | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        #: The child's import blocker: handlers add the backend's host-only modules to it.
        self.blocker = blocker
        #: On a simulated target (``refuse_tracing``): what refuses torch's tracing calls.
        self.tracing_guard = tracing_guard

    def send(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()


class Echo:
    """A handler for the protocol's own tests: answers ``say``, sleeps ``sleep`` seconds, exits with ``exit``,
    and tells its torch thread count for ``threads``."""

    def __init__(self, options: Mapping[str, Any], channel: Channel) -> None:
        pass

    def __call__(self, message: Mapping[str, Any], channel: Channel) -> dict[str, Any]:
        if "exit" in message:
            os._exit(int(message["exit"]))
        time.sleep(float(message.get("sleep", 0)))
        if message.get("threads"):
            return {"threads": torch_threads()}
        return {"said": message.get("say")}


def _handler_factory(name: str) -> Callable[..., Any]:
    module_name, _, attr = name.partition(":")
    if not module_name.startswith(_HANDLER_PACKAGE) or not attr:
        raise ValueError(f"a child handler must be 'pytest_backendconf.<module>:<factory>', not {name!r}")
    return getattr(importlib.import_module(module_name), attr)


def main() -> int:
    """The child: ``python -m pytest_backendconf.target._child`` (messages on stdin, records on stdout)."""
    import faulthandler

    # Records go to a private copy of stdout; whatever the backend prints goes to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    faulthandler.enable()  # a crash leaves the Python stacks in stderr, for the parent's message
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks before killing a hung child
    lines = sys.stdin.buffer
    setup = json.loads(lines.readline() or b"{}")
    for entry in setup.get("sys_path", []):
        if entry not in sys.path:
            sys.path.append(entry)
    return serve(setup, (json.loads(line) for line in lines), out)


def serve(setup: Mapping[str, Any], messages: Iterable[Mapping[str, Any]], out: TextIO) -> int:
    """Set up as ``setup`` says, then answer each message; records go to ``out``.

    Shared by the local child (`main`) and the device runner's workers (`_device`).
    """
    channel = Channel(out, install_blocker(setup.get("blocked", [])))
    try:
        if setup.get("torch_threads"):
            # Before the plugins: a backend may size its own pools from torch's count when it imports.
            import torch

            torch.set_num_threads(max(1, int(setup["torch_threads"])))
        if setup.get("refuse_tracing"):
            # Before the plugins: what they bind at import time is the guarded function.
            channel.tracing_guard = TracingCallGuard()
            channel.tracing_guard.install()
        import_plugins(setup.get("plugins", []))
        handler = _handler_factory(setup.get("handler", ""))(setup.get("options", {}), channel)
    except Exception as exc:
        channel.send({"kind": "setup_error", "error": error_record(exc)})
        return 0
    channel.send({"kind": "ready", "pid": os.getpid()})
    for message in messages:
        try:
            result = handler(message, channel) or {}
        except Exception as exc:
            result = {"error": error_record(exc), "traceback": traceback.format_exc()}
        channel.send({**result, "kind": "result"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
