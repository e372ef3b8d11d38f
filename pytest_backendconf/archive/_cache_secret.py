"""The secret the preprocess cache's entries are bound to (their MAC), kept outside every cache folder.

``$BACKENDCONF_CACHE_SECRET`` when set (a CI job's, from its secret store: a cache restored on a fresh
runner still verifies), else the user's own file, ``$XDG_CONFIG_HOME/pytest-backendconf/cache-secret``
(``~/.config/...`` by default), made on first use: 32 random bytes, mode 0600, created under a fresh
name with ``O_EXCL`` and linked into place, so that two first runs agree on one secret. Whoever can
write a cache folder but not read this secret cannot make an entry the cache takes (docs/security.md,
"The preprocess cache").
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

from ._files import read_regular_file
from ..errors import BackendConfError

SECRET_ENV = "BACKENDCONF_CACHE_SECRET"
#: The shortest secret taken from the environment: 128 bits written in hex.
MIN_SECRET_CHARS = 32
_MAKE = "python -c 'import secrets; print(secrets.token_hex(32))'"


class CacheSecretError(BackendConfError, ValueError):
    """The cache's secret cannot be had: the text names where it was looked for and the fix."""


def secret_path() -> Path:
    """Where the user's secret file is: under ``$XDG_CONFIG_HOME``, else ``~/.config``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "pytest-backendconf" / "cache-secret"


def cache_secret() -> tuple[bytes, str]:
    """``(secret, where it came from)``: the environment's, else the user's file (made if missing).

    :raises CacheSecretError: the variable is too short, or the file cannot be made or read, is not
        the user's, or others may read it.
    """
    value = os.environ.get(SECRET_ENV)
    if value:
        if len(value) < MIN_SECRET_CHARS:
            raise CacheSecretError(
                f"${SECRET_ENV} holds {len(value)} characters; give at least {MIN_SECRET_CHARS} "
                f"(e.g. the output of {_MAKE}, kept in your CI system's secrets)"
            )
        return value.encode("utf-8"), f"${SECRET_ENV}"
    path = secret_path()
    try:
        return _read_or_make(path), str(path)
    except OSError as exc:
        raise CacheSecretError(
            f"the preprocess cache's secret {path}: {exc.strerror or exc}; make it readable by you alone "
            f"(chmod 600 {path}), remove it to have a new one made, or set ${SECRET_ENV}"
        ) from None


def _read_or_make(path: Path) -> bytes:
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temporary = tempfile.mkstemp(prefix=".cache-secret-", dir=path.parent)  # O_EXCL, mode 0600
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another first run linked its own: both read that one
                os.link(temporary, path)
        finally:
            os.unlink(temporary)
    info = os.stat(path)
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise PermissionError(0, f"it belongs to user id {info.st_uid}, not to you")
    if info.st_mode & 0o077:
        raise PermissionError(0, f"its mode {stat.filemode(info.st_mode)} lets others read or change it")
    # The user's own file: a link to it (a dotfiles manager's) is followed; a FIFO or device is not read.
    data = read_regular_file(path, 4096, follow_symlinks=True).strip()
    if len(data) < MIN_SECRET_CHARS:
        raise PermissionError(0, f"it holds {len(data)} bytes, not a secret of at least {MIN_SECRET_CHARS}")
    return data
