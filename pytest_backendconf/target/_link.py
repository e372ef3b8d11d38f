"""The host's side of a target command: one link to a device runner, and the children it runs there.

``--backendconf-target-command="CMD"`` (or ``--target-command`` of the
commands) names a prefix that starts a Python on a device; the link runs
``CMD -m pytest_backendconf.target`` (`_device`) and speaks to it over the
command's stdin and stdout. One link per process lives as long as the
process (`current_link`), so the handshake and the device's ``import torch``
are paid once; a lost link is replaced by a fresh connection on next use.

`open_child` is where callers choose: a target-stage child runs on the
device when a target command is set (`DeviceChild`), else locally
(`ChildProcess`); both are a `Child`. Files travel as bytes (`DeviceChild.file`).

How an end is classified (docs/vendor-ci.md, "When the link breaks"):

- the runner reports a worker's end (``ended``): the backend crashed or hung
  on the device (`Ended` as for a local child: the check's failure);
- the transport ends without that report (ssh exit 255, adb offline, the
  runner killed), the device does not answer within the connect budget, or
  the runner does not answer a kill request: `Ended.unreachable`, reported as
  ``TargetUnreachable``, never as the backend's failure.

A device is untrusted (docs/security.md): every frame it sends is read with a
bounded length (`MAX_FRAME_BYTES`) and checked for its shape (`check_frame`)
before anything acts on it; a frame that is too long or malformed drops the
link as ``TargetUnreachable``, naming what was wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from typing import IO, Any, Mapping, Sequence

from .._quoting import visible
from .._validation import check_choice, check_type, field, shown
from ._child import STDERR_KEPT, Child, ChildProcess, Ended, active_plugins, check_record, exit_status, is_path
from ._child import tail_text
from ._device import PROTOCOL, versions

#: Seconds a device may take to answer ``hello`` (a Python started, before ``import torch``).
CONNECT_TIMEOUT = 10.0
#: Seconds a device may take from ``hello`` to ``ready`` (its ``import torch``; minutes under QEMU).
START_TIMEOUT = float(os.environ.get("BACKENDCONF_TARGET_START_TIMEOUT", "900"))
#: Seconds the runner has to report a worker it was asked to kill.
KILL_ANSWER = 10.0
#: The environment variable that sets the target command (like the option and ini value).
COMMAND_ENV = "BACKENDCONF_TARGET_COMMAND"
#: The longest frame line a device may send, in bytes (its newline not counted); a longer one drops the link.
#: Tensors travel inside frames (base64 in JSON), so this bounds one answer's outputs: the largest frame of
#: the suite's target stage, real models included, is 11 kB (two [1, 1000] float32 outputs; a replay's,
#: one bundle's outputs, 7 kB), and a stderr frame is at most 0.4 MB (64 KiB read at once, 6 bytes per
#: escaped byte). 64 MiB leaves room for a
#: model's own outputs of up to about 48 MB per bundle or call list; reading a frame holds about twice the
#: cap. ``BACKENDCONF_TARGET_MAX_FRAME_MIB`` raises it for bigger outputs (docs/security.md).
MAX_FRAME_BYTES = int(float(os.environ.get("BACKENDCONF_TARGET_MAX_FRAME_MIB", "64")) * 2**20)
#: How much of a malformed frame's description a reason shows.
_REASON_CHARS = 400

#: Names whose value is a secret: ``NAME=value`` words, ``--NAME value`` and ``--NAME=value`` options.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|AUTH|CREDENTIAL", re.IGNORECASE)
#: Options whose value is ``user:password`` (curl, wget): the part after the colon is the secret.
_USER_OPTIONS = ("-u", "--user", "--proxy-user")
#: Options whose value is an HTTP header, which may carry a credential.
_HEADER_OPTIONS = ("-H", "--header")
#: What a secret shows as; while the words are joined, a token that no quoting touches stands in for it.
_SHOWN, _MASK = "***", "BACKENDCONFMASKED"


def mask_command(command: str) -> str:
    """``command`` for reports and headers, with the secrets of its common forms masked (best effort).

    Masked: ``sshpass -p X`` and ``-pX`` (after ``timeout``, ``env`` and the
    like too), ``NAME=value`` words and ``--NAME value``/``--NAME=value``
    options whose name holds KEY, TOKEN, SECRET, PASS, AUTH or CREDENTIAL,
    ``-u``/``--user user:password``, ``Authorization:`` headers and
    ``user:password@`` in URLs; a quoted command inside a word (``sh -c '…'``,
    ``-o ProxyCommand=…``) is masked the same way. A command that does not
    parse is masked whole. docs/security.md lists safer ways to give a secret.
    """
    try:
        return _masked(command).replace(_MASK, _SHOWN)
    except ValueError:
        return _SHOWN


def _masked(command: str) -> str:
    return shlex.join(_masked_words(shlex.split(command)))


def _masked_words(words: list[str]) -> list[str]:
    masked: list[str] = []
    hide_next = user_next = header_next = False
    sshpass = False  # in sshpass's own options, which come right after the word sshpass
    for word in words:
        if hide_next or user_next or header_next:
            masked.append(_MASK if hide_next else _masked_user(word) if user_next else _masked_header(word))
            hide_next = user_next = header_next = False
            continue
        if sshpass and word.startswith("-p"):
            hide_next = word == "-p"
            masked.append(word if hide_next else "-p" + _MASK)
            continue
        sshpass = os.path.basename(word) == "sshpass" or (sshpass and word.startswith("-"))
        option, eq, value = word.partition("=")
        if option.startswith("--") and _SECRET_NAME.search(option):
            if eq:
                masked.append(f"{option}={_MASK}")
            else:
                masked.append(word)
                hide_next = True
            continue
        if option in _USER_OPTIONS:
            user_next = not eq
            masked.append(f"{option}={_masked_user(value)}" if eq else word)
            continue
        if word.startswith("-u") and len(word) > 2 and not word.startswith("--"):
            masked.append("-u" + _masked_user(word[2:]))
            continue
        if option in _HEADER_OPTIONS:
            header_next = not eq
            masked.append(f"{option}={_masked_header(value)}" if eq else word)
            continue
        if eq and not option.startswith("-") and _SECRET_NAME.search(option):
            masked.append(f"{option}={_MASK}")
            continue
        masked.append(_masked_word(word))
    return masked


def _masked_word(word: str) -> str:
    """One word: a command inside it (``sh -c '…'``, ``ProxyCommand=…``) masked as a command, URLs' passwords."""
    if any(c.isspace() for c in word):
        option, eq, value = word.partition("=")
        if eq and not any(c.isspace() for c in option):
            return f"{option}={_masked(value)}"
        return _masked(word)
    return re.sub(r"(://[^/:@\s]+):[^@/\s]+@", rf"\1:{_MASK}@", word)


def _masked_user(value: str) -> str:
    user, colon, _ = value.partition(":")
    return f"{user}:{_MASK}" if colon else value


def _masked_header(value: str) -> str:
    name, colon, _ = value.partition(":")
    return f"{name}: {_MASK}" if colon and _SECRET_NAME.search(name) else value


# --- the frames a device sends ----------------------------------------------------------------------

#: The kinds of the runner's own frames (a worker's record is ``{"w", "r"}``, without a kind).
FRAME_KINDS = ("hello", "ready", "pong", "stderr", "ended")


def check_frame(frame: object) -> dict[str, Any]:
    """``frame`` when it is a frame the runner sends (`_device`); else `InvalidField` or ``ValueError`` naming
    the field that is wrong. A worker's record is checked as the child protocol reads it (`check_record`)."""
    checked = check_type(frame, "object", "the frame")
    if "r" in checked:
        field(checked, "w", "count")
        check_record(checked["r"], "r")
        return checked
    kind = check_choice(checked.get("kind"), FRAME_KINDS, "kind")
    if kind == "hello":
        check_hello(checked)
    elif kind == "ready":
        field(checked, "torch", "string", optional=True)
    elif kind == "pong":
        field(checked, "id", "integer", optional=True)
    elif kind == "stderr":
        field(checked, "w", "count")
        field(checked, "data", "string")
    else:
        field(checked, "w", "count")
        field(checked, "returncode", "integer", optional=True)
        field(checked, "killed", "boolean", optional=True)
    return checked


def check_hello(hello: Mapping[str, Any]) -> None:
    """The fields of a ``hello`` (`_device.main`); another protocol's hello is `TargetLink`'s to refuse by number."""
    if field(hello, "protocol", "integer") != PROTOCOL:
        return
    field(hello, "machine", "string")
    field(hello, "pid", "count")
    field(hello, "python", "string")
    field(hello, "torch", "string", optional=True)
    field(hello, "pytest_backendconf", "string", optional=True)
    for name, entry in field(hello, "backends", "object").items():
        where = f"backends[{shown(name)}]"
        check_type(entry, "object", where)
        field(entry, "distribution", "string", where, optional=True)
        field(entry, "version", "string", where, optional=True)


def _read_line(stream: IO[bytes], limit: int) -> bytearray:
    """The next line of ``stream``, or its first ``limit`` bytes: grown in place, so that reading an endless line
    holds about ``limit`` bytes (``readline(limit)`` joins its pieces at the end and holds three times as much)."""
    line = bytearray()
    while len(line) < limit:
        piece = stream.readline(min(1 << 16, limit - len(line)))
        line += piece
        if not piece or piece.endswith(b"\n"):
            break
    return line


def _reason(text: str) -> str:
    """A device's text in a reason: on one line, control characters escaped, cut to a bounded length."""
    text = visible(text)
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "…"


class TargetLink:
    """One connection to a device runner: frames in both directions, workers multiplexed by id."""

    def __init__(self, command: str, *, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.command = command
        #: The longest frame line the device may send (`MAX_FRAME_BYTES`).
        self.max_frame = max_frame
        self.hello: dict[str, Any] | None = None
        #: How the device broke the protocol (a frame too long or malformed), once it has.
        self.broken: str | None = None
        self.device_torch: str | None = None
        self.lost: str | None = None
        self.connect_seconds: float | None = None
        self.blob_bytes = 0
        self.rtts: list[float] = []
        self._started = threading.Event()
        self._hello = threading.Event()
        self._workers: dict[int, DeviceChild] = {}
        self._next_id = 0
        self._sent_blobs: set[str] = set()
        self._lock = threading.Lock()
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self._pongs: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stderr = bytearray()
        self._process: subprocess.Popen | None = None

    # -- connecting ---------------------------------------------------------------------------

    def connect(self, timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
        """Start the command and wait for the runner's ``hello``; raise `TargetUnreachable` or `TargetVersionError`."""
        from ..errors import TargetUnreachable

        started = time.monotonic()
        try:
            argv = shlex.split(self.command) + ["-m", "pytest_backendconf.target"]
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=os.name == "posix",
            )
        except (OSError, ValueError) as exc:
            raise TargetUnreachable(f"the target command {mask_command(self.command)!r} cannot start: {exc}") from None
        for target in (self._read, self._read_stderr, self._write):
            threading.Thread(target=target, daemon=True).start()
        if self._hello.wait(timeout) and self.hello is None and self.broken is not None:
            raise TargetUnreachable(
                f"the device (target command {mask_command(self.command)!r}) {self.broken}. It must run this "
                f"pytest-backendconf's runner (python -m pytest_backendconf.target): install the same "
                f"pytest-backendconf on the device ({versions()['pytest_backendconf']} here)"
            )
        if not self._hello.wait(0) or self.hello is None:
            self.drop("no hello")
            time.sleep(0.1)
            how = "ended" if self._process.poll() is not None else f"did not answer within {timeout:g} s"
            raise TargetUnreachable(
                f"the device cannot be reached: the target command {mask_command(self.command)!r} {how} "
                f"({exit_status(self._process.poll())}) without starting pytest_backendconf.target; its stderr: "
                f"{tail_text(self.stderr(), 600).strip() or '(empty)'}"
            )
        self.connect_seconds = time.monotonic() - started
        self._check(self.hello)
        return self.hello

    def _check(self, hello: Mapping[str, Any]) -> None:
        from ..errors import TargetVersionError

        where = f"the device (target command {mask_command(self.command)!r})"
        if hello.get("protocol") != PROTOCOL:
            self.close()
            raise TargetVersionError(
                f"{where} speaks runner protocol {hello.get('protocol')}, this host {PROTOCOL}: "
                "install the same pytest-backendconf on both"
            )
        mine = versions()
        wrong = []
        if hello.get("pytest_backendconf") != mine["pytest_backendconf"]:
            wrong.append(
                f"pytest-backendconf {mine['pytest_backendconf']} here, {hello.get('pytest_backendconf')} on the device"
            )
        theirs = hello["backends"]  # checked: an object of objects (`check_hello`)
        for name, entry in mine["backends"].items():
            other = theirs.get(name)
            if other is not None and other.get("version") != entry.get("version"):
                wrong.append(
                    f"backend {name!r} ({entry.get('distribution')}) {entry.get('version')} here, "
                    f"{other.get('version')} on the device"
                )
        if wrong:
            self.close()
            raise TargetVersionError(
                f"{where} runs other versions than this host: {'; '.join(wrong)}. Install the same versions on "
                "both (torch may differ: archives carry their own compatibility rules)"
            )

    def ping(self, count: int = 5, timeout: float = 10.0) -> list[float]:
        """Round trips of an empty frame, in seconds (the link's own cost per request)."""
        times = []
        for i in range(count):
            started = time.monotonic()
            self.send({"kind": "ping", "id": i})
            try:
                self._pongs.get(timeout=timeout)
            except queue.Empty:
                break
            times.append(time.monotonic() - started)
        self.rtts += times
        return times

    def wait_started(self) -> bool:
        """Wait for the runner's ``ready`` (its ``import torch``); ``False`` if the link is lost instead."""
        deadline = time.monotonic() + START_TIMEOUT
        while not self._started.is_set():
            if self.lost is not None:
                return False
            if self._started.wait(0.2):
                break
            if time.monotonic() >= deadline:
                self.drop(f"the device answered but did not finish starting (import torch) within {START_TIMEOUT:g} s")
                return False
        return True

    # -- workers ------------------------------------------------------------------------------

    def child(self, handler: str, options: Mapping[str, Any] | None = None, **kwargs: Any) -> DeviceChild:
        with self._lock:
            self._next_id += 1
            wid = self._next_id
        return DeviceChild(self, wid, handler, options, **kwargs)

    def attach(self, wid: int, worker: DeviceChild) -> None:
        """Route the runner's frames for worker ``wid`` to ``worker`` (records, stderr, its end)."""
        with self._lock:
            self._workers[wid] = worker

    def detach(self, wid: int) -> None:
        """Forget worker ``wid``: it has ended."""
        with self._lock:
            self._workers.pop(wid, None)

    def blob(self, data: bytes) -> str:
        """Send ``data`` unless this connection has it already; its sha256."""
        sha = hashlib.sha256(data).hexdigest()
        with self._lock:
            if sha in self._sent_blobs:
                return sha
            self._sent_blobs.add(sha)
        self.blob_bytes += len(data)
        self._outbox.put(json.dumps({"kind": "blob", "sha256": sha, "size": len(data)}).encode() + b"\n" + data)
        return sha

    def send(self, frame: Mapping[str, Any]) -> None:
        """Queue one frame for the runner (never blocks)."""
        self._outbox.put(json.dumps(frame).encode("utf-8") + b"\n")

    # -- ending -------------------------------------------------------------------------------

    def drop(self, reason: str) -> None:
        """Give the link up: the transport is killed, every worker on it is unreachable."""
        if self.lost is None:
            self.lost = reason
        if self._process is not None and self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except OSError:
                pass
        self._lose_workers()

    def close(self) -> None:
        """End the connection: the runner sees its stdin end, kills its workers and exits."""
        if self.lost is None:
            self.lost = "closed"
        self._outbox.put(None)
        if self._process is not None:
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self.drop("closed")

    def stderr(self) -> str:
        with self._lock:
            return bytes(self._stderr).decode("utf-8", "replace")

    def _lose_workers(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.lose(self.lost or "the link ended")

    # -- threads ------------------------------------------------------------------------------

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        self.read(self._process.stdout)
        code = self._process.wait()
        time.sleep(0.05)  # the last of the transport's stderr
        self.drop(
            f"the link to the device ended ({exit_status(code)}) without the runner reporting how its work ended; "
            f"transport stderr: {tail_text(self.stderr(), 600).strip() or '(empty)'}"
        )
        self._hello.set()

    def read(self, stream: IO[bytes]) -> None:
        """Take the runner's frames from ``stream`` until it ends, or until a frame breaks the protocol.

        The reader thread runs it on the transport's stdout. A line longer than
        `max_frame` or a frame that `check_frame` refuses drops the link
        (`broken` says why); before ``hello``, lines that are not JSON objects
        are a login's banner and skipped. A last line cut off without its
        newline is the link breaking, not a frame.
        """
        while True:
            line = _read_line(stream, self.max_frame + 1)
            if len(line) > self.max_frame and not line.endswith(b"\n"):
                self._break(f"sent a frame longer than {self.max_frame:,} bytes, the cap on a frame (docs/security.md)")
                return
            if not line.endswith(b"\n"):
                return
            try:
                frame = json.loads(line)
            except (ValueError, RecursionError) as exc:
                if self.hello is None:
                    continue  # a login banner
                shown_line = line[:80].decode("utf-8", "replace")
                self._break(f"sent a line that is not JSON ({type(exc).__name__}: {exc}): {shown_line!r}")
                return
            if self.hello is None and not isinstance(frame, dict):
                continue  # a banner that happens to parse ("42")
            try:
                if self.hello is None:
                    check_choice(frame.get("kind"), ("hello",), "kind")  # the runner's first frame
                self._take(check_frame(frame))
            except ValueError as exc:  # `InvalidField` among them
                self._break(f"sent a malformed {'hello' if self.hello is None else 'frame'}: {exc}")
                return

    def _take(self, frame: dict[str, Any]) -> None:
        """Act on one checked frame."""
        if "r" in frame:
            worker = self._workers.get(frame["w"])
            if worker is not None:
                worker.put_record(frame["r"])
            return
        kind = frame["kind"]
        if kind == "hello":
            if self.hello is not None:
                raise ValueError("a second hello on the same connection")
            self.hello = frame
            self._hello.set()
        elif kind == "ready":
            self.device_torch = frame.get("torch")
            self._started.set()
        elif kind == "pong":
            self._pongs.put(frame)
        elif kind == "stderr":
            worker = self._workers.get(frame["w"])
            if worker is not None:
                worker.add_stderr(frame["data"].encode("utf-8", "replace"))
        else:
            worker = self._workers.get(frame["w"])
            if worker is not None:
                worker.ended_on_device(frame.get("returncode"))

    def _break(self, how: str) -> None:
        """The device broke the protocol: the link is dropped, every worker on it unreachable, saying how."""
        self.broken = _reason(how)
        self.drop(f"the device broke the runner protocol: it {self.broken}")
        self._hello.set()

    def _read_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        stream: Any = self._process.stderr
        while chunk := stream.read1(65536):
            with self._lock:
                self._stderr += chunk
                del self._stderr[:-STDERR_KEPT]

    def _write(self) -> None:
        assert self._process is not None and self._process.stdin is not None
        stream = self._process.stdin
        while True:
            data = self._outbox.get()
            try:
                if data is None:
                    stream.close()
                    return
                stream.write(data)
                stream.flush()
            except (OSError, ValueError):
                return  # the reader reports the end


class DeviceChild(Child):
    """A `Child` whose interpreter is a worker of the device runner behind a `TargetLink`.

    The device's memory is not watched (`rss` is ``None``); plugins travel
    by module name only: a backend on a device is an installed distribution.
    The link's reader hands it what the runner says of it (`put_record`,
    `add_stderr`, `ended_on_device`, `lose`).
    """

    on_device = True

    def __init__(
        self,
        link: TargetLink | None,
        wid: int,
        handler: str,
        options: Mapping[str, Any] | None = None,
        *,
        blocked: Sequence[str] = (),
        plugins: Sequence[str] | None = None,
        startup_timeout: float = 120.0,
        vary_hash_seed: bool = False,
        refuse_tracing: bool = False,
        unreachable: str = "",
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.link, self.wid = link, wid
        self._gone = threading.Event()
        self._returncode: int | None = None
        self._unreachable = ""
        self._pending_blobs: list[str] = []
        if link is None or unreachable:
            self.lose(unreachable or "no link")
            return
        specs = active_plugins() if plugins is None else list(plugins)
        files = [p for p in specs if is_path(p)]
        if files:
            self._setup_error = {
                "type": "UsageError",
                "module": "pytest_backendconf.target",
                "message": f"{', '.join(files)} registers a backend from a file, which a device cannot import: "
                "install the backend on the device as a distribution with a 'backendconf' entry point",
            }
            self.ended_on_device(None)
            return
        link.attach(wid, self)
        if link.lost is not None:
            self.lose(link.lost)
            return
        setup = {
            "blocked": list(blocked),
            "plugins": specs,
            "handler": handler,
            "options": dict(options or {}),
            "refuse_tracing": refuse_tracing,
        }
        link.send({"kind": "open", "w": wid, "setup": setup})

    def file(self, path: str | os.PathLike[str]) -> dict[str, str]:
        """``path``'s bytes, sent over the link once per connection; the next message carries them."""
        with open(os.fspath(path), "rb") as f:
            data = f.read()
        if self.link is None or self.ended is not None:
            return {"$blob": hashlib.sha256(data).hexdigest()}
        sha = self.link.blob(data)
        self._pending_blobs.append(sha)
        return {"$blob": sha}

    def send(self, message: Mapping[str, Any]) -> None:
        if self.link is None or self.ended is not None or self._gone.is_set():
            return
        blobs, self._pending_blobs = self._pending_blobs, []
        self.link.send({"kind": "to", "w": self.wid, "blobs": blobs, "message": message})

    def _wait_ready(self) -> bool:
        # The runner's own start (its import torch, once per connection) is not this worker's startup time.
        if self.link is not None and not self._gone.is_set() and not self.link.wait_started():
            self.lose(self.link.lost or "the link ended")
        return super()._wait_ready()

    @property
    def alive(self) -> bool:
        return self.ended is None and not self._gone.is_set()

    def rss(self) -> int | None:
        return None

    def kill(self, *, timed_out: float | None = None, killed_because: str = "") -> Ended:
        if not self._gone.is_set() and self.link is not None:
            self.link.send({"kind": "kill", "w": self.wid, "dump": timed_out is not None})
            if not self._gone.wait(KILL_ANSWER):
                self.link.drop(
                    f"the device runner did not answer a request to kill its worker within {KILL_ANSWER:g} s"
                )
        ended = self._finish()
        if not ended.unreachable:
            ended.timed_out, ended.killed_because = timed_out, killed_because
        return ended

    def close(self, timeout: float = 10.0) -> None:
        if not self._gone.is_set() and self.link is not None:
            self.link.send({"kind": "close", "w": self.wid})
            if not self._gone.wait(timeout):
                self.kill()
        self._finish()

    def _finish(self) -> Ended:
        if self.ended is None:
            self._gone.wait()
            self.ended = Ended(
                returncode=self._returncode,
                stderr=self.stderr(),
                setup_error=self._setup_error,
                unreachable=self._unreachable,
            )
            if self.link is not None:
                self.link.detach(self.wid)
        return self.ended

    # -- from the link's reader -----------------------------------------------------------------

    def put_record(self, record: dict[str, Any]) -> None:
        """One record the worker sent."""
        self._records.put(record)

    def ended_on_device(self, returncode: int | None) -> None:
        """The runner reports the worker gone, with its exit status."""
        if not self._gone.is_set():
            self._returncode = returncode
            self._gone.set()
            self._records.put(None)

    def lose(self, reason: str) -> None:
        """The link to the worker is gone: it ends as unreachable, not as the backend's failure."""
        if not self._gone.is_set():
            self._unreachable = reason
            self._gone.set()
            self._records.put(None)


# --- the process's link ---------------------------------------------------------------------------

_COMMAND: str | None = None
_LINK: TargetLink | None = None
_LINK_LOCK = threading.Lock()


def use_target_command(command: str | None) -> None:
    """Run target-stage children of this process through ``command`` (``None``: locally)."""
    global _COMMAND, _LINK
    with _LINK_LOCK:
        if command != _COMMAND and _LINK is not None:
            _LINK.close()
            _LINK = None
        _COMMAND = command or None


def target_command() -> str | None:
    return _COMMAND


def current_link() -> TargetLink:
    """This process's link to the device, connected (again, after a loss) on first use."""
    global _LINK
    from ..errors import BackendConfError

    if _COMMAND is None:
        raise BackendConfError("no target command is set")
    with _LINK_LOCK:
        if _LINK is None or _LINK.lost is not None:
            link = TargetLink(_COMMAND)
            link.connect()
            _LINK = link
        return _LINK


def open_child(
    handler: str, options: Mapping[str, Any] | None = None, *, on_target: bool = False, **kwargs: Any
) -> Child:
    """A child for ``handler``: on the device when ``on_target`` and a target command is set, else local."""
    if not on_target or _COMMAND is None:
        return ChildProcess(handler, options, **kwargs)
    from ..errors import TargetUnreachable, TargetVersionError

    try:
        link = current_link()
    except (TargetUnreachable, TargetVersionError) as exc:
        return DeviceChild(None, 0, handler, options, unreachable=str(exc))
    return link.child(handler, options, **kwargs)


def probe(command: str, timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
    """Reach the device once: its ``hello`` (machine and versions), the connect time and the link's round trip.

    Raises `TargetUnreachable` (nothing answered within ``timeout``) or `TargetVersionError`.
    """
    link = TargetLink(command)
    try:
        hello = link.connect(timeout)
        rtts = sorted(link.ping(5))
    finally:
        link.close()
    return {
        "command": mask_command(command),
        "machine": hello.get("machine"),
        "python": hello.get("python"),
        "torch": hello.get("torch"),
        "pytest_backendconf": hello.get("pytest_backendconf"),
        "backends": hello.get("backends") or {},
        "connect_seconds": link.connect_seconds,
        "round_trip_ms": 1000 * rtts[len(rtts) // 2] if rtts else None,
    }
