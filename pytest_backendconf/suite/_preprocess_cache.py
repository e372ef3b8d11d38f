"""``--backendconf-cache=DIR``: which folder keeps preprocess results across runs, checked at start.

Off unless given (docs/conformance-suite.md, "Reusing lowerings across runs"). The option, else the
ini option ``backendconf_cache``, else ``$BACKENDCONF_CACHE``; the folder is created if missing and
must be writable, or the run stops with a usage error naming where the value came from and the fix.
The cache itself is `pytest_backendconf.lowering.PreprocessCache`; it is made active in the process
where ``preprocess`` runs: the backend host, or the pytest process with ``--backendconf-in-process``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ._settings import setting

if TYPE_CHECKING:
    from ..registry import RegisteredBackend
    from ._context import SuiteContext

CACHE_ENV = "BACKENDCONF_CACHE"


@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """The cache folder (absolute) and its size cap in bytes."""

    directory: str
    max_bytes: int


CACHE_KEY = pytest.StashKey["CacheChoice | None"]()


def cache_choice(config: pytest.Config) -> CacheChoice | None:
    """The cache this run uses, its folder created and proven writable; None when none is asked for.

    :raises pytest.UsageError: the folder is a file or cannot be created or written, or the size is
        not a positive number of MiB; the message names the option and the fix.
    """
    from ..lowering import DEFAULT_CACHE_MIB

    value, where, source = setting(config, "backendconf_cache", CACHE_ENV)
    if not value:
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
        _writable(path)
    except OSError as exc:
        raise pytest.UsageError(f"{where}: cannot write to {path}: {exc.strerror or exc}; {fix}") from None
    return CacheChoice(str(path), int(mib * 2**20))


def _writable(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def install_cache(ctx: SuiteContext, choice: CacheChoice | None) -> None:
    """Make ``choice`` the preprocess cache of this process's lowerings of ``ctx``'s backend (None: none)."""
    from ..archive import declared_version
    from ..lowering import PreprocessCache, use_preprocess_cache

    if choice is None:
        use_preprocess_cache(None)
        return
    version = declared_version(ctx.backend, ctx.registered.source.version)
    cache = PreprocessCache(choice.directory, ctx.backend, version, choice.max_bytes, ctx.registered.source)
    try:
        cache.prepare()
    except OSError:
        use_preprocess_cache(None)  # checked writable at start; if that changed, the run goes on without a cache
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
    return line


def cache_off_notice(registered: RegisteredBackend) -> str | None:
    """The terminal's line when the cache cannot serve this backend: why, and how to enable it (None: it can)."""
    from ..lowering import backend_identity

    reason = backend_identity(registered.backend, None, registered.source).reason
    return f"backendconf: preprocess cache off for backend {registered.name!r}: {reason}" if reason else None
