"""The device runner: ``python -m pytest_backendconf.target``, started on a device by a target command.

The host reaches a device through any command that starts a Python there
(``ssh board /opt/venv/bin/python``, ``adb shell …``, ``qemu-aarch64 -L …``)
and speaks to this runner over the command's stdin and stdout, nothing else:
no shared filesystem, no environment, no second channel. Everything the
device needs (archives as bytes, inputs, the setup of each worker) travels in
that stream, and everything it answers (records, the workers' stderr, how a
worker ended) comes back in it.

The runner is a small fork server, single-threaded (a ``select`` loop) so that
forking is safe:

- At start, before importing torch, it writes ``hello``: the protocol number,
  ``platform.machine()``, its pid, and the versions of Python, torch,
  pytest-backendconf and each installed backend's distribution (read from the
  installed metadata, so a board that takes 20 s to import torch still answers
  at once). Before its first worker it imports torch and the runtime layers
  once and says ``ready``.
- ``open`` forks a *worker* that runs one handler exactly as a local child
  does (`_child.serve`: import blocker, tracing guard, plugins by module name,
  handler). A worker that crashes or hangs is the backend's failure on the
  device; the runner reports it with ``ended`` (exit status, and whether it
  was killed on request) and goes on: the next ``open`` forks a fresh worker
  without a second ``import torch``.
- ``blob`` frames carry bytes (a JSON header line, then exactly ``size`` raw
  bytes); the runner keeps them for the connection, keyed by sha256, so an
  archive several checks use crosses the link once. A message names the blobs
  it needs; the runner hands them to the worker before the message, where
  ``{"$blob": sha256}`` in the message becomes those bytes.
- ``kill`` dumps a worker's stacks (faulthandler, into the relayed stderr)
  and kills it; ``ping`` answers ``pong`` (the host measures the link with it).
- When its stdin ends (the host went away or the link broke) it kills its
  workers and exits, so a dropped connection leaves no orphan running.

Frames to the host are JSON lines: ``hello``, ``ready``, ``pong``,
``{"w": id, "r": record}`` (a worker's record, relayed verbatim),
``{"kind": "stderr", "w", "data"}`` and ``{"kind": "ended", "w",
"returncode", "killed"}``; the host reads each up to a cap and checks its
shape before it acts on it (`_link.check_frame`: a device is untrusted).
Nothing here imports pytest or Hypothesis.
"""

from __future__ import annotations

import json
import os
import platform
import select
import signal
import sys
import time
from typing import IO, Any, Iterator

#: The protocol's version; the host refuses a runner that speaks another.
PROTOCOL = 1
#: Seconds between the stack dump of a hung worker and its SIGKILL.
DUMP_GRACE = 0.5
_CHUNK = 1 << 16


def versions() -> dict[str, Any]:
    """What the host compares and reports: installed versions, read without importing them."""
    import importlib.metadata as metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    backends: dict[str, Any] = {}
    for ep in metadata.entry_points(group="backendconf"):
        dist = getattr(ep, "dist", None)
        backends[ep.name] = {"distribution": dist.name if dist else None, "version": dist.version if dist else None}
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "pytest_backendconf": version("pytest-backendconf"),
        "backends": backends,
    }


class _Worker:
    def __init__(self, wid: int, pid: int, to_fd: int, rec_fd: int, err_fd: int) -> None:
        self.wid, self.pid = wid, pid
        self.to_fd: int | None = to_fd
        self.rec_fd: int | None = rec_fd
        self.err_fd: int | None = err_fd
        self.outbox = bytearray()
        self.rec_buffer = bytearray()
        self.blobs_sent: set[str] = set()
        self.closing = False
        self.killed = False
        self.kill_at: float | None = None


class Runner:
    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.blobs: dict[str, bytes] = {}
        self.workers: dict[int, _Worker] = {}
        self.inbuf = bytearray()
        self.pending_blob: dict[str, Any] | None = None
        self.started = False

    def send(self, frame: dict[str, Any]) -> None:
        self.out.write(json.dumps(frame).encode("utf-8") + b"\n")
        self.out.flush()

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        stdin = sys.stdin.buffer.fileno()
        stdin_open = True
        while stdin_open or self.workers:
            readers = [stdin] if stdin_open else []
            writers = []
            for w in self.workers.values():
                readers += [fd for fd in (w.rec_fd, w.err_fd) if fd is not None]
                if w.to_fd is not None and (w.outbox or w.closing):
                    writers.append(w.to_fd)
            timeout = self._next_kill()
            readable, writable, _ = select.select(readers, writers, [], timeout)
            self._kill_due()
            for fd in writable:
                self._write_worker(fd)
            for fd in readable:
                if fd == stdin:
                    data = os.read(stdin, _CHUNK)
                    if not data:
                        stdin_open = False
                        for w in self.workers.values():  # the host is gone: nobody waits for them
                            self._signal(w, signal.SIGKILL)
                        continue
                    self.inbuf += data
                    self._frames()
                else:
                    self._read_worker(fd)
            self._reap()
        return 0

    def _frames(self) -> None:
        while True:
            if self.pending_blob is not None:
                size = self.pending_blob["size"]
                if len(self.inbuf) < size:
                    return
                self.blobs[self.pending_blob["sha256"]] = bytes(self.inbuf[:size])
                del self.inbuf[:size]
                self.pending_blob = None
                continue
            end = self.inbuf.find(b"\n")
            if end < 0:
                return
            line = bytes(self.inbuf[:end])
            del self.inbuf[: end + 1]
            if line.strip():
                self._frame(json.loads(line))

    def _frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("kind")
        if kind == "blob":
            self.pending_blob = frame
        elif kind == "ping":
            self.send({"kind": "pong", "id": frame.get("id")})
        elif kind == "open":
            self._open(int(frame["w"]), frame["setup"])
        else:
            w = self.workers.get(int(frame.get("w", -1)))
            if w is None:
                return  # it ended already; its "ended" is on the way
            if kind == "to":
                for sha in frame.get("blobs", []):
                    if sha not in w.blobs_sent:
                        data = self.blobs[sha]
                        w.outbox += json.dumps({"kind": "blob", "sha256": sha, "size": len(data)}).encode() + b"\n"
                        w.outbox += data
                        w.blobs_sent.add(sha)
                w.outbox += json.dumps(frame["message"]).encode("utf-8") + b"\n"
            elif kind == "close":
                w.closing = True
            elif kind == "kill":
                w.killed = True
                if frame.get("dump") and hasattr(signal, "SIGUSR1"):
                    self._signal(w, signal.SIGUSR1)  # faulthandler: where is it stuck?
                    w.kill_at = time.monotonic() + DUMP_GRACE
                else:
                    self._signal(w, signal.SIGKILL)

    # -- workers ----------------------------------------------------------------------------

    def _start(self) -> None:
        """Once, before the first worker: every worker forked later has torch and the runtime imported.

        Not at start, so that ``hello`` and ``pong`` answer at once (the host's reachability check).
        Nothing imported here may pull in torch's tracing modules, which a worker's blocker must refuse.
        """
        import torch

        from .. import archive, lowering  # noqa: F401
        from . import _child  # noqa: F401

        self.started = True
        self.send({"kind": "ready", "torch": torch.__version__})

    def _open(self, wid: int, setup: dict[str, Any]) -> None:
        if not self.started:
            self._start()
        to_r, to_w = os.pipe()
        rec_r, rec_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                os.dup2(to_r, 0)
                os.dup2(rec_w, 3)
                os.dup2(err_w, 2)
                os.dup2(err_w, 1)  # whatever the backend prints goes to stderr
                os.closerange(4, 1 << 16)
                code = _worker(setup)
            except BaseException:  # a worker never returns into the runner's loop
                import traceback

                traceback.print_exc()
                code = 70
            os._exit(code)
        for fd in (to_r, rec_w, err_w):
            os.close(fd)
        self.workers[wid] = _Worker(wid, pid, to_w, rec_r, err_r)

    def _write_worker(self, fd: int) -> None:
        w = next(w for w in self.workers.values() if w.to_fd == fd)
        try:
            if w.outbox:
                sent = os.write(fd, bytes(w.outbox[:_CHUNK]))
                del w.outbox[:sent]
            if not w.outbox and w.closing:
                os.close(fd)
                w.to_fd = None
        except OSError:  # the worker is gone; its end is reported when its pipes close
            os.close(fd)
            w.to_fd, w.outbox = None, bytearray()

    def _read_worker(self, fd: int) -> None:
        w = next(w for w in self.workers.values() if fd in (w.rec_fd, w.err_fd))
        data = os.read(fd, _CHUNK)
        if fd == w.err_fd:
            if data:
                self.send({"kind": "stderr", "w": w.wid, "data": data.decode("utf-8", "replace")})
            else:
                os.close(fd)
                w.err_fd = None
            return
        if not data:
            os.close(fd)
            w.rec_fd = None
            return
        w.rec_buffer += data
        while (end := w.rec_buffer.find(b"\n")) >= 0:
            line = bytes(w.rec_buffer[:end]).strip()
            del w.rec_buffer[: end + 1]
            if line:  # relayed verbatim: the runner does not parse what a worker says
                self.out.write(b'{"w": %d, "r": ' % w.wid + line + b"}\n")
        self.out.flush()

    def _reap(self) -> None:
        for w in list(self.workers.values()):
            if w.rec_fd is not None or w.err_fd is not None:
                continue
            _, status = os.waitpid(w.pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if w.to_fd is not None:
                os.close(w.to_fd)
            del self.workers[w.wid]
            self.send({"kind": "ended", "w": w.wid, "returncode": code, "killed": w.killed})

    def _signal(self, w: _Worker, sig: int) -> None:
        try:
            os.kill(w.pid, sig)
        except ProcessLookupError:
            pass

    def _next_kill(self) -> float | None:
        due = [w.kill_at for w in self.workers.values() if w.kill_at is not None]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _kill_due(self) -> None:
        now = time.monotonic()
        for w in self.workers.values():
            if w.kill_at is not None and now >= w.kill_at:
                w.kill_at = None
                self._signal(w, signal.SIGKILL)


def _worker(setup: dict[str, Any]) -> int:
    """In a forked worker: fd 0 brings blobs and messages, records go to fd 3, stderr to fd 2."""
    import faulthandler

    from ._child import serve

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.stdin = open(os.devnull, encoding="utf-8")  # fd 0 is the message stream
    sys.stdout = sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    out = os.fdopen(3, "w", encoding="utf-8")
    return serve(setup, _messages(os.fdopen(0, "rb")), out)


def _messages(stream: IO[bytes]) -> Iterator[Any]:
    """The worker's messages, with ``{"$blob": sha256}`` replaced by the bytes that came before them."""
    blobs: dict[str, bytes] = {}
    for line in stream:
        frame = json.loads(line)
        if frame.get("kind") == "blob":
            blobs[frame["sha256"]] = stream.read(frame["size"])
            continue
        yield _resolve(frame, blobs)


def _resolve(value: object, blobs: dict[str, bytes]) -> object:
    if isinstance(value, dict):
        if set(value) == {"$blob"}:
            return blobs[value["$blob"]]
        return {k: _resolve(v, blobs) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, blobs) for v in value]
    return value


def main() -> int:
    # Frames go to a private copy of stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    runner = Runner(out)
    runner.send(
        {"kind": "hello", "protocol": PROTOCOL, "machine": platform.machine(), "pid": os.getpid(), **versions()}
    )
    return runner.run()
