"""The package's file I/O at the lowest level: the one way it replaces a file (atomically, so a reader
sees the old file or the new one) and the one way it reads back a file that may have been planted
(`read_regular_file`: a regular file, never a FIFO or a device, and a symbolic link only where the
caller follows one).

A write goes to a temporary file next to the target, named
``.<target>.backendconf-<random>.tmp`` and locked (``flock``) while it is
written. A process killed mid-write leaves its temporary file behind,
unlocked; the next write to that folder removes such leftovers, and never
a file another process is still writing.

The rename alone keeps a reader from ever seeing half a file. What the two
``fsync`` calls add is durability across a power cut or kernel crash: the
data is on disk before the rename, and the rename itself is on disk before
the call returns; without them, a crash soon after a write can leave the
old file, or on some file systems an empty one. They cost milliseconds a
file (docs/archive-format.md, "Durability"), which a run writing thousands
of throwaway files can skip with ``BACKENDCONF_FSYNC=off``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import tempfile
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: leftovers are recognised by age instead
    fcntl = None  # type: ignore[assignment]

_MARK = ".backendconf-"
_LEFTOVER = re.compile(r"\..+\.backendconf-[A-Za-z0-9_]+\.tmp\Z")
#: Without flock, a leftover is one older than this (no write takes a day).
_STALE_AFTER_S = 24 * 3600
#: With flock, a file this young is left alone: its writer may not have locked it yet.
_YOUNG_S = 10
#: ``off`` skips the fsyncs of every write that does not choose (``sync=None``); ``on`` is the default.
SYNC_ENV = "BACKENDCONF_FSYNC"


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class SpecialFileError(OSError):
    """A file the package reads back or removes is not a regular file: a FIFO, a device, a socket, a
    folder, or a symbolic link where none is followed. An `OSError`, so every reader that reports a file
    it cannot read reports this one the same way; its text names the path and what is there."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        super().__init__(errno.ELOOP if what == "a symbolic link" else errno.EINVAL, f"is {what}, not a regular file")
        self.filename = os.fspath(path)
        self.what = what

    def __str__(self) -> str:
        return f"{self.filename!r} is {self.what}, not a regular file; remove it, or name the file itself"


class FileTooLargeError(OSError):
    """A file the package reads back is larger than its reader's cap (nothing past the cap is read)."""

    def __init__(self, path: str | os.PathLike, cap: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {cap} bytes")
        self.filename = os.fspath(path)
        self.cap = cap

    def __str__(self) -> str:
        return f"{self.filename!r} is larger than {self.cap} bytes"


def file_kind(mode: int) -> str:
    """What a ``st_mode`` that is not a regular file's is, in words: ``a FIFO (named pipe)``, ``a folder``..."""
    for test, what in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return what
    return "not a regular file" if not stat.S_ISREG(mode) else "a regular file"


def check_regular_file(path: str | os.PathLike, *, follow_symlinks: bool = False) -> None:
    """A `SpecialFileError` unless ``path`` is a regular file (a link to one too when ``follow_symlinks``).

    For a path handed on to a reader elsewhere; a reader here opens it with `open_regular_file`, which
    checks the descriptor too.
    """
    looked = os.stat(path) if follow_symlinks else os.lstat(path)
    if not stat.S_ISREG(looked.st_mode):
        raise SpecialFileError(path, file_kind(looked.st_mode))


def open_regular_file(path: str | os.PathLike, *, follow_symlinks: bool = False) -> int:
    """A read-only descriptor of the regular file at ``path``; a `SpecialFileError` for anything else.

    Nothing but a regular file is ever opened for long, and nothing blocks: the path is looked at
    first (`lstat`, or `stat` when following), then opened with ``O_NONBLOCK`` (a FIFO planted in its
    place meanwhile does not wait for a writer) and ``O_NOFOLLOW`` unless ``follow_symlinks``, and the
    descriptor itself is checked (`fstat`). ``follow_symlinks``: only for a path the user named (a
    report given on the command line may be a link); never for a file found in a folder the package
    reads back (a cache entry, a report folder's files).
    """
    check_regular_file(path, follow_symlinks=follow_symlinks)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow_symlinks else _NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:  # replaced by a link since the lstat
            raise SpecialFileError(path, "a symbolic link") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SpecialFileError(path, file_kind(mode))
    return fd


def read_regular_file(path: str | os.PathLike, cap: int, *, follow_symlinks: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, at most ``cap`` of them.

    :raises SpecialFileError: ``path`` is a FIFO, a device, a socket, a folder, or a symbolic link
        (unless ``follow_symlinks``: see `open_regular_file`).
    :raises FileTooLargeError: the file holds more than ``cap`` bytes (at most ``cap + 1`` are read,
        and none when its size already says so).
    :raises OSError: it cannot be opened or read (a missing file: `FileNotFoundError`).
    """
    fd = open_regular_file(path, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb") as f:
        if os.fstat(fd).st_size > cap:
            raise FileTooLargeError(path, cap)
        data = f.read(cap + 1)  # a file that grew since its fstat still stops here
    if len(data) > cap:
        raise FileTooLargeError(path, cap)
    return data


def remove_file(path: str | os.PathLike) -> bool:
    """Remove the directory entry ``path`` itself (a link, never what it points to); False if it is a folder
    or cannot be removed. The one way a reader drops a damaged or planted file of a folder it owns."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        os.unlink(path)  # unlink never follows a symbolic link: the link goes, its target stays
    except OSError:
        return False
    return True


def probe_writable(directory: str | os.PathLike) -> None:
    """Prove ``directory`` writable by creating a file of a fresh name in it and removing that file.

    The probe is made with ``O_CREAT | O_EXCL | O_NOFOLLOW``: a file, link or FIFO already there under
    the name is never opened, written or removed (the name is random, and a clash is tried again).
    :raises OSError: the folder cannot be written.
    """
    for _ in range(10):
        probe = os.path.join(directory, f".write-test-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        os.unlink(probe)
        return
    raise FileExistsError(errno.EEXIST, "every probe name was taken", os.fspath(directory))


def sync_default() -> bool:
    """Whether a write syncs when its caller does not say: ``$BACKENDCONF_FSYNC``, ``on`` unless set."""
    value = os.environ.get(SYNC_ENV, "on")
    if value not in ("on", "off"):
        raise ValueError(
            f"{SYNC_ENV}={value!r}: use 'on' (the default: each file written is synced to disk before "
            "and after its rename) or 'off' (skip the syncs, for throwaway files; writes stay atomic)"
        )
    return value == "on"


def write_atomic(path: str | os.PathLike, data: bytes | str, *, sync: bool | None = None) -> None:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8 with ``\\n`` newlines).

    The data goes to a temporary file next to ``path``, is synced, then
    renamed over it; the rename is synced too where the OS allows. A new
    file gets the mode ``open()`` would give it (the umask), an existing one
    keeps its mode.

    :param sync: ``False`` skips both syncs (the rename still never shows a
        half-written file): for many files synced together later (`sync_files`).
        ``None`` (the default) syncs unless ``BACKENDCONF_FSYNC=off``.
    """
    if sync is None:
        sync = sync_default()
    path = os.fspath(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    mode = _new_file_mode(path)
    remove_leftovers(directory)
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}{_MARK}", suffix=".tmp", dir=directory)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file is closed
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
            if hasattr(os, "fchmod"):  # the descriptor's file: never a link put under its name meanwhile
                os.fchmod(f.fileno(), mode)
        if not hasattr(os, "fchmod"):  # pragma: no cover - Windows before Python 3.13
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if not sync:
        return
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def sync_files(paths: list[str | os.PathLike], directory: str | os.PathLike) -> None:
    """Make files written with ``write_atomic(..., sync=False)``, and their renames in ``directory``, durable.

    Nothing is synced with ``BACKENDCONF_FSYNC=off``.
    """
    if not sync_default():
        return
    for path in paths:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | _NONBLOCK)  # a FIFO in a written file's place never blocks the sync
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _new_file_mode(path: str) -> int:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        pass
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def remove_leftovers(directory: str) -> list[str]:
    """Remove the temporary files of writes to ``directory`` that were killed; return their names.

    A name of that form that is not a regular file (a FIFO, a device, a link) was never a write's
    (`tempfile.mkstemp` makes regular files): it is removed itself, never opened or followed.
    """
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if _MARK in n and _LEFTOVER.match(n)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = open_regular_file(path)
        except SpecialFileError:
            if remove_file(path):
                removed.append(name)
            continue
        except OSError:
            continue
        try:
            age = time.time() - os.fstat(fd).st_mtime
            if fcntl is not None:
                if age < _YOUNG_S:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live write holds it
            elif age < _STALE_AFTER_S:
                continue
            if remove_file(path):
                removed.append(name)
        finally:
            os.close(fd)
    return removed
