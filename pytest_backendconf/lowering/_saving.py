"""`save` and `load`: a lowered module to archive records and back.

The archive layer reads and writes records and never builds a module;
this module is where the two meet: `save` takes the records of a
`LoweredModule` (and its wrapper's attributes) to `archive.encode`, and
`instantiate` builds the modules from a verified `Archive`.
"""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Mapping, Sequence

from ..archive import (
    Archive,
    Limits,
    debug_info_mode,
    default_sidecar_path,
    encode,
    encode_attributes,
    read_archive,
    with_sidecar,
    write_atomic,
)
from ..errors import ArchiveError, LoweringError
from ._bundling import bundle_entries
from ._lowered_module import LoweredModule, WrapperModule

if TYPE_CHECKING:
    import torch

    from ..archive import ArchiveInput, Bundle
    from ..backend import Backend

__all__ = ["instantiate", "load", "save", "to_bytes", "to_bytes_separate"]


def save(
    lowered: WrapperModule | LoweredModule,
    file: str | os.PathLike[str] | IO[bytes],
    *,
    debug_info: str = "embedded",
    debug_file: str | os.PathLike[str] | IO[bytes] | None = None,
    bundled_inputs: Mapping[str, Sequence[tuple[object, ...] | Bundle]] | None = None,
    eager: torch.nn.Module | None = None,
    tolerance: tuple[float, float] | None = None,
) -> None:
    """Write ``lowered`` (what `to_backend` or `load` returned) to ``file``.

    ``file`` is a path or a binary file object. A path is written
    atomically: the archive goes to a temporary file next to it, is synced,
    then renamed over the path, so the path holds either the old file or the
    whole new one. Everything is encoded before anything is written: an
    attribute that cannot be saved raises `ArchiveError` naming it, and
    nothing is written.

    :param debug_info: ``"embedded"`` (the default) keeps the source
        locations in the archive; ``"separate"`` writes an archive with debug
        handles only (no source text, file names or module names) and the
        debug info to ``debug_file``, each naming the other by content hash
        (docs/archive-format.md, "Debug info apart").
    :param debug_file: where ``"separate"`` writes the debug info: a path
        (default ``file + ".debug"``) or a binary file object.
    :param bundled_inputs: ``{method: [(x1,), (x2,)]}``: inputs to store with
        the archive, each with its expected outputs and tolerance
        (docs/archive-format.md, "Bundled inputs"); ``backendconf replay``
        runs them where the archive is loaded. An entry may also be a
        `Bundle` with its own expected outputs and tolerance. Without it, the
        bundles of a module loaded from an archive are saved again.
    :param eager: the eager module whose outputs (computed here, on the
        host) are the expected outputs of tuple entries; its method of the
        same name is called for methods other than ``forward``.
    :param tolerance: ``(rtol, atol)`` for every bundle; by default the
        backend's ``Capabilities.tolerances`` for the outputs' dtype, else
        ``torch.testing``'s default for it (the conformance suite's default).
    """
    bundles = _bundles_of(lowered, bundled_inputs, eager, tolerance)
    if debug_info_mode(debug_info) == "embedded":
        if debug_file is not None:
            raise ArchiveError('save(debug_file=...) is for debug_info="separate"; embedded debug info needs no file')
        _write(file, _encode(lowered, separate=False, bundles=bundles)[0])
        return
    if debug_file is None:
        if not isinstance(file, (str, os.PathLike)):
            raise ArchiveError(
                'save(..., debug_info="separate") to a file object needs debug_file= (a path or a binary '
                "file object for the debug info); with a path it defaults to the path + '.debug'"
            )
        debug_file = default_sidecar_path(file)
    archive, sidecar = _encode(lowered, separate=True, bundles=bundles)
    assert sidecar is not None
    # The sidecar first: an archive on disk always has its debug info beside it.
    _write(debug_file, sidecar)
    _write(file, archive)


def _write(file: str | os.PathLike[str] | IO[bytes], data: bytes) -> None:
    if isinstance(file, (str, os.PathLike)):
        write_atomic(file, data)
    elif hasattr(file, "write"):
        file.write(data)
    else:
        raise ArchiveError(f"save() writes to a path or a binary file object, got {type(file).__name__}")


def to_bytes(lowered: WrapperModule | LoweredModule) -> bytes:
    """The archive of ``lowered`` as bytes (what `save` writes)."""
    return _encode(lowered, separate=False)[0]


def to_bytes_separate(lowered: WrapperModule | LoweredModule) -> tuple[bytes, bytes]:
    """``(handles-only archive, .debug file)`` of ``lowered``: what ``save(..., debug_info="separate")`` writes."""
    archive, sidecar = _encode(lowered, separate=True)
    assert sidecar is not None
    return archive, sidecar


def _core(lowered: object) -> LoweredModule:
    core = lowered.lowered if isinstance(lowered, WrapperModule) else lowered
    if not isinstance(core, LoweredModule):
        raise ArchiveError(
            "save() needs the module returned by pytest_backendconf.to_backend() or load(), "
            f"got {type(lowered).__name__}"
        )
    return core


def _bundles_of(
    lowered: object, bundled_inputs: object, eager: object, tolerance: tuple[float, float] | None
) -> dict[str, bytes] | None:
    return bundle_entries(_core(lowered), bundled_inputs, eager, tolerance)


def _encode(lowered: object, *, separate: bool, bundles: dict[str, bytes] | None = None) -> tuple[bytes, bytes | None]:
    if bundles is None:
        bundles = _bundles_of(lowered, None, None, None)
    if isinstance(lowered, WrapperModule):
        core = lowered.lowered
        try:
            extra = lowered.extra_attributes()
        except LoweringError as exc:
            raise ArchiveError(f"cannot save the lowered module: {exc}") from None
        attributes = encode_attributes(lowered, extra)
    elif isinstance(lowered, LoweredModule):
        core = lowered
        attributes = encode_attributes(None, {})
    else:
        raise ArchiveError(
            "save() needs the module returned by pytest_backendconf.to_backend() or load(), "
            f"got {type(lowered).__name__}"
        )
    return encode(core, attributes, separate=separate, bundles=bundles)


def load(file: ArchiveInput, *, limits: Limits | None = None, debug_file: ArchiveInput | None = None) -> WrapperModule:
    """Read an archive written by `save` and return the lowered module (a `WrapperModule`).

    Every entry's size and checksum is verified before anything is used;
    then the backend named in the manifest is looked up, the wrapper's
    attributes are restored, and the blobs are compiled. Raises an
    `ArchiveError` subclass naming the entry for any damaged, truncated,
    oversized or hostile file (`ArchiveBackendError` when the backend is not
    registered here), and `BackendUnavailableError` ("Backend is not
    available. ...") when the backend cannot compile here. A backend whose
    ``compile`` fails although it reports itself available raises
    `BackendContractError`, as at lowering time.

    The loaded module keeps the archive's backend version; saving it again
    gives the same bytes (the manifest records the torch and
    pytest-backendconf versions of the process that saves).

    A handles-only archive (``save(..., debug_info="separate")``) loads
    without its debug info; its runtime errors then name the debug handle
    and the command that symbolicates it. Its ``.debug`` file is used when
    given as ``debug_file`` or found beside a path (``path + ".debug"``);
    one that does not belong to the archive raises `DebugSidecarError`.
    """
    return instantiate(with_sidecar(read_archive(file, limits=limits), file, debug_file, limits))


def instantiate(archive: Archive, backend: Backend | None = None) -> WrapperModule:
    """Create the backend, build the lowered module from ``archive``, restore attributes, compile.

    :param backend: a backend object to use instead of the registered one
        named in the manifest (the suite's availability checks load with
        stand-ins that force a condition).
    """
    if backend is None:
        backend = archive.registered_backend()
    archive.check_blob_version(backend)
    try:
        lowered = LoweredModule(
            backend,
            dict(archive.methods),
            dict(archive.blobs),
            dict(archive.debug),
            backend_version=archive.backend_version,
            state=archive.state,
        )
        if archive.partitions is not None:
            archive.partitions.apply(lowered)
        lowered.bundles = archive.bundles
        if archive.separate_debug is not None:
            # What the runtime error and a re-save need to know about the .debug file.
            lowered.separate_debug = archive.separate_debug_record()
        wrapper = WrapperModule(lowered)
    except Exception as exc:
        raise archive.setup_error(exc) from None
    archive.restore_attributes(wrapper)
    lowered.compile_now(at="load")
    return wrapper
