"""Archives: encode a lowered module's records as one zip file, read them back, `symbolicate` handles offline.

Layout (docs/archive-format.md; the schema versions are `_manifest.SCHEMA_VERSION`'s
comment: embedded debug info is written as 1.2, handles-only archives as 1.3). Every entry has fixed
timestamps (1980-01-01 00:00), fixed Unix attributes (0644), no extra
fields and no comments; ``manifest.json`` comes first, the rest in sorted
order::

    manifest.json       stored   format, schema version, backend, torch version,
                                 methods (MethodSpec JSON), method compile spec,
                                 {entry: {size, sha256}} for every other entry
                                 (sha256 of the bytes as stored, size inflated)
    attributes.json     stored   wrapper attributes; tensors by index
    blobs/<method>.bin  stored   the processed blob of each method (partitioned
                                 methods: see `_partitions`)
    debug.json          deflated debug info: file names, source lines and names
                                 in tables, one row per debug handle
    tensors/<n>.bin     stored   raw little-endian tensor bytes (dtype, shape in
                                 attributes.json)
    bundles.json        stored   bundled inputs, expected outputs, tolerances
                                 (schema 1.4, `_bundles`; only when there are bundles)
    bundles/<n>.bin     stored   their tensors' raw little-endian bytes

Nothing in an archive is ever run: JSON is parsed, tensors are built with
``torch.frombuffer`` from raw bytes. The reader accepts exactly the layout
the writer produces, so a change to any byte of an archive is an
`ArchiveError`: data bytes are covered by CRC-32 and SHA-256, every header
byte is compared with the header this module would write.

`save` and `load` are lowering's (`lowering._saving`): this layer reads
and writes records and never builds a module. The work is split by job: `_zip`
(the strict zip container), `_manifest` (the manifest and the verified
`Archive`), `_tensor_codec` (values and tensors), `_attributes`
(``attributes.json``), `_debug_table` (``debug.json``) and
`debuginfo._symbolication` (handle texts), `_structure` (input and output
structures), `_limits` (what the reader accepts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import TYPE_CHECKING, Iterable, Mapping, cast

from . import _partitions as _archive_partitions
from ._attributes import RESERVED_METHODS as _RESERVED_METHODS
from ._zip import DEBUG, MANIFEST, deflate, pack, read_input
from ._zip import stored_bytes as _stored_bytes
from ._bundles import BUNDLE_SCHEMA
from ._state_entries import STATE_SCHEMA, write_state
from ._debug_table import DebugInfoSizes, torch_stack_trace_bytes
from ._debug_table import encode_debug as _debug_json
from ._limits import DEFAULT_LIMITS, Limits, check_limits  # noqa: F401  (DEFAULT_LIMITS re-exported)
from ._manifest import ATTRIBUTES, BLOB, FORMAT_NAME, SCHEMA_VERSION, Archive, ArchiveReader, EntryInfo
from ..debuginfo import SymbolTable, cached_table, check_handles, join_texts
from ._sidecar import (
    check_sidecar_size,
    SEPARATE_SCHEMA,
    SIDECAR_FORMAT,
    Sidecar,
    check_pair,
    default_sidecar_path,
    handles_json,
    manifest_field,
    read_format,
    read_sidecar,
    sidecar_bytes,
    symbolicate_hint,
)
from ._tensor_codec import ValueEncoder, check_value, decode_value
from ._tensor_codec import decode_tensor as tensor_from_bytes
from ._tensor_codec import encode_tensor as tensor_to_bytes
from ..errors import ArchiveError, DebugSidecarError

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from ..lowering import LoweredModule
    from ._tensor_codec import Encoded

__all__ = [
    "ATTRIBUTES",
    "DEBUG",
    "FORMAT_NAME",
    "MANIFEST",
    "SCHEMA_VERSION",
    "Archive",
    "DebugInfoSizes",
    "EntryInfo",
    "Limits",
    "ValueEncoder",
    "check_value",
    "debug_info_sizes",
    "decode_value",
    "read_archive",
    "symbolicate",
    "tensor_from_bytes",
    "tensor_to_bytes",
    "encode",
    "debug_source",
    "Sidecar",
]


# --- public API -------------------------------------------------------------------


def encode(
    core: LoweredModule, attributes: Encoded, *, separate: bool, bundles: Mapping[str, bytes] | None = None
) -> tuple[bytes, bytes | None]:
    """The archive bytes of a lowered module's records (and its ``.debug`` file when ``separate``).

    ``core`` is what the lowering layer hands over: an object with the
    records ``methods``, ``blobs``, ``debug``, ``backend_name``,
    ``backend_version``, ``separate_debug`` and its delegations;
    ``attributes`` is what `encode_attributes` made of its wrapper;
    ``bundles`` the entries of its bundled inputs (`encode_bundles`), if any.
    """
    import torch

    from .. import __version__

    entries: dict[str, bytes] = {ATTRIBUTES: attributes.json}
    for name in core.methods:
        if not BLOB.match(f"blobs/{name}.bin") or name.startswith("_") or name in _RESERVED_METHODS:
            raise ArchiveError(
                f"method {name!r} cannot be saved: archive method names are ASCII identifiers not "
                "starting with '_'; lower the method under another name"
            )
    for name, blob in core.blobs.items():
        if name in core.methods:
            entries[f"blobs/{name}.bin"] = bytes(blob)
    partition_fields, partition_entries = _archive_partitions.write(core)
    entries.update(partition_entries)
    # The state as exported (initial_state), never the values of a module that has run.
    state_fields, state_entries = write_state(getattr(core, "initial_state", {}))
    entries.update(state_entries)
    if getattr(core, "separate_debug", None) is not None and not core.debug:
        raise ArchiveError(
            "cannot save this module: it was loaded from a handles-only archive without its .debug file, "
            "so its debug info is not here; load it with its debug file (load(path, debug_file=...), or "
            "keep the .debug file beside the archive) and save again"
        )
    full_debug = _debug_json(core.debug)
    entries[DEBUG] = handles_json(core.debug) if separate else full_debug
    for i, data in enumerate(attributes.tensor_bytes):
        entries[f"tensors/{i}.bin"] = data
    entries.update(bundles or {})
    # The lowest schema that describes the archive, so that older readers read what they can.
    kept = any(spec.state_kept_by_backend for spec in core.methods.values())
    version = (
        STATE_SCHEMA
        if state_fields or kept
        else BUNDLE_SCHEMA
        if bundles
        else SEPARATE_SCHEMA
        if separate
        else SCHEMA_VERSION
    )
    manifest = {
        "format": FORMAT_NAME,
        "schema_version": list(version),
        "writer": f"pytest-backendconf {__version__}",
        "torch_version": str(torch.__version__),
        "backend": {"name": core.backend_name, "version": core.backend_version},
        "method_compile_spec": {name: spec.compile_spec for name, spec in core.methods.items()},
        "methods": [spec.to_json() for spec in core.methods.values()],
        **partition_fields,
        **state_fields,
        **({"debug_info": manifest_field(full_debug)} if separate else {}),
        "entries": {
            name: {"size": len(data), "sha256": hashlib.sha256(_stored_bytes(name, data)).hexdigest()}
            for name, data in sorted(entries.items())
        },
    }
    try:
        manifest_bytes = json.dumps(manifest, indent=1, ensure_ascii=True, allow_nan=False).encode("ascii")
    except (TypeError, ValueError) as exc:
        raise ArchiveError(f"cannot write {MANIFEST}: {exc}; compile-spec values must be JSON-compatible") from None
    ordered = [(MANIFEST, manifest_bytes)] + sorted(entries.items())
    archive = pack(ordered)
    if not separate:
        return archive, None
    return archive, sidecar_bytes(full_debug, hashlib.sha256(archive).hexdigest())


def with_sidecar(archive: Archive, file: object, debug_file: object, limits: Limits | None) -> Archive:
    """``archive`` with the debug info of its ``.debug`` file, if it is handles-only and one is at hand."""
    if archive.separate_debug is None:
        if debug_file is not None:
            raise ArchiveError(
                f"archive {archive.source!r} has its debug info embedded; it has no .debug file to pass as debug_file"
            )
        return archive
    if archive.debug:
        return archive
    if debug_file is None and isinstance(file, (str, os.PathLike)):
        found = default_sidecar_path(file)
        debug_file = found if os.path.isfile(found) else None
    if debug_file is None:
        return archive
    sidecar = read_sidecar(debug_file, check_limits(limits))
    check_pair(archive, sidecar)
    return dataclasses.replace(archive, debug=sidecar.debug)


def debug_source(file: object, *, limits: Limits | None = None) -> Archive | Sidecar:
    """What `symbolicate` reads from a path or bytes: an archive (with its sidecar if handles-only) or a ``.debug`` file."""
    limits = check_limits(limits)
    if isinstance(file, (Archive, Sidecar)):
        return file
    if isinstance(file, (str, os.PathLike)) and os.fspath(file).endswith(".debug"):
        # Named as a debug file: its size is checked against a debug file's bound before anything is
        # read (a file of junk under the archive limit would otherwise be read whole first).
        check_sidecar_size(os.fspath(file), limits)
    if isinstance(file, (str, os.PathLike, bytes, bytearray, memoryview)):
        data, source = read_input(file, limits)
        if read_format(data, source, limits) == SIDECAR_FORMAT:
            return read_sidecar(data if not isinstance(file, (str, os.PathLike)) else file, limits)
        archive = ArchiveReader(data, source, limits).read()
    else:
        archive = read_archive(file, limits=limits)
    archive = with_sidecar(archive, file, None, limits)
    _require_debug(archive.separate_debug is not None and not archive.debug, archive.source)
    return archive


def _require_debug(missing: bool, source: str) -> None:
    if missing:
        raise DebugSidecarError(
            f"archive {source!r} keeps its debug info in a separate .debug file, which is not beside it: "
            f"symbolicate with that file ({symbolicate_hint(source)} HANDLE, or "
            'pytest_backendconf.symbolicate("....debug", handles))'
        )


def read_archive(file: object, *, limits: Limits | None = None) -> "Archive":
    """Read and verify an archive without creating its backend (and without torch).

    ``file`` is an `ArchiveInput`; anything else is an `ArchiveError` saying what it reads.
    """
    limits = check_limits(limits)
    data, source = read_input(file, limits)
    return ArchiveReader(data, source, limits).read()


def symbolicate(
    source: object,
    handles: int | Iterable[int],
    *,
    fused: bool = False,
    limits: Limits | None = None,
) -> str:
    """The symbolicated text of each debug handle, offline, from the archive's debug info alone.

    ``source`` is an archive path, bytes, a binary file, an `Archive`, or a
    lowered module; or the ``.debug`` file of a handles-only archive (a
    handles-only archive itself works when its ``.debug`` file is beside
    it). Each known handle gives a header line, e.g.
    ``debug handle 17 (method 'forward', node 'mul', aten::mul):``, then
    ``str(DebugInfo)``; an unknown one gives the pinned "was not found" text.
    The backend is never created or imported.

    With ``fused=True`` the handles are one fused kernel's range (a
    ``BackendError(..., debug_handles=[...])``): one text names every node of
    the range with its source line, the text the runtime error shows under
    the backend's message.
    """
    handles = check_handles(handles)
    table = _symbol_table(source, check_limits(limits))
    if fused:
        return table.range_text(handles)  # at most MAX_RANGE_NODES nodes, each text capped
    return join_texts(table.text, handles)  # capped: docs/archive-format.md, "Bounded text"


def debug_info_sizes(
    lowered_or_archive: object,
    programs: ExportedProgram | list[ExportedProgram] | tuple[ExportedProgram, ...] | Mapping[str, ExportedProgram],
) -> DebugInfoSizes:
    """Compare the archive's debug section with the stack traces ``torch.export`` stores.

    :param lowered_or_archive: a lowered module, or an archive (path, bytes,
        file, `Archive`) holding the same methods.
    :param programs: the ``torch.export.ExportedProgram`` of each lowered
        method (one, a list, or a dict). Each is saved with
        ``torch.export.save`` into memory and the lengths of the
        ``stack_trace`` strings in its serialized node metadata are summed
        (UTF-8 bytes); if that format changes, the in-memory
        ``node.meta["stack_trace"]`` strings are summed instead.
    """
    if isinstance(lowered_or_archive, Archive):
        raw, stored = lowered_or_archive.debug_sizes
    elif hasattr(lowered_or_archive, "lowered") or type(lowered_or_archive).__name__ == "LoweredModule":
        core = cast("LoweredModule", getattr(lowered_or_archive, "lowered", lowered_or_archive))  # by the test above
        text = _debug_json(core.debug)
        raw, stored = len(text), len(deflate(text))
    else:
        raw, stored = read_archive(lowered_or_archive).debug_sizes
    if isinstance(programs, Mapping):
        each = list(programs.values())
    elif isinstance(programs, (list, tuple)):
        each = list(programs)
    else:
        each = [programs]
    torch_bytes = sum(torch_stack_trace_bytes(p) for p in each)
    return DebugInfoSizes(stored, torch_bytes, raw)


def _symbol_table(source: object, limits: Limits) -> SymbolTable:
    if isinstance(source, Archive):
        _require_debug(source.separate_debug is not None and not source.debug, source.source)
        return cached_table(("archive", id(source)), source, lambda: source.debug)
    if isinstance(source, Sidecar):
        return cached_table(("sidecar", id(source)), source, lambda: source.debug)
    lowered = getattr(source, "lowered", source)
    if type(lowered).__name__ == "LoweredModule" and hasattr(lowered, "debug"):
        separate = getattr(lowered, "separate_debug", None)
        if separate is not None and not lowered.debug:
            raise DebugSidecarError(
                "this module was loaded from a handles-only archive without its .debug file; symbolicate "
                f"with that file ({separate['hint']} HANDLE)"
            )
        return cached_table(("lowered", id(lowered)), lowered, lambda: lowered.debug)
    if isinstance(source, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(source))
        try:
            st = os.stat(path)
        except OSError:
            return SymbolTable(debug_source(source, limits=limits).debug)  # raises the clear error
        beside = _stat_key(path + ".debug")
        key = ("path", path, st.st_size, st.st_mtime_ns, st.st_ino, beside, limits)
        return cached_table(key, None, lambda: debug_source(source, limits=limits).debug)
    return SymbolTable(debug_source(source, limits=limits).debug)


def _stat_key(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)
