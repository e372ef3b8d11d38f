"""``--backendconf-cache=DIR``: which folder keeps preprocess results across runs, checked at start.

Off unless given (docs/conformance-suite.md, "Reusing lowerings across runs"). The option, else the
ini option ``backendconf_cache``, else ``$BACKENDCONF_CACHE``; the folder is created if missing (mode
0700) and must be writable by you and by no one else (nor any folder it is in), as ssh's StrictModes
asks of a home; else the run stops with a usage error naming where the value came from, the folder,
its mode and owner, and the fix. The cache's secret (`archive.cache_secret`) is had here too, so a
bad one stops the run before it starts. ``--backendconf-cache-verify`` says which share of the hits
runs ``preprocess`` again. The cache itself is `pytest_backendconf.lowering.PreprocessCache`; it is
made active in the process where ``preprocess`` runs: the backend host, or the pytest process with
``--backendconf-in-process``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ._settings import setting

if TYPE_CHECKING:
    from ..registry import RegisteredBackend
    from ._context import SuiteContext

CACHE_ENV = "BACKENDCONF_CACHE"
VERIFY_ENV = "BACKENDCONF_CACHE_VERIFY"


@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """The cache folder (absolute), its size cap in bytes, and the share of hits verified (0 to 1)."""

    directory: str
    max_bytes: int
    verify: float = 0.0


CACHE_KEY = pytest.StashKey["CacheChoice | None"]()


def cache_choice(config: pytest.Config) -> CacheChoice | None:
    """The cache this run uses, its folder created and proven writable; None when none is asked for.

    :raises pytest.UsageError: the folder is a file, cannot be created or written, or others may write
        it; the size is not a positive number of MiB; the share to verify is not one; the secret cannot
        be had. The message names the option and the fix.
    """
    from ..archive import CacheSecretError, cache_secret, probe_writable
    from ..lowering import DEFAULT_CACHE_MIB

    value, where, source = setting(config, "backendconf_cache", CACHE_ENV)
    verify = _verify_share(config)
    if not value:
        if verify and config.getoption("backendconf_cache_verify", None) is not None:
            raise pytest.UsageError(
                f"--backendconf-cache-verify={config.getoption('backendconf_cache_verify')} verifies the hits of "
                "the preprocess cache; give the cache too (--backendconf-cache=DIR), or drop the option"
            )
        return None
    base = Path(config.invocation_params.dir)
    if source == "ini":  # relative to the ini file, as pytest reads its own paths
        base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    size, size_where, _ = setting(config, "backendconf_cache_size")
    try:
        mib = DEFAULT_CACHE_MIB if size is None else float(size)
    except ValueError:
        mib = -1.0
    if not mib > 0:
        raise pytest.UsageError(
            f"{size_where}: give the cache's size cap as a positive number of MiB (default {DEFAULT_CACHE_MIB}), "
            "e.g. --backendconf-cache-size=2048"
        )
    path = (base / os.path.expanduser(str(value))).resolve()
    fix = "give a folder you can write to (created if missing), e.g. ~/.cache/backendconf, or drop the option"
    if path.exists() and not path.is_dir():
        raise pytest.UsageError(f"{where}: {path} is a file, not a folder; {fix}")
    try:
        _make_folder(path)
        probe_writable(path)
    except OSError as exc:
        raise pytest.UsageError(f"{where}: cannot write to {path}: {exc.strerror or exc}; {fix}") from None
    shared = others_may_write(path)
    if shared:
        raise pytest.UsageError(
            f"{where}: {shared}. Whoever else can write there can plant entries or swap the folder; {_fix(shared)}"
        )
    try:
        _, secret_from = cache_secret()
    except CacheSecretError as exc:
        raise pytest.UsageError(f"{where}: {exc}") from None
    if Path(secret_from).resolve().is_relative_to(path):
        raise pytest.UsageError(
            f"{where}: the cache's secret {secret_from} is inside the cache folder, where whoever writes entries "
            "could read it; keep it elsewhere (set $XDG_CONFIG_HOME to another folder, or "
            "$BACKENDCONF_CACHE_SECRET), or choose another cache folder"
        )
    return CacheChoice(str(path), int(mib * 2**20), verify)


def _make_folder(path: Path) -> None:
    """Create ``path`` and the folders it is in that are missing, each readable by you alone (0700)."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def others_may_write(path: Path) -> str | None:
    """Why users other than you (and root) may write the folder ``path`` or a folder it is in, or None.

    ssh's StrictModes rule: a folder that is not yours (nor root's), or that its group or everyone
    may write, unless its sticky bit keeps them from renaming and removing what is yours (``/tmp``).
    A group that holds only its owner (a user private group, as Debian's ssh allows) is no one else.
    ``path`` is absolute with no links in it (`Path.resolve`).
    """
    if not hasattr(os, "getuid"):  # pragma: no cover - Windows: no such modes
        return None
    me = os.getuid()
    for folder in (path, *path.parents):
        info = os.stat(folder)
        mode = f"mode {stat.filemode(info.st_mode)}, owner {_user(info.st_uid)}, group {_group(info.st_gid)}"
        if info.st_uid not in (me, 0):
            return f"{folder} belongs to another user ({mode})"
        if info.st_mode & stat.S_ISVTX:
            continue
        if info.st_mode & stat.S_IWOTH:
            return f"{folder} is writable by every user ({mode})"
        if info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid, info.st_uid):
            return f"{folder} is writable by its group ({mode})"
    return None


def _fix(shared: str) -> str:
    folder = shared.split(" ", 1)[0]
    if "belongs to another user" in shared:
        return f"choose a folder of your own, or make it yours (chown {_user(os.getuid())} {folder})"
    return f"run `chmod go-w {folder}`, or choose a folder of your own"


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _group(gid: int) -> str:
    try:
        import grp

        return grp.getgrgid(gid).gr_name
    except (ImportError, KeyError):
        return str(gid)


def _private_group(gid: int, uid: int) -> bool:
    """Whether group ``gid`` is user ``uid``'s private group: named as the user, with no other member."""
    try:
        import grp
        import pwd

        group, user = grp.getgrgid(gid), pwd.getpwuid(uid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _verify_share(config: pytest.Config) -> float:
    """``--backendconf-cache-verify``: the share of hits whose ``preprocess`` runs again (0: none)."""
    value, where, _ = setting(config, "backendconf_cache_verify", VERIFY_ENV)
    text = "" if value is None else str(value).strip().lower()
    if text in ("", "none", "off"):
        return 0.0
    if text == "all":
        return 1.0
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not 0 <= share <= 1:
        raise pytest.UsageError(
            f"{where}: give the share of cache hits whose preprocess() runs again, a fraction from 0 to 1 "
            "(e.g. --backendconf-cache-verify=0.1) or 'all'"
        )
    return share


def install_cache(ctx: SuiteContext, choice: CacheChoice | None) -> None:
    """Make ``choice`` the preprocess cache of this process's lowerings of ``ctx``'s backend (None: none)."""
    from ..archive import CacheSecretError, declared_version
    from ..lowering import PreprocessCache, use_preprocess_cache

    if choice is None:
        use_preprocess_cache(None)
        return
    version = declared_version(ctx.backend, ctx.registered.source.version)
    try:
        cache = PreprocessCache(
            choice.directory, ctx.backend, version, choice.max_bytes, verify=choice.verify, source=ctx.registered.source
        )
        cache.prepare()
    except (OSError, CacheSecretError):
        # Checked at start (writable, the secret had); if that changed, the run goes on without a cache.
        use_preprocess_cache(None)
        return
    use_preprocess_cache(cache)


def cache_summary(choice: CacheChoice, counts: dict[str, int]) -> str:
    """The terminal summary's line: how many lowerings the cache served, and where it is."""
    hits, misses = counts.get("hits", 0), counts.get("misses", 0)
    line = (
        f"backendconf: preprocess cache {choice.directory}: {hits} of {hits + misses} preprocess calls reused, "
        f"{counts.get('stored', 0)} stored"
    )
    if counts.get("removed"):
        line += f", {counts['removed']} damaged entries removed"
    if counts.get("refused"):
        line += f", {counts['refused']} entries refused (their MAC does not verify: another machine's, or forged)"
    if counts.get("verified"):
        line += f", {counts['verified']} hits verified by running preprocess again"
    return line


def cache_off_notice(registered: RegisteredBackend) -> str | None:
    """The terminal's line when the cache cannot serve this backend: why, and how to enable it (None: it can)."""
    from ..lowering import backend_identity

    reason = backend_identity(registered.backend, None, registered.source).reason
    return f"backendconf: preprocess cache off for backend {registered.name!r}: {reason}" if reason else None
