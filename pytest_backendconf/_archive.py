"""Archives: `save` and `load` a lowered module as one zip file, and `symbolicate` handles offline.

Layout (DESIGN.md §3.6), schema version 1.0. Every entry has fixed
timestamps (1980-01-01 00:00), fixed Unix attributes (0644), no extra
fields and no comments; ``manifest.json`` comes first, the rest in sorted
order::

    manifest.json       stored   format, schema version, backend, torch version,
                                 methods (MethodSpec JSON), method compile spec,
                                 {entry: {size, sha256}} for every other entry
                                 (sha256 of the bytes as stored, size inflated)
    attributes.json     stored   wrapper attributes; tensors by index
    blobs/<method>.bin  stored   the processed blob of each method
    debug.json          deflated debug info: file names, source lines and names
                                 in tables, one row per debug handle
    tensors/<n>.bin     stored   raw little-endian tensor bytes (dtype, shape in
                                 attributes.json)

Nothing in an archive is ever run: JSON is parsed, tensors are built with
``torch.frombuffer`` from raw bytes. The reader accepts exactly the layout
the writer produces, so a change to any byte of an archive is an
`ArchiveError`: data bytes are covered by CRC-32 and SHA-256, every header
byte is compared with the header this module would write.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import struct
import sys
import tempfile
import threading
import weakref
import zlib
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from ._debug_info import DebugInfo, Frame, format_missing, hierarchy_prefix, traceback_text
from ._method_spec import DTYPE_NAMES, MethodSpec
from .errors import (
    ArchiveBackendError,
    ArchiveChecksumError,
    ArchiveEntryError,
    ArchiveError,
    ArchiveFormatError,
    ArchiveManifestError,
    ArchiveSizeError,
    ArchiveVersionError,
    LoweringError,
    RegistryError,
)

FORMAT_NAME = "backendconf-archive"
#: (major, minor): a reader loads any minor of its major; a new major is refused.
SCHEMA_VERSION = (1, 0)
MANIFEST = "manifest.json"
DEBUG = "debug.json"
ATTRIBUTES = "attributes.json"
_BLOB = re.compile(r"blobs/([A-Za-z][A-Za-z0-9_]*)\.bin\Z")
_TENSOR = re.compile(r"tensors/(0|[1-9][0-9]{0,8})\.bin\Z")
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*\Z")
_BACKEND_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
INT64_MAX = 2**63 - 1
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
#: Method names the wrapper needs for itself.
_RESERVED_METHODS = frozenset({"lowered", "extra_attributes"})
_MAX_NESTING = 64

_REWRITE = (
    "the file was changed or damaged after it was written; restore an intact copy, "
    "or lower the model and save it again with pytest_backendconf.save"
)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the reader accepts at most; anything larger is an `ArchiveSizeError`.

    The defaults admit every archive `save` can write (a zip without zip64
    extensions stays below 4 GiB); pass smaller ones to read untrusted files.
    """

    max_archive_bytes: int = 2**32 - 1
    max_entries: int = 10_000
    max_entry_bytes: int = 2**32 - 1
    max_json_bytes: int = 256 * 2**20
    #: Sum of the uncompressed sizes of all entries.
    max_total_bytes: int = 8 * 2**30


DEFAULT_LIMITS = Limits()


# --- public API -------------------------------------------------------------------


def save(lowered: Any, file: Any) -> None:
    """Write ``lowered`` (what `to_backend` or `load` returned) to ``file``.

    ``file`` is a path or a binary file object. A path is written
    atomically: the archive goes to a temporary file next to it, is synced,
    then renamed over the path, so the path holds either the old file or the
    whole new one. Everything is encoded before anything is written: an
    attribute that cannot be saved raises `ArchiveError` naming it, and
    nothing is written.
    """
    data = to_bytes(lowered)
    if isinstance(file, (str, os.PathLike)):
        _write_atomic(os.fspath(file), data)
    elif hasattr(file, "write"):
        file.write(data)
    else:
        raise ArchiveError(
            f"save() writes to a path or a binary file object, got {type(file).__name__}"
        )


def to_bytes(lowered: Any) -> bytes:
    """The archive of ``lowered`` as bytes (what `save` writes)."""
    import torch

    from . import __version__
    from ._lowering import LoweredModule, WrapperModule

    if isinstance(lowered, WrapperModule):
        core = lowered.lowered
        try:
            extra = lowered.extra_attributes()
        except LoweringError as exc:
            raise ArchiveError(f"cannot save the lowered module: {exc}") from None
        attributes = _encode_attributes(lowered, extra)
    elif isinstance(lowered, LoweredModule):
        core = lowered
        attributes = _encode_attributes(None, {})
    else:
        raise ArchiveError(
            "save() needs the module returned by pytest_backendconf.to_backend() or load(), "
            f"got {type(lowered).__name__}"
        )
    entries: dict[str, bytes] = {ATTRIBUTES: attributes.json}
    for name in core.methods:
        if not _BLOB.match(f"blobs/{name}.bin") or name.startswith("_") or name in _RESERVED_METHODS:
            raise ArchiveError(
                f"method {name!r} cannot be saved: archive method names are ASCII identifiers not "
                "starting with '_'; lower the method under another name"
            )
    for name, blob in core.blobs.items():
        entries[f"blobs/{name}.bin"] = bytes(blob)
    entries[DEBUG] = _debug_json(core.debug)
    for i, data in enumerate(attributes.tensor_bytes):
        entries[f"tensors/{i}.bin"] = data
    manifest = {
        "format": FORMAT_NAME,
        "schema_version": list(SCHEMA_VERSION),
        "writer": f"pytest-backendconf {__version__}",
        "torch_version": str(torch.__version__),
        "backend": {"name": core.backend_name, "version": core.backend_version},
        "method_compile_spec": {name: spec.compile_spec for name, spec in core.methods.items()},
        "methods": [spec.to_json() for spec in core.methods.values()],
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
    return _pack(ordered)


def load(file: Any, *, limits: Limits | None = None) -> Any:
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
    """
    archive = read_archive(file, limits=limits)
    return archive.instantiate()


def read_archive(file: Any, *, limits: Limits | None = None) -> "Archive":
    """Read and verify an archive without creating its backend (and without torch)."""
    data, source = _read_input(file, limits or DEFAULT_LIMITS)
    return _Reader(data, source, limits or DEFAULT_LIMITS).read()


def symbolicate(source: Any, handles: int | Iterable[int]) -> str:
    """The §3.5 text for each debug handle, offline, from the archive's debug info alone.

    ``source`` is an archive path, bytes, a binary file, an `Archive`, or a
    lowered module. Each known handle gives a header line, e.g.
    ``debug handle 17 (method 'forward', node 'mul', aten::mul):``, then
    ``str(DebugInfo)``; an unknown one gives the pinned "was not found" text.
    The backend is never created or imported.
    """
    if isinstance(handles, int):
        handles = (handles,)
    handles = list(handles)
    wrong = next((h for h in handles if type(h) is not int), None)
    if wrong is not None:
        raise TypeError(f"debug handles are integers, got {wrong!r} ({type(wrong).__name__})")
    text = _symbol_table(source).text
    return "\n".join([text(h) for h in handles])


class DebugInfoSizes(NamedTuple):
    """Sizes for the debug-info target of DESIGN.md §6 (debug info ≤ 1/3 of torch's stack traces)."""

    #: Bytes ``debug.json`` occupies in the archive (deflated).
    debug_bytes: int
    #: Bytes of the ``stack_trace`` strings ``torch.export.save`` stores for the same programs.
    torch_stack_trace_bytes: int
    #: Bytes of ``debug.json`` uncompressed.
    debug_uncompressed_bytes: int

    @property
    def ratio(self) -> float:
        """``debug_bytes / torch_stack_trace_bytes`` (the target is ≤ 1/3)."""
        return self.debug_bytes / self.torch_stack_trace_bytes if self.torch_stack_trace_bytes else math.inf


def debug_info_sizes(lowered_or_archive: Any, programs: Any) -> DebugInfoSizes:
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
        core = getattr(lowered_or_archive, "lowered", lowered_or_archive)
        text = _debug_json(core.debug)
        raw, stored = len(text), len(_deflate(text))
    else:
        raw, stored = read_archive(lowered_or_archive).debug_sizes
    if isinstance(programs, Mapping):
        programs = list(programs.values())
    elif not isinstance(programs, (list, tuple)):
        programs = [programs]
    torch_bytes = sum(_torch_stack_trace_bytes(p) for p in programs)
    return DebugInfoSizes(stored, torch_bytes, raw)


# --- the verified contents of an archive ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One zip entry: its name, uncompressed and stored sizes, compression, SHA-256."""

    name: str
    size: int
    stored_size: int
    compression: str  # "stored" or "deflated"
    sha256: str


@dataclasses.dataclass(frozen=True, eq=False)
class Archive:
    """A verified archive: everything `load` needs except the backend."""

    source: str
    file_size: int
    schema_version: tuple[int, int]
    writer: str | None
    torch_version: str
    backend_name: str
    backend_version: str | None
    methods: dict[str, MethodSpec]
    method_compile_spec: dict[str, dict]
    blobs: dict[str, bytes]
    debug: dict[int, DebugInfo]
    entries: tuple[EntryInfo, ...]
    manifest: dict[str, Any]
    #: ``(raw, stored)`` bytes of debug.json.
    debug_sizes: tuple[int, int]
    _attributes: list[dict[str, Any]] = dataclasses.field(repr=False)
    _tensor_meta: list[dict[str, Any]] = dataclasses.field(repr=False)
    _tensor_bytes: list[bytes] = dataclasses.field(repr=False)

    def where(self, entry: str) -> str:
        return f"archive {self.source!r}, entry {entry!r}"

    def instantiate(self, backend: Any = None) -> Any:
        """Create the backend, build the lowered module, restore attributes, compile.

        :param backend: a backend object to use instead of the registered one
            named in the manifest (the suite's availability checks load with
            stand-ins that force a condition).
        """
        from ._lowering import LoweredModule, WrapperModule
        from ._registry import lookup_backend

        if backend is None:
            try:
                backend = lookup_backend(self.backend_name).backend
            except RegistryError as exc:
                raise ArchiveBackendError(
                    f"{self.where(MANIFEST)}: the archive was lowered for backend {self.backend_name!r}, "
                    f"which cannot be used here: {exc}"
                ) from None
        _check_trees(self)
        try:
            lowered = LoweredModule(
                backend,
                dict(self.methods),
                dict(self.blobs),
                dict(self.debug),
                backend_version=self.backend_version,
            )
            wrapper = WrapperModule(lowered)
        except Exception as exc:
            raise ArchiveManifestError(
                f"{self.where(MANIFEST)}: its methods cannot be set up: {type(exc).__name__}: {exc}; {_REWRITE}"
            ) from None
        tensors = [
            _tensor_from_bytes(data, meta, f"{self.where(f'tensors/{i}.bin')}")
            for i, (meta, data) in enumerate(zip(self._tensor_meta, self._tensor_bytes))
        ]
        _restore_attributes(wrapper, self._attributes, tensors, self.where(ATTRIBUTES))
        lowered.compile_now(at="load")
        return wrapper


# --- reading -----------------------------------------------------------------------------

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_LOCAL_SIG, _CENTRAL_SIG, _END_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_VERSION_NEEDED = 20
_MADE_BY = (3 << 8) | 20  # Unix, zip 2.0
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
_DOS_TIME = 0
_EXTERNAL_ATTR = 0o100644 << 16
_STORED, _DEFLATED = 0, 8
# Deflate cannot expand data more than ~1032:1; a larger declared ratio is a bomb.
_MAX_DEFLATE_RATIO = 1032


@dataclasses.dataclass
class _ZipEntry:
    name: str
    method: int
    crc: int
    size: int
    raw: memoryview
    offset: int


class _Reader:
    def __init__(self, data: bytes, source: str, limits: Limits) -> None:
        self.data = memoryview(data)
        self.source = source
        self.limits = limits
        self.layout_problem: str | None = None

    def where(self, entry: str) -> str:
        return f"archive {self.source!r}, entry {entry!r}"

    # The order matters: the manifest's version is checked before the
    # layout, so that an archive from another major version says so.
    def read(self) -> Archive:
        entries = self._parse_zip()
        if not entries or entries[0].name != MANIFEST:
            first = entries[0].name if entries else "nothing"
            raise ArchiveEntryError(
                f"archive {self.source!r}: its first entry is {first!r}, not {MANIFEST!r}: it is not a "
                "pytest-backendconf archive, or it was damaged; write archives with pytest_backendconf.save"
            )
        manifest = self._json(entries[0])
        if not isinstance(manifest, dict):
            raise ArchiveManifestError(f"{self.where(MANIFEST)}: must be a JSON object, got {_kind(manifest)}; {_REWRITE}")
        version = self._check_format_and_version(manifest)
        if self.layout_problem:
            raise ArchiveFormatError(self.layout_problem)
        by_name = self._check_names(entries)
        return self._read_contents(manifest, version, entries, by_name)

    # --- zip structure ---

    def _parse_zip(self) -> list[_ZipEntry]:
        data, n = self.data, len(self.data)
        if n < _END.size or bytes(data[:4]) != _LOCAL_SIG.to_bytes(4, "little"):
            if n >= 4 and bytes(data[:4]) == _LOCAL_SIG.to_bytes(4, "little"):
                raise ArchiveFormatError(f"archive {self.source!r} is truncated ({n} bytes); {_REWRITE}")
            raise ArchiveFormatError(
                f"archive {self.source!r} is not a zip file (it does not start with a zip entry header), "
                "so it is not a pytest-backendconf archive; write archives with pytest_backendconf.save"
            )
        # The first entry's name, from its local header: a foreign zip is named as such.
        name_len = int.from_bytes(data[26:28], "little")
        first = bytes(data[_LOCAL.size : _LOCAL.size + name_len])
        if first != MANIFEST.encode() and _LOCAL.size + name_len <= n:
            shown = first.decode("ascii", "replace")
            hint = (
                " (this looks like a torch.export.save file: load it with torch.export.load)"
                if shown.startswith("archive/") or "/archive/" in shown
                else ""
            )
            raise ArchiveEntryError(
                f"archive {self.source!r}: its first entry is {shown!r}, not {MANIFEST!r}: it is not a "
                f"pytest-backendconf archive{hint}, or it was damaged; write archives with "
                "pytest_backendconf.save"
            )
        end_at = n - _END.size
        sig, disk, cd_disk, count_disk, count, cd_size, cd_offset, comment_len = _END.unpack_from(data, end_at)
        if sig != _END_SIG:
            raise ArchiveFormatError(
                f"archive {self.source!r}: the zip end-of-central-directory record is not in its last "
                f"{_END.size} bytes: the file is truncated, has data appended, or carries a zip comment "
                f"(this format writes none); {_REWRITE}"
            )
        if count > self.limits.max_entries:
            raise ArchiveSizeError(
                f"archive {self.source!r}: the zip end record declares {count} entries, more than the "
                f"limit of {self.limits.max_entries}; pass load(..., limits=Limits(max_entries=...)) if "
                "the archive is trusted"
            )
        if disk or cd_disk or count_disk != count or comment_len or cd_offset + cd_size != end_at:
            raise ArchiveFormatError(
                f"archive {self.source!r}: the zip end-of-central-directory record is inconsistent "
                f"(entries {count_disk}/{count}, directory {cd_size} bytes at {cd_offset}, comment "
                f"{comment_len} bytes, file {n} bytes): it is truncated or was modified; {_REWRITE}"
            )
        entries: list[_ZipEntry] = []
        pos, expected_offset, total = cd_offset, 0, 0
        for i in range(count):
            if pos + _CENTRAL.size > end_at:
                raise ArchiveFormatError(
                    f"archive {self.source!r}: central directory record #{i} runs past the directory's end; "
                    f"{_REWRITE}"
                )
            (csig, made_by, needed, flags, method, mtime, mdate, crc, csize, usize, name_len, extra_len,
             comment_len, disk_start, internal, external, offset) = _CENTRAL.unpack_from(data, pos)
            record_end = pos + _CENTRAL.size + name_len + extra_len + comment_len
            if csig != _CENTRAL_SIG or record_end > end_at:
                raise ArchiveFormatError(
                    f"archive {self.source!r}: central directory record #{i} (at byte {pos}) is "
                    f"{'damaged' if csig != _CENTRAL_SIG else 'truncated'}; {_REWRITE}"
                )
            raw_name = bytes(data[pos + _CENTRAL.size : pos + _CENTRAL.size + name_len])
            name = self._entry_name(raw_name)
            if method not in (_STORED, _DEFLATED):
                raise ArchiveFormatError(
                    f"{self.where(name)}: compression method {method} is not one this format writes "
                    f"(0 stored, 8 deflated); {_REWRITE}"
                )
            if usize > self.limits.max_entry_bytes:
                raise ArchiveSizeError(
                    f"{self.where(name)}: declares {usize} bytes, more than the limit of "
                    f"{self.limits.max_entry_bytes}; pass limits=Limits(...) if the archive is trusted"
                )
            total += usize
            if total > self.limits.max_total_bytes:
                raise ArchiveSizeError(
                    f"{self.where(name)}: the entries up to this one declare {total} bytes in all, more "
                    f"than the limit of {self.limits.max_total_bytes} (a zip bomb?)"
                )
            if method == _STORED and csize != usize:
                raise ArchiveSizeError(
                    f"{self.where(name)}: is stored uncompressed but declares {usize} bytes of content "
                    f"in {csize} stored bytes; {_REWRITE}"
                )
            if method == _DEFLATED and usize > csize * _MAX_DEFLATE_RATIO + 64:
                raise ArchiveSizeError(
                    f"{self.where(name)}: declares {usize} bytes from {csize} deflated bytes, more than "
                    "deflate can produce (a zip bomb?)"
                )
            data_start = offset + _LOCAL.size + name_len
            data_end = data_start + csize
            if offset != expected_offset:
                raise ArchiveFormatError(
                    f"{self.where(name)}: its local header is at byte {offset}, but the previous entry ends "
                    f"at byte {expected_offset}; {_REWRITE}"
                )
            if data_end > cd_offset:
                raise ArchiveSizeError(
                    f"{self.where(name)}: declares {csize} stored bytes at byte {data_start}, past the end "
                    f"of the entry data at byte {cd_offset} (truncated, or an oversized declared size); "
                    f"{_REWRITE}"
                )
            if self.layout_problem is None:
                expected_local = _local_header(raw_name, method, crc, csize, usize)
                actual_local = bytes(data[offset:data_start])
                expected_central = _central_header(raw_name, method, crc, csize, usize, offset)
                actual_central = bytes(data[pos:record_end])
                if actual_local != expected_local:
                    self.layout_problem = self._layout_text(name, "local header", offset, actual_local, expected_local)
                elif actual_central != expected_central:
                    self.layout_problem = self._layout_text(name, "central directory record", pos, actual_central, expected_central)
            entries.append(_ZipEntry(name, method, crc, usize, data[data_start:data_end], offset))
            expected_offset = data_end
            pos = record_end
        if pos != end_at:
            raise ArchiveFormatError(
                f"archive {self.source!r}: {end_at - pos} unexplained bytes after the central directory's "
                f"{count} records; {_REWRITE}"
            )
        if expected_offset != cd_offset:
            raise ArchiveFormatError(
                f"archive {self.source!r}: {cd_offset - expected_offset} unexplained bytes between the last "
                f"entry's data and the central directory; {_REWRITE}"
            )
        return entries

    def _layout_text(self, name: str, what: str, at: int, actual: bytes, expected: bytes) -> str:
        diff = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b), min(len(actual), len(expected)))
        return (
            f"{self.where(name)}: its zip {what} differs at byte {at + diff} from the one "
            "pytest_backendconf.save writes (fixed timestamps and attributes, no extra fields): "
            f"{_REWRITE} (a zip re-packed by another tool is not accepted)"
        )

    def _entry_name(self, raw: bytes) -> str:
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError:
            raise ArchiveEntryError(
                f"archive {self.source!r}: entry name {raw!r} is not ASCII; this format writes only "
                f"ASCII names; {_REWRITE}"
            ) from None
        if (
            not name
            or len(name) > 255
            or "\\" in name
            or name.startswith("/")
            or ":" in name
            or any(part in ("", ".", "..") for part in name.split("/"))
            or not _SAFE_NAME.match(name)
        ):
            raise ArchiveEntryError(
                f"{self.where(name)}: unsafe entry name (absolute, '..', backslash, drive or unusual "
                f"characters); it is never extracted, and the archive is refused; {_REWRITE}"
            )
        return name

    def _check_names(self, entries: list[_ZipEntry]) -> dict[str, _ZipEntry]:
        by_name: dict[str, _ZipEntry] = {}
        previous = None
        for entry in entries:
            if entry.name in by_name:
                raise ArchiveEntryError(f"{self.where(entry.name)}: appears twice in the archive; {_REWRITE}")
            if entry.name == MANIFEST and entry is not entries[0]:
                raise ArchiveEntryError(f"{self.where(MANIFEST)}: appears after other entries; {_REWRITE}")
            if previous is not None and entry.name < previous:
                raise ArchiveEntryError(
                    f"{self.where(entry.name)}: comes after {previous!r}; this format writes entries in "
                    f"sorted order after {MANIFEST}; {_REWRITE}"
                )
            if entry is not entries[0]:
                previous = entry.name
            by_name[entry.name] = entry
        return by_name

    # --- entry contents ---

    def _bytes(self, entry: _ZipEntry) -> bytes:
        if entry.method == _STORED:
            out = bytes(entry.raw)
        else:
            inflater = zlib.decompressobj(-15)
            try:
                out = inflater.decompress(entry.raw, entry.size + 1)
            except zlib.error as exc:
                raise ArchiveChecksumError(f"{self.where(entry.name)}: its deflated data is corrupt ({exc}); {_REWRITE}") from None
            if len(out) > entry.size or inflater.unconsumed_tail:
                raise ArchiveSizeError(
                    f"{self.where(entry.name)}: inflates to more than its declared {entry.size} bytes "
                    f"(a zip bomb?); {_REWRITE}"
                )
            if not inflater.eof or inflater.unused_data or len(out) != entry.size:
                raise ArchiveChecksumError(
                    f"{self.where(entry.name)}: its deflated data is truncated or has trailing bytes "
                    f"({len(out)} of {entry.size} bytes inflated); {_REWRITE}"
                )
        if zlib.crc32(out) != entry.crc:
            raise ArchiveChecksumError(f"{self.where(entry.name)}: fails its CRC-32 check; {_REWRITE}")
        return out

    def _json(self, entry: _ZipEntry) -> Any:
        if entry.size > self.limits.max_json_bytes:
            raise ArchiveSizeError(
                f"{self.where(entry.name)}: {entry.size} bytes of JSON, more than the limit of "
                f"{self.limits.max_json_bytes}"
            )
        return self._parse_json(entry.name, self._bytes(entry))

    def _parse_json(self, name: str, data: bytes) -> Any:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArchiveManifestError(f"{self.where(name)}: is not UTF-8 ({exc}); {_REWRITE}") from None
        try:
            return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite)
        except RecursionError:
            raise ArchiveManifestError(f"{self.where(name)}: JSON nested too deeply; {_REWRITE}") from None
        except ValueError as exc:
            raise ArchiveManifestError(f"{self.where(name)}: is not valid JSON ({exc}); {_REWRITE}") from None

    def _check_format_and_version(self, manifest: dict) -> tuple[int, int]:
        if manifest.get("format") != FORMAT_NAME:
            raise ArchiveFormatError(
                f"{self.where(MANIFEST)}: format is {manifest.get('format')!r}, not {FORMAT_NAME!r}: this "
                "is not a pytest-backendconf archive; write archives with pytest_backendconf.save"
            )
        version = manifest.get("schema_version")
        if (
            not isinstance(version, list)
            or len(version) != 2
            or not all(_is_int(v) and 0 <= v < 2**31 for v in version)
        ):
            raise ArchiveManifestError(
                f"{self.where(MANIFEST)}: schema_version must be [major, minor] (two integers), got "
                f"{_short(version)}; {_REWRITE}"
            )
        major, minor = version
        if major != SCHEMA_VERSION[0]:
            from . import __version__

            ours = f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}"
            if major > SCHEMA_VERSION[0]:
                todo = (
                    f"upgrade pytest-backendconf to a release that reads schema {major}.x, or re-lower "
                    f"the model and save it with pytest-backendconf {__version__}"
                )
            else:
                todo = (
                    f"re-lower the model and save it with pytest-backendconf {__version__}, or load it "
                    "with the older release that wrote it and save it with this one"
                )
            raise ArchiveVersionError(
                f"{self.where(MANIFEST)}: schema version {major}.{minor}, but pytest-backendconf "
                f"{__version__} reads schema {SCHEMA_VERSION[0]}.x (it writes {ours}); {todo}"
            )
        return major, minor

    def _read_contents(
        self, manifest: dict, version: tuple[int, int], entries: list[_ZipEntry], by_name: dict[str, _ZipEntry]
    ) -> Archive:
        where = self.where(MANIFEST)
        newer = version[1] > SCHEMA_VERSION[1]
        backend = _field(manifest, "backend", dict, where)
        backend_name = _field(backend, "name", str, f"{where}: backend")
        if not _BACKEND_NAME.match(backend_name):
            raise ArchiveManifestError(
                f"{where}: backend name {_short(backend_name)} is not a backend name ([a-z][a-z0-9_]*); {_REWRITE}"
            )
        backend_version = backend.get("version")
        if backend_version is not None and not isinstance(backend_version, str):
            raise ArchiveManifestError(f"{where}: backend.version must be a string or null, got {_kind(backend_version)}; {_REWRITE}")
        torch_version = _field(manifest, "torch_version", str, where)
        writer = manifest.get("writer")
        if writer is not None and not isinstance(writer, str):
            raise ArchiveManifestError(f"{where}: writer must be a string, got {_kind(writer)}; {_REWRITE}")
        compile_spec = _field(manifest, "method_compile_spec", dict, where)
        methods = self._methods(_field(manifest, "methods", list, where), compile_spec)
        listed = _field(manifest, "entries", dict, where)

        # The entry set must be the one the manifest lists.
        for name in by_name:
            if name != MANIFEST and name not in listed:
                raise ArchiveEntryError(
                    f"{self.where(name)}: is in the zip but not listed in {MANIFEST} (added after the "
                    f"archive was written?); {_REWRITE}"
                )
        for name, record in listed.items():
            if name == MANIFEST:
                raise ArchiveManifestError(f"{where}: entries lists {MANIFEST} itself; {_REWRITE}")
            if name not in by_name:
                raise ArchiveEntryError(f"{self.where(name)}: listed in {MANIFEST} but missing from the zip; {_REWRITE}")
            if not isinstance(record, dict) or not _is_int(record.get("size")) or not isinstance(record.get("sha256"), str):
                raise ArchiveManifestError(
                    f"{where}: entries[{name!r}] must be {{\"size\": int, \"sha256\": str}}, got {_short(record)}; {_REWRITE}"
                )
            known = name in (DEBUG, ATTRIBUTES) or _BLOB.match(name) or _TENSOR.match(name)
            if not known and not newer:
                raise ArchiveEntryError(
                    f"{self.where(name)}: not an entry of schema {version[0]}.{version[1]} "
                    f"({MANIFEST}, {ATTRIBUTES}, {DEBUG}, blobs/<method>.bin, tensors/<n>.bin); {_REWRITE}"
                )
        for name in (DEBUG, ATTRIBUTES):
            if name not in by_name:
                raise ArchiveEntryError(f"{self.where(name)}: missing from the archive; {_REWRITE}")

        # Verify every entry before using any.
        contents: dict[str, bytes] = {}
        for entry in entries[1:]:
            record = listed[entry.name]
            if entry.name in (DEBUG, ATTRIBUTES) and entry.size > self.limits.max_json_bytes:
                raise ArchiveSizeError(
                    f"{self.where(entry.name)}: {entry.size} bytes of JSON, more than the limit of "
                    f"{self.limits.max_json_bytes}"
                )
            # The hash covers the bytes as stored, before inflating: a deflate
            # stream has padding bits that can change without changing what
            # it inflates to, and hostile data is refused before it is inflated.
            digest = hashlib.sha256(entry.raw).hexdigest()
            if digest != record["sha256"]:
                raise ArchiveChecksumError(
                    f"{self.where(entry.name)}: SHA-256 is {digest}, but {MANIFEST} records "
                    f"{_short(record['sha256'])}; {_REWRITE}"
                )
            data = self._bytes(entry)
            if record["size"] != len(data):
                raise ArchiveSizeError(
                    f"{self.where(entry.name)}: has {len(data)} bytes, but {MANIFEST} records "
                    f"{record['size']}; {_REWRITE}"
                )
            contents[entry.name] = data

        blobs: dict[str, bytes] = {}
        for name in methods:
            entry_name = f"blobs/{name}.bin"
            if entry_name not in contents:
                raise ArchiveEntryError(f"{self.where(entry_name)}: the blob of method {name!r} is missing; {_REWRITE}")
            blobs[name] = contents[entry_name]
        for name in contents:
            match = _BLOB.match(name)
            if match and match[1] not in methods:
                raise ArchiveEntryError(f"{self.where(name)}: a blob for method {match[1]!r}, which {MANIFEST} does not list; {_REWRITE}")

        debug = _decode_debug(self._parse_json(DEBUG, contents[DEBUG]), self.where(DEBUG), set(methods))
        attributes, tensor_meta = _check_attributes(
            self._parse_json(ATTRIBUTES, contents[ATTRIBUTES]), self.where(ATTRIBUTES), set(methods)
        )
        tensor_bytes = []
        for i, meta in enumerate(tensor_meta):
            name = f"tensors/{i}.bin"
            if name not in contents:
                raise ArchiveEntryError(f"{self.where(name)}: tensor {i} of {ATTRIBUTES} is missing; {_REWRITE}")
            expected = meta["numel"] * ITEMSIZE[meta["dtype"]]
            if len(contents[name]) != expected:
                raise ArchiveSizeError(
                    f"{self.where(name)}: has {len(contents[name])} bytes, but a {meta['dtype']} tensor of "
                    f"shape {meta['shape']} needs {expected}; {_REWRITE}"
                )
            tensor_bytes.append(contents[name])
        for name in contents:
            match = _TENSOR.match(name)
            if match and int(match[1]) >= len(tensor_meta):
                raise ArchiveEntryError(f"{self.where(name)}: no tensor of {ATTRIBUTES} refers to it; {_REWRITE}")

        infos = tuple(
            EntryInfo(
                e.name, e.size, len(e.raw), "stored" if e.method == _STORED else "deflated",
                hashlib.sha256(self._bytes(e)).hexdigest() if e.name == MANIFEST else listed[e.name]["sha256"],
            )
            for e in entries
        )
        return Archive(
            source=self.source,
            file_size=len(self.data),
            schema_version=version,
            writer=writer,
            torch_version=torch_version,
            backend_name=backend_name,
            backend_version=backend_version,
            methods=methods,
            method_compile_spec=compile_spec,
            blobs=blobs,
            debug=debug,
            entries=infos,
            manifest=manifest,
            debug_sizes=(by_name[DEBUG].size, len(by_name[DEBUG].raw)),
            _attributes=attributes,
            _tensor_meta=tensor_meta,
            _tensor_bytes=tensor_bytes,
        )

    def _methods(self, records: list, compile_spec: dict) -> dict[str, MethodSpec]:
        where = self.where(MANIFEST)
        if not records:
            raise ArchiveManifestError(f"{where}: methods is empty; a lowered module has at least one; {_REWRITE}")
        methods: dict[str, MethodSpec] = {}
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                raise ArchiveManifestError(f"{where}: methods[{i}] must be an object, got {_kind(record)}; {_REWRITE}")
            try:
                spec = MethodSpec.from_json(record)
                spec.signature()
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
                raise ArchiveManifestError(
                    f"{where}: methods[{i}] is not a valid method spec ({type(exc).__name__}: {exc}); {_REWRITE}"
                ) from None
            name = record.get("name")
            if (
                not isinstance(name, str)
                or not name.isidentifier()
                or name.startswith("_")
                or name in _RESERVED_METHODS
            ):
                raise ArchiveManifestError(
                    f"{where}: methods[{i}] has name {_short(name)}, which cannot be a lowered method's "
                    f"name; {_REWRITE}"
                )
            if name in methods:
                raise ArchiveManifestError(f"{where}: method {name!r} is listed twice; {_REWRITE}")
            if name not in compile_spec or compile_spec[name] != spec.compile_spec:
                raise ArchiveManifestError(
                    f"{where}: method_compile_spec[{name!r}] does not match the method's own compile spec; {_REWRITE}"
                )
            methods[name] = spec
        extra = sorted(set(compile_spec) - set(methods))
        if extra:
            raise ArchiveManifestError(f"{where}: method_compile_spec names {extra}, which methods does not list; {_REWRITE}")
        return methods


def _check_trees(archive: Archive) -> None:
    """The pytree specs must parse and fit the flat inputs and outputs (needs torch)."""
    from torch.utils import _pytree as pytree

    for name, spec in archive.methods.items():
        for key, count in (("in_spec", len(spec.inputs)), ("out_spec", len(spec.outputs))):
            try:
                tree = pytree.treespec_loads(getattr(spec, key))
                leaves = tree.num_leaves
            except Exception as exc:
                raise ArchiveManifestError(
                    f"{archive.where(MANIFEST)}: method {name!r} has an unreadable {key} "
                    f"({type(exc).__name__}: {exc}); {_REWRITE}"
                ) from None
            if leaves != count:
                raise ArchiveManifestError(
                    f"{archive.where(MANIFEST)}: method {name!r} has {count} flat "
                    f"{'inputs' if key == 'in_spec' else 'outputs'} but its {key} has {leaves} leaves; {_REWRITE}"
                )


# --- debug info --------------------------------------------------------------------------


class _Table:
    """Deduplicates values into a list, by first appearance."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.items: list[Any] = []

    def __call__(self, value: Any) -> int:
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.items)
            self.items.append(list(value) if isinstance(value, tuple) else value)
        return found


def _debug_json(debug: Mapping[int, DebugInfo]) -> bytes:
    """``debug.json``: tables of files, source lines and names; frames, stacks and
    module hierarchies deduplicated; then one row per handle, in handle order:
    ``[handle - previous handle, op, node, method, hierarchy, stack]``."""
    files, lines, names = _Table(), _Table(), _Table()
    frames, stacks, hierarchies = _Table(), _Table(), _Table()
    rows = []
    previous = 0
    for handle in sorted(debug):
        info = debug[handle]
        stack = []
        for f in info.frames:
            row: tuple = (files(f.file), f.line, names(f.name), -1 if f.source is None else lines(f.source))
            if f.col is not None or f.end_col is not None:
                row += (f.col, f.end_col)
            stack.append(frames(row))
        hierarchy = tuple(i for pair in info.module_hierarchy for i in (names(pair[0]), names(pair[1])))
        rows.append([handle - previous, names(info.op), names(info.node), names(info.method),
                     hierarchies(hierarchy), stacks(tuple(stack))])
        previous = handle
    document = {
        "files": files.items, "lines": lines.items, "names": names.items, "frames": frames.items,
        "stacks": stacks.items, "hierarchies": hierarchies.items, "nodes": rows,
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _decode_debug(document: Any, where: str, methods: set[str]) -> dict[int, DebugInfo]:
    def bad(what: str) -> ArchiveManifestError:
        return ArchiveManifestError(f"{where}: {what}; {_REWRITE}")

    if not isinstance(document, dict):
        raise bad(f"must be a JSON object, got {_kind(document)}")
    tables = {}
    for key in ("files", "lines", "names", "frames", "stacks", "hierarchies", "nodes"):
        value = document.get(key)
        if not isinstance(value, list):
            raise bad(f"{key} must be a list, got {_kind(value)}")
        tables[key] = value
    for key in ("files", "lines", "names"):
        for i, s in enumerate(tables[key]):
            if not isinstance(s, str):
                raise bad(f"{key}[{i}] must be a string, got {_kind(s)}")
    files, lines, names = tables["files"], tables["lines"], tables["names"]

    def index(value: Any, table: list, what: str, optional: bool = False) -> Any:
        if optional and value == -1 and _is_int(value):
            return None
        if not _is_int(value) or not 0 <= value < len(table):
            raise bad(f"{what} refers to {_short(value)}, outside its table of {len(table)}")
        return table[value]

    frames = []
    for i, row in enumerate(tables["frames"]):
        what = f"frames[{i}]"
        if not isinstance(row, list) or len(row) not in (4, 6):
            raise bad(f"{what} must be [file, line, name, source(, col, end_col)], got {_short(row)}")
        if not _is_int(row[1]) or row[1] < 0:
            raise bad(f"{what} has line {_short(row[1])}")
        col = end_col = None
        if len(row) == 6:
            col, end_col = row[4], row[5]
            for v in (col, end_col):
                if v is not None and (not _is_int(v) or v < 0):
                    raise bad(f"{what} has column {_short(v)}")
        frames.append(Frame(
            file=index(row[0], files, f"{what} file"),
            line=row[1],
            name=index(row[2], names, f"{what} name"),
            source=index(row[3], lines, f"{what} source", optional=True),
            col=col,
            end_col=end_col,
        ))
    stacks = []
    n_frames = len(frames)
    for i, row in enumerate(tables["stacks"]):
        if not isinstance(row, list):
            raise bad(f"stacks[{i}] must be a list, got {_kind(row)}")
        if all(type(f) is int and 0 <= f < n_frames for f in row):
            stacks.append(tuple([frames[f] for f in row]))
        else:
            stacks.append(tuple(index(f, frames, f"stacks[{i}]") for f in row))
    hierarchies = []
    n_names = len(names)
    for i, row in enumerate(tables["hierarchies"]):
        if not isinstance(row, list) or len(row) % 2:
            raise bad(f"hierarchies[{i}] must be a list of (name, class) index pairs, got {_short(row)}")
        if all(type(v) is int and 0 <= v < n_names for v in row):
            items = [names[v] for v in row]
        else:
            items = [index(v, names, f"hierarchies[{i}]") for v in row]
        hierarchies.append(tuple(zip(items[::2], items[1::2])))
    debug: dict[int, DebugInfo] = {}
    handle = 0
    n_hierarchies, n_stacks = len(hierarchies), len(stacks)
    # One row per node, so the checks of a well-formed row are inline; a row
    # that fails any of them goes through index() for the error naming it.
    for i, row in enumerate(tables["nodes"]):
        if not isinstance(row, list) or len(row) != 6:
            raise bad(f"nodes[{i}] must be [handle delta, op, node, method, hierarchy, stack], got {_short(row)}")
        delta, op, node, method, hierarchy, stack = row
        if type(delta) is not int or delta < (0 if i == 0 else 1) or handle + delta > INT64_MAX:
            raise bad(f"nodes[{i}] has handle delta {_short(delta)}; handles must increase and fit int64")
        handle += delta
        if not (
            type(op) is int and 0 <= op < n_names
            and type(node) is int and 0 <= node < n_names
            and type(method) is int and 0 <= method < n_names
            and type(hierarchy) is int and 0 <= hierarchy < n_hierarchies
            and type(stack) is int and 0 <= stack < n_stacks
            and names[method] in methods
        ):
            what = f"nodes[{i}]"
            name = index(method, names, f"{what} method")
            if name not in methods:
                raise bad(f"{what} names method {name!r}, which the manifest does not list")
            index(op, names, f"{what} op")
            index(node, names, f"{what} node")
            index(hierarchy, hierarchies, f"{what} hierarchy")
            index(stack, stacks, f"{what} stack")
        debug[handle] = DebugInfo._from_row(
            handle, names[op], names[node], names[method], hierarchies[hierarchy], stacks[stack]
        )
    return debug


def _deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


# --- symbolication -----------------------------------------------------------------------


class _SymbolTable:
    """Formats the text of each handle once; lookups are dictionary hits.

    Handles share stacks and module hierarchies (decoded from the archive's
    tables as shared objects), so the traceback and hierarchy lines are
    formatted once per distinct stack and hierarchy, found by object
    identity (each entry keeps its object, so a reused id never matches).
    """

    def __init__(self, debug: Mapping[int, DebugInfo]) -> None:
        self.debug = debug
        self.cache: dict[Any, str] = {}
        self._tracebacks: dict[int, tuple[Any, str]] = {}
        self._hierarchies: dict[tuple[int, str], tuple[Any, str]] = {}

    def text(self, handle: int) -> str:
        found = self.cache.get(handle)
        if found is None:
            info = self.debug.get(handle)
            if info is None:
                found = format_missing([handle])
            else:
                found = f"debug handle {handle} (method {info.method!r}, node {info.node!r}, {info.op}):\n{self._body(info)}"
            self.cache[handle] = found
        return found

    def _body(self, info: DebugInfo) -> str:
        """``str(info)``, from the shared parts."""
        key = (id(info.module_hierarchy), info.method)
        prefix = self._hierarchies.get(key)
        if prefix is None or prefix[0] is not info.module_hierarchy:
            prefix = self._hierarchies[key] = (info.module_hierarchy, hierarchy_prefix(info.module_hierarchy, info.method))
        traceback = self._tracebacks.get(id(info.frames))
        if traceback is None or traceback[0] is not info.frames:
            traceback = self._tracebacks[id(info.frames)] = (info.frames, traceback_text(info.frames))
        hierarchy = f"{prefix[1]}.{info.op}" if prefix[1] else info.op
        return f"  Module hierarchy:{hierarchy}\n{traceback[1]}"


_TABLES: "collections.OrderedDict[Any, _SymbolTable]" = collections.OrderedDict()
_TABLES_LOCK = threading.Lock()


def _symbol_table(source: Any) -> _SymbolTable:
    if isinstance(source, Archive):
        return _cached_table(("archive", id(source)), source, lambda: source.debug)
    lowered = getattr(source, "lowered", source)
    if type(lowered).__name__ == "LoweredModule" and hasattr(lowered, "debug"):
        return _cached_table(("lowered", id(lowered)), lowered, lambda: lowered.debug)
    if isinstance(source, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(source))
        try:
            st = os.stat(path)
        except OSError:
            return _SymbolTable(read_archive(source).debug)  # raises the clear error
        key = ("path", path, st.st_size, st.st_mtime_ns, st.st_ino)
        return _cached_table(key, None, lambda: read_archive(source).debug)
    return _SymbolTable(read_archive(source).debug)


def _cached_table(key: Any, owner: Any, debug: Callable[[], Mapping[int, DebugInfo]]) -> _SymbolTable:
    with _TABLES_LOCK:
        found = _TABLES.get(key)
        # id() keys are reused after collection: the table must belong to this very object.
        if found is not None and (owner is None or found.owner() is owner):  # type: ignore[attr-defined]
            _TABLES.move_to_end(key)
            return found
    table = _SymbolTable(debug())
    table.owner = weakref.ref(owner) if owner is not None else None  # type: ignore[attr-defined]
    with _TABLES_LOCK:
        _TABLES[key] = table
        while len(_TABLES) > 8:
            _TABLES.popitem(last=False)
    return table


# --- attributes and tensors ----------------------------------------------------------------


class _Encoded(NamedTuple):
    json: bytes
    tensor_bytes: list[bytes]


class ValueEncoder:
    """Turns tensors, scalars, and lists/tuples/dicts of them into JSON plus raw tensor bytes.

    Scalars are JSON literals (non-finite floats ``{"float": "nan"}``); a
    tuple is ``{"tuple": [...]}``, a dict ``{"dict": [[key, value], ...]}``,
    a tensor ``{"tensor": n}`` with ``tensors[n] = {"dtype", "shape"}`` and
    its raw bytes. The same tensor object is stored once.
    """

    def __init__(self) -> None:
        self.meta: list[dict[str, Any]] = []
        self.data: list[bytes] = []
        self._seen: dict[int, tuple[int, Any]] = {}

    def encode(self, value: Any, where: str, depth: int = 0) -> Any:
        if depth > _MAX_NESTING:
            raise ArchiveError(f"{where} is nested more than {_MAX_NESTING} levels deep (or contains itself)")
        kind = type(value)
        if value is None or kind is bool or kind is str or kind is int:
            return value
        if kind is float:
            return value if math.isfinite(value) else {"float": repr(value)}
        if kind is list:
            return [self.encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if kind is tuple:
            return {"tuple": [self.encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]}
        if kind is dict:
            items = []
            for k, v in value.items():
                if not (k is None or type(k) in (bool, int, float, str)):
                    raise ArchiveError(
                        f"{where} has a key of type {type(k).__name__}; keys must be str, int, float, "
                        "bool or None"
                    )
                items.append([self.encode(k, where, depth + 1), self.encode(v, f"{where}[{k!r}]", depth + 1)])
            return {"dict": items}
        if _is_tensor(value):
            return {"tensor": self.tensor(value, where)}
        raise ArchiveError(
            f"{where} is a {kind.__module__}.{kind.__qualname__}, which an archive cannot hold; keep "
            "tensors, int, float, bool, str, None, and lists, tuples or dicts of them"
        )

    def tensor(self, t: Any, where: str) -> int:
        seen = self._seen.get(id(t))
        if seen is not None and seen[1] is t:
            return seen[0]
        meta, data = tensor_to_bytes(t, where)
        self.meta.append(meta)
        self.data.append(data)
        self._seen[id(t)] = (len(self.meta) - 1, t)
        return len(self.meta) - 1


def tensor_to_bytes(t: Any, where: str) -> tuple[dict[str, Any], bytes]:
    """``({"dtype", "shape"}, raw little-endian bytes)`` of a dense CPU-copyable tensor."""
    import torch

    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise ArchiveError(f"{where} is a tensor subclass {type(t).__name__}; save a plain torch.Tensor")
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in DTYPE_NAMES:
        raise ArchiveError(f"{where} has dtype {dtype}; archives hold {', '.join(DTYPE_NAMES)}")
    if t.layout != torch.strided or t.device.type == "meta":
        raise ArchiveError(f"{where} is a {t.layout} tensor on {t.device}; archives hold dense tensors with data")
    if sys.byteorder != "little":
        raise ArchiveError("archives store tensors little-endian; saving on a big-endian host is not supported")
    c = t.detach()
    if c.device.type != "cpu":
        c = c.cpu()
    c = c.resolve_conj().resolve_neg().contiguous()
    # bytes(untyped_storage) copies element by element in Python (seconds per
    # MB); copying into a bytearray-backed uint8 tensor is one memcpy.
    out = bytearray(c.numel() * c.element_size())
    if out:
        torch.frombuffer(out, dtype=torch.uint8).copy_(c.reshape(-1).view(torch.uint8))
    return {"dtype": dtype, "shape": list(c.shape)}, bytes(out)


def tensor_from_bytes(data: bytes, meta: Mapping[str, Any], where: str) -> Any:
    return _tensor_from_bytes(data, _check_tensor_meta(meta, where), where)


def _tensor_from_bytes(data: bytes, meta: Mapping[str, Any], where: str) -> Any:
    import torch

    if sys.byteorder != "little":
        raise ArchiveError(f"{where}: archives store tensors little-endian; this host is big-endian")
    dtype = getattr(torch, meta["dtype"])
    shape = tuple(meta["shape"])
    if len(data) != meta["numel"] * ITEMSIZE[meta["dtype"]]:
        raise ArchiveSizeError(f"{where}: {len(data)} bytes do not make a {meta['dtype']} tensor of shape {list(shape)}")
    if meta["numel"] == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def _check_tensor_meta(meta: Any, where: str) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise ArchiveManifestError(f"{where}: tensor record must be an object, got {_kind(meta)}; {_REWRITE}")
    dtype, shape = meta.get("dtype"), meta.get("shape")
    if dtype not in ITEMSIZE:
        raise ArchiveManifestError(
            f"{where}: unknown tensor dtype {_short(dtype)}; archives hold {', '.join(DTYPE_NAMES)}; {_REWRITE}"
        )
    if not isinstance(shape, list) or len(shape) > 64 or not all(_is_int(d) and 0 <= d < 2**62 for d in shape):
        raise ArchiveManifestError(f"{where}: tensor shape {_short(shape)} is not a list of sizes; {_REWRITE}")
    numel = 1
    for d in shape:
        numel *= d
        if numel > 2**62:
            raise ArchiveSizeError(f"{where}: tensor shape {shape} is too large; {_REWRITE}")
    return {"dtype": dtype, "shape": shape, "numel": numel}


def decode_value(tree: Any, tensors: Sequence[Any], where: str) -> Any:
    """Inverse of `ValueEncoder.encode`, ``tensors`` by index (call `check_value` first)."""
    if isinstance(tree, list):
        return [decode_value(v, tensors, where) for v in tree]
    if isinstance(tree, dict):
        ((tag, body),) = tree.items()
        if tag == "tensor":
            return tensors[body]
        if tag == "float":
            return float(body)
        if tag == "tuple":
            return tuple(decode_value(v, tensors, where) for v in body)
        return {decode_value(k, tensors, where): decode_value(v, tensors, where) for k, v in body}
    return tree


def check_value(tree: Any, n_tensors: int, where: str, depth: int = 0, key: bool = False) -> None:
    """Raise `ArchiveManifestError` unless ``tree`` is a value `ValueEncoder` writes."""
    def bad(what: str) -> ArchiveManifestError:
        return ArchiveManifestError(f"{where}: {what}; {_REWRITE}")

    if depth > _MAX_NESTING:
        raise bad(f"value nested more than {_MAX_NESTING} levels deep")
    if tree is None or isinstance(tree, (bool, int, str)) or (isinstance(tree, float) and math.isfinite(tree)):
        return
    if isinstance(tree, list) and not key:
        for v in tree:
            check_value(v, n_tensors, where, depth + 1)
        return
    if isinstance(tree, dict) and len(tree) == 1:
        ((tag, body),) = tree.items()
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return
        if key:
            raise bad(f"dict key {_short(tree)} is not a scalar")
        if tag == "tensor":
            if not _is_int(body) or not 0 <= body < n_tensors:
                raise bad(f"tensor reference {_short(body)} is outside the table of {n_tensors} tensors")
            return
        if tag == "tuple" and isinstance(body, list):
            for v in body:
                check_value(v, n_tensors, where, depth + 1)
            return
        if tag == "dict" and isinstance(body, list):
            for item in body:
                if not isinstance(item, list) or len(item) != 2:
                    raise bad(f"dict item {_short(item)} is not a [key, value] pair")
                check_value(item[0], n_tensors, where, depth + 1, key=True)
                check_value(item[1], n_tensors, where, depth + 1)
            return
    raise bad(f"{_short(tree)} is not an encoded value")


_ATTRIBUTE_KINDS = ("attribute", "parameter", "buffer")


def _encode_attributes(wrapper: Any, extra: Mapping[str, Any]) -> _Encoded:
    encoder = ValueEncoder()
    records = []
    for name, value in extra.items():
        where = f"attribute {name!r}"
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("__") or name in dir(type(wrapper)):
            raise ArchiveError(
                f"cannot save the lowered module: {where} is not an identifier, is a dunder, or "
                "shadows a member of the lowered module; give it another name"
            )
        record: dict[str, Any] = {"name": name}
        if wrapper is not None and name in wrapper._parameters:
            record["kind"] = "parameter"
            record["requires_grad"] = bool(value is not None and value.requires_grad)
        elif wrapper is not None and name in wrapper._buffers:
            record["kind"] = "buffer"
            record["persistent"] = name not in wrapper._non_persistent_buffers_set
        else:
            record["kind"] = "attribute"
        if record["kind"] != "attribute" and value is not None and not _is_tensor(value):
            raise ArchiveError(f"cannot save the lowered module: {where} is a {record['kind']} but not a tensor")
        try:
            record["value"] = encoder.encode(value, where)
        except ArchiveError as exc:
            raise ArchiveError(f"cannot save the lowered module: {exc}") from None
        records.append(record)
    document = {"attributes": records, "tensors": encoder.meta}
    try:
        text = json.dumps(document, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except ValueError as exc:  # pragma: no cover - the encoder already refuses these
        raise ArchiveError(f"cannot encode the lowered module's attributes: {exc}") from None
    return _Encoded(text.encode("ascii"), encoder.data)


def _check_attributes(document: Any, where: str, methods: set[str]) -> tuple[list[dict], list[dict]]:
    def bad(what: str) -> ArchiveManifestError:
        return ArchiveManifestError(f"{where}: {what}; {_REWRITE}")

    if not isinstance(document, dict):
        raise bad(f"must be a JSON object, got {_kind(document)}")
    records, tensors = document.get("attributes"), document.get("tensors")
    if not isinstance(records, list) or not isinstance(tensors, list):
        raise bad("must have lists 'attributes' and 'tensors'")
    metas = [_check_tensor_meta(meta, f"{where}, tensors[{i}]") for i, meta in enumerate(tensors)]
    names = set()
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise bad(f"attributes[{i}] must be an object, got {_kind(record)}")
        name, kind = record.get("name"), record.get("kind")
        if (
            not isinstance(name, str)
            or not name.isidentifier()
            or name.startswith("__")
            or name in names
            or name in methods
            or name in _RESERVED_METHODS
            or name in _WRAPPER_MEMBERS
        ):
            raise bad(f"attributes[{i}] has name {_short(name)}, which cannot be restored on the lowered module")
        names.add(name)
        if kind not in _ATTRIBUTE_KINDS:
            raise bad(f"attribute {name!r} has kind {_short(kind)}; expected one of {_ATTRIBUTE_KINDS}")
        if "value" not in record:
            raise bad(f"attribute {name!r} has no value")
        value = record["value"]
        check_value(value, len(metas), f"{where}, attribute {name!r}")
        if kind != "attribute":
            if not (value is None or isinstance(value, dict) and "tensor" in value):
                raise bad(f"attribute {name!r} is a {kind} but its value is not a tensor")
            flag = "requires_grad" if kind == "parameter" else "persistent"
            if not isinstance(record.get(flag), bool):
                raise bad(f"attribute {name!r} must have a boolean {flag!r}")
            if record.get("requires_grad") and value is not None and (
                not metas[value["tensor"]]["dtype"].startswith(("float", "bfloat", "complex"))
            ):
                raise bad(f"parameter {name!r} requires grad but its tensor is not floating point")
    return records, metas


# Names an attribute may never take: the wrapper's own state and methods.
_WRAPPER_MEMBERS = frozenset({"_baseline", "training", "lowered"})


def _restore_attributes(wrapper: Any, records: list[dict], tensors: list[Any], where: str) -> None:
    import torch

    taken = set(wrapper.__dict__) | set(dir(type(wrapper)))
    for record in records:
        name = record["name"]
        if name in taken:
            raise ArchiveManifestError(
                f"{where}: attribute {name!r} would replace a member of the lowered module; {_REWRITE}"
            )
        value = decode_value(record["value"], tensors, where)
        if record["kind"] == "parameter":
            parameter = None if value is None else torch.nn.Parameter(value, requires_grad=record["requires_grad"])
            wrapper.register_parameter(name, parameter)
        elif record["kind"] == "buffer":
            wrapper.register_buffer(name, value, persistent=record["persistent"])
        else:
            setattr(wrapper, name, value)


# --- zip writing ---------------------------------------------------------------------------


def _local_header(name: bytes, method: int, crc: int, csize: int, usize: int) -> bytes:
    return _LOCAL.pack(
        _LOCAL_SIG, _VERSION_NEEDED, 0, method, _DOS_TIME, _DOS_DATE, crc, csize, usize, len(name), 0
    ) + name


def _central_header(name: bytes, method: int, crc: int, csize: int, usize: int, offset: int) -> bytes:
    return _CENTRAL.pack(
        _CENTRAL_SIG, _MADE_BY, _VERSION_NEEDED, 0, method, _DOS_TIME, _DOS_DATE, crc, csize, usize,
        len(name), 0, 0, 0, 0, _EXTERNAL_ATTR, offset,
    ) + name


def _method_for(name: str) -> int:
    return _DEFLATED if name == DEBUG else _STORED


def _stored_bytes(name: str, data: bytes) -> bytes:
    """An entry's bytes as they stand in the zip (deflated for ``debug.json``)."""
    return _deflate(data) if _method_for(name) == _DEFLATED else data


def _pack(entries: Sequence[tuple[str, bytes]]) -> bytes:
    """The zip of ``entries`` (in the given order), in this format's one fixed layout."""
    chunks: list[bytes] = []
    central: list[bytes] = []
    offset = 0
    for name, data in entries:
        raw_name = name.encode("ascii")
        method = _method_for(name)
        stored = _stored_bytes(name, data)
        crc = zlib.crc32(data)
        header = _local_header(raw_name, method, crc, len(stored), len(data))
        central.append(_central_header(raw_name, method, crc, len(stored), len(data), offset))
        chunks += (header, stored)
        offset += len(header) + len(stored)
    directory = b"".join(central)
    if offset + len(directory) + _END.size > 2**32 - 1 or len(entries) > 0xFFFF:
        raise ArchiveSizeError(
            f"the archive would be {offset + len(directory)} bytes in {len(entries)} entries; schema "
            f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]} holds at most 4 GiB in 65535 entries"
        )
    chunks += (directory, _END.pack(_END_SIG, 0, 0, len(entries), len(entries), len(directory), offset, 0))
    return b"".join(chunks)


# --- files ------------------------------------------------------------------------------------


def _read_input(file: Any, limits: Limits) -> tuple[bytes, str]:
    cap = limits.max_archive_bytes
    if isinstance(file, (bytes, bytearray, memoryview)):
        data, source = bytes(file), "<bytes>"
    elif isinstance(file, (str, os.PathLike)):
        source = os.fspath(file)
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > cap:
                raise ArchiveSizeError(f"archive {source!r} is {size} bytes, more than the limit of {cap}")
            data = f.read(cap + 1)
    elif hasattr(file, "read"):
        source = str(getattr(file, "name", None) or f"<{type(file).__name__}>")
        data = file.read(cap + 1)
        if not isinstance(data, (bytes, bytearray)):
            raise ArchiveError(f"archive {source!r}: the file object must be opened in binary mode ('rb')")
        data = bytes(data)
    else:
        raise ArchiveError(f"load() reads a path, bytes, or a binary file object, got {type(file).__name__}")
    if len(data) > cap:
        raise ArchiveSizeError(f"archive {source!r} is more than the limit of {cap} bytes")
    return data, source


def _write_atomic(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    mode = _new_file_mode(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
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


# --- torch.export's stack traces, for debug_info_sizes ------------------------------------------


def _torch_stack_trace_bytes(program: Any) -> int:
    import zipfile

    import torch

    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    total, found = 0, False
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as z:
        for info in z.infolist():
            if not info.filename.endswith(".json"):
                continue
            try:
                document = json.loads(z.read(info))
            except ValueError:
                continue
            for text in _values_of(document, "stack_trace"):
                found = True
                total += len(text.encode("utf-8"))
    if found:
        return total
    return sum(
        len((node.meta.get("stack_trace") or "").encode("utf-8"))
        for module in program.graph_module.modules()
        if hasattr(module, "graph")
        for node in module.graph.nodes
    )


def _values_of(document: Any, key: str) -> Iterator[str]:
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if k == key and isinstance(v, str):
                    yield v
                else:
                    stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)


# --- small helpers ----------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field(mapping: dict, key: str, kind: type, where: str) -> Any:
    value = mapping.get(key)
    if not isinstance(value, kind) or (kind is int and not _is_int(value)):
        expected = {dict: "an object", list: "a list", str: "a string", int: "an integer"}[kind]
        raise ArchiveManifestError(f"{where}: {key} must be {expected}, got {_kind(value)}; {_REWRITE}")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:30]} is out of range")
    return value
