"""The one way the package replaces a file: atomically, so a reader sees the old file or the new one.

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
import os
import re
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
            fd = os.open(path, os.O_RDONLY)
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
    """Remove the temporary files of writes to ``directory`` that were killed; return their names."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if _MARK in n and _LEFTOVER.match(n)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
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
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(name)
        finally:
            os.close(fd)
    return removed
