"""Backend versions: which version wrote an archive's blobs, and whether the backend here accepts them.

A backend may declare ``version`` (a string) and ``accepts_blob_version(version) -> bool``
(docs/writing-a-backend.md, "Versions"). Lowering records the declared version in the
archive (else the version of the distribution that registered the backend); `load`
asks ``accepts_blob_version`` before ``compile`` ever sees a blob, so a blob from a
backend release this one cannot read is refused with both versions named, instead of
failing somewhere inside ``compile``.
"""

from __future__ import annotations

from ..errors import BackendContractError, BackendVersionError


def declared_version(backend: object, fallback: str | None = None) -> str | None:
    """The backend's own ``version`` if it declares one, else ``fallback`` (its distribution's)."""
    version = getattr(backend, "version", None)
    if version is None:
        return fallback
    if not isinstance(version, str) or not version.strip():
        raise BackendContractError(
            f"backend {getattr(backend, 'name', '?')!r} declares version {version!r}; a backend's "
            "`version` must be a non-empty string such as '1.4.0' (or leave it out)"
        )
    return version


def check_blob_version(backend: object, archive_version: str | None, where: str) -> None:
    """Ask the backend whether it reads blobs written by ``archive_version``; refuse clearly if not.

    A backend without ``accepts_blob_version`` accepts every version (its
    ``compile`` then has to cope), and an archive that records no version is
    not asked about.
    """
    accepts = getattr(backend, "accepts_blob_version", None)
    if accepts is None or archive_version is None:
        return
    name = getattr(backend, "name", "?")
    if not callable(accepts):
        raise BackendContractError(
            f"backend {name!r}: `accepts_blob_version` must be a method (version: str) -> bool, "
            f"got {type(accepts).__name__}"
        )
    try:
        answer = accepts(archive_version)
    except Exception as exc:
        raise BackendContractError(
            f"backend {name!r}: accepts_blob_version({archive_version!r}) raised {type(exc).__name__}: "
            f"{exc}; it must return True or False for any version string"
        ) from exc
    if not isinstance(answer, bool):
        raise BackendContractError(
            f"backend {name!r}: accepts_blob_version({archive_version!r}) returned {answer!r}; "
            "it must return True or False"
        )
    if answer:
        return
    ours = declared_version(backend)
    here = f"version {ours}" if ours else "the installed version"
    raise BackendVersionError(
        f"{where}: the archive's blobs were written by backend {name!r} version {archive_version}, "
        f"and backend {name!r} {here} does not accept them (accepts_blob_version({archive_version!r}) "
        f"is False). Re-lower the model with backend {name} {ours or '(installed)'} and save it "
        f"again, or install backend {name} version {archive_version} where the archive is loaded.",
        archive_version=archive_version,
        backend_version=ours,
    )


def __getattr__(name: str) -> object:
    """``same_major_not_newer``, which lived here, still imports, with a `DeprecationWarning` naming its home."""
    if name == "same_major_not_newer":
        from .._moved import warn_moved
        from ..backend import same_major_not_newer

        warn_moved(f"{__name__}.{name}", f"pytest_backendconf.backend.{name}", skip=1)
        return same_major_not_newer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
