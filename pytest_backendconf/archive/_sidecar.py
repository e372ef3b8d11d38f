"""Debug info kept apart from the model: a handles-only archive and its ``.debug`` file.

``save(lowered, path, debug_info="separate")`` writes two files
(docs/archive-format.md, "Debug info apart"):

- the archive, schema 1.3, whose ``debug.json`` holds the debug handles
  only (``{"handles": [deltas]}``) and whose manifest field ``debug_info``
  records ``{"mode": "separate", "sha256": ..., "size": ...}`` of the debug
  table the sidecar holds: no source text, file names or module names;
- the sidecar (default ``path + ".debug"``), the same strict zip layout with
  its own ``manifest.json`` (format ``backendconf-debug``, the SHA-256 of
  the archive file it belongs to, the SHA-256 of its debug table) and the
  full ``debug.json`` an embedded archive would hold.

Each names the other by content hash, so a mismatched pair is refused
(`DebugSidecarError`, naming both hashes). A device loads the archive alone;
a failure there reads ``(debug_handle=17; symbolicate with: backendconf
symbolicate model.bcpt.debug 17)``, and the host symbolicates from the sidecar.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import TYPE_CHECKING, Any, Mapping

from .._quoting import shell_command
from ._checks import REWRITE as _REWRITE
from ._checks import field as _field
from ._checks import is_int as _is_int
from ._checks import kind as _kind
from ._checks import short as _short
from ._zip import _STORED, DEBUG, MANIFEST, ZipReader, pack, read_input, stored_bytes
from ..debuginfo import DebugInfo
from ._debug_table import INT64_MAX, decode_debug
from ..errors import (
    ArchiveEntryError,
    ArchiveError,
    ArchiveFormatError,
    ArchiveManifestError,
    ArchiveSizeError,
    DebugSidecarError,
)

if TYPE_CHECKING:
    from ._limits import Limits
    from ._manifest import Archive

SIDECAR_FORMAT = "backendconf-debug"
SIDECAR_SCHEMA = (1, 0)
#: The archive schema a handles-only archive is written with (1.3 added ``debug_info``).
SEPARATE_SCHEMA = (1, 3)
SEPARATE = "separate"
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


def debug_info_mode(value: object) -> str:
    """``debug_info=`` of `save`, checked: ``"embedded"`` or ``"separate"``."""
    if value not in ("embedded", SEPARATE):
        raise ValueError(
            f'save(debug_info={_short(value)}): pass debug_info="embedded" (the default: source '
            'locations inside the archive) or debug_info="separate" (handles only, plus a .debug file)'
        )
    return value


def default_sidecar_path(path: str | os.PathLike) -> str:
    return os.fspath(path) + ".debug"


# --- the archive's side --------------------------------------------------------------------


def handles_json(debug: Mapping[int, DebugInfo]) -> bytes:
    """The handles-only ``debug.json``: ``{"handles": [first, delta, delta, ...]}``."""
    previous, deltas = 0, []
    for handle in sorted(debug):
        deltas.append(handle - previous)
        previous = handle
    return json.dumps({"handles": deltas}, separators=(",", ":")).encode("ascii")


def manifest_field(full_debug_json: bytes) -> dict[str, Any]:
    """The archive manifest's ``debug_info`` field: which debug table belongs to it."""
    return {"mode": SEPARATE, "sha256": hashlib.sha256(full_debug_json).hexdigest(), "size": len(full_debug_json)}


def read_manifest_field(manifest: dict, version: tuple[int, int], where: str) -> dict[str, Any] | None:
    """The checked ``debug_info`` field of an archive manifest, or ``None`` for an embedded archive."""
    value = manifest.get("debug_info")
    if value is None:
        return None
    if version < SEPARATE_SCHEMA:
        raise ArchiveManifestError(
            f"{where}: has debug_info, which schema {version[0]}.{version[1]} does not have; {_REWRITE}"
        )
    if not isinstance(value, dict) or value.get("mode") != SEPARATE:
        raise ArchiveManifestError(
            f'{where}: debug_info must be {{"mode": "separate", ...}}, got {_short(value)}; {_REWRITE}'
        )
    sha = value.get("sha256")
    if not isinstance(sha, str) or not _SHA256.match(sha) or not _is_int(value.get("size")) or value["size"] < 0:
        raise ArchiveManifestError(
            f"{where}: debug_info must record the sidecar's sha256 (64 hex digits) and size, got {_short(value)}; {_REWRITE}"
        )
    return value


def decode_handles(document: object, where: str) -> tuple[int, ...]:
    """The handles of a handles-only ``debug.json``."""
    handles = document.get("handles") if isinstance(document, dict) else None
    if not isinstance(handles, list):
        raise ArchiveManifestError(
            f'{where}: a handles-only debug.json must be {{"handles": [...]}}, got {_kind(document)}; {_REWRITE}'
        )
    out, handle = [], 0
    for i, delta in enumerate(handles):
        if not _is_int(delta) or delta < (0 if i == 0 else 1) or handle + delta > INT64_MAX:
            raise ArchiveManifestError(
                f"{where}: handles[{i}] is {_short(delta)}; handles must increase and fit int64; {_REWRITE}"
            )
        handle += delta
        out.append(handle)
    return tuple(out)


# --- the sidecar ------------------------------------------------------------------------------


def sidecar_bytes(full_debug_json: bytes, archive_sha256: str) -> bytes:
    """The sidecar file for an archive whose bytes hash to ``archive_sha256``."""
    manifest = {
        "format": SIDECAR_FORMAT,
        "schema_version": list(SIDECAR_SCHEMA),
        "archive_sha256": archive_sha256,
        "debug_sha256": hashlib.sha256(full_debug_json).hexdigest(),
        "entries": {
            DEBUG: {
                "size": len(full_debug_json),
                "sha256": hashlib.sha256(stored_bytes(DEBUG, full_debug_json)).hexdigest(),
            }
        },
    }
    text = json.dumps(manifest, indent=1, ensure_ascii=True).encode("ascii")
    return pack([(MANIFEST, text), (DEBUG, full_debug_json)])


@dataclasses.dataclass(frozen=True, eq=False)
class Sidecar:
    """A verified ``.debug`` file: the debug info of one handles-only archive."""

    source: str
    #: SHA-256 of the archive file it belongs to, and of its own debug table.
    archive_sha256: str
    debug_sha256: str
    debug: dict[int, DebugInfo]


#: Bytes a debug file holds besides its debug table: its manifest (two hashes) and the zip's headers.
_SIDECAR_OVERHEAD = 64 * 2**10


def sidecar_cap(limits: Limits) -> int:
    """The most bytes a debug file can have: its debug table is at most ``max_debug_bytes`` (deflated, less)."""
    return min(limits.max_archive_bytes, limits.max_debug_bytes + _SIDECAR_OVERHEAD)


def check_sidecar_size(path: str, limits: Limits) -> None:
    """Refuse the file at ``path`` if it is larger than any ``.debug`` file can be, before reading any of it.

    A folder is an `ArchiveError` too (as `read_input` says), not a raw `IsADirectoryError`.
    """
    cap = sidecar_cap(limits)
    size = os.stat(path).st_size
    if os.path.isdir(path):
        raise ArchiveError(f"{path!r} is a folder, not a .debug file; pass the file itself")
    if size > cap:
        raise ArchiveSizeError(
            f"debug file {path!r} is {size} bytes, more than a debug file of at most {limits.max_debug_bytes} "
            f"bytes of debug info can be ({cap}); pass limits=Limits(max_debug_bytes=...) if the file is trusted"
        )


def read_sidecar(file: object, limits: Limits) -> Sidecar:
    """Read and verify a ``.debug`` file; its size is checked before any of it is read."""
    cap = sidecar_cap(limits)
    name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
    if name is not None:
        check_sidecar_size(name, limits)
    try:
        data, source = read_input(file, dataclasses.replace(limits, max_archive_bytes=cap))
    except ArchiveSizeError:
        raise ArchiveSizeError(
            f"debug file {name or '<stream>'!r} is more than {cap} bytes, more than a debug file of at most "
            f"{limits.max_debug_bytes} bytes of debug info can be; pass limits=Limits(max_debug_bytes=...) if the "
            "file is trusted"
        ) from None
    return SidecarReader(data, source, limits).read()


class SidecarReader(ZipReader):
    def where(self, entry: str) -> str:
        return f"debug file {self.source!r}, entry {entry!r}"

    def read(self) -> Sidecar:
        entries = self._parse_zip()
        manifest = self._stored_json(entries[0])
        where = self.where(MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("format") != SIDECAR_FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise ArchiveFormatError(
                f"{where}: format is {_short(found)}, not {SIDECAR_FORMAT!r}: this is not the .debug file "
                'that pytest_backendconf.save(..., debug_info="separate") writes beside an archive'
            )
        version = manifest.get("schema_version")
        if not isinstance(version, list) or len(version) != 2 or not all(_is_int(v) for v in version):
            raise ArchiveManifestError(
                f"{where}: schema_version must be [major, minor], got {_short(version)}; {_REWRITE}"
            )
        if version[0] != SIDECAR_SCHEMA[0]:
            from ..errors import ArchiveVersionError

            raise ArchiveVersionError(
                f"{where}: debug-file schema {version[0]}.{version[1]}; this pytest-backendconf reads "
                f"{SIDECAR_SCHEMA[0]}.x: symbolicate with the release that wrote it"
            )
        if self.layout_problem:
            raise ArchiveFormatError(self.layout_problem)
        by_name = self._check_names(entries)
        archive_sha = _field(manifest, "archive_sha256", str, where)
        debug_sha = _field(manifest, "debug_sha256", str, where)
        for value, key in ((archive_sha, "archive_sha256"), (debug_sha, "debug_sha256")):
            if not _SHA256.match(value):
                raise ArchiveManifestError(f"{where}: {key} must be 64 hex digits, got {_short(value)}; {_REWRITE}")
        listed = _field(manifest, "entries", dict, where)
        if set(by_name) != {MANIFEST, DEBUG} or set(listed) != {DEBUG}:
            raise ArchiveEntryError(
                f"debug file {self.source!r}: holds {sorted(by_name)} and lists {sorted(listed)}; a debug file "
                f"holds exactly {MANIFEST} and {DEBUG}; {_REWRITE}"
            )
        entry, record = by_name[DEBUG], listed[DEBUG]
        if entry.method == _STORED:
            raise ArchiveFormatError(f"{self.where(DEBUG)}: is stored, but this format deflates it; {_REWRITE}")
        if entry.size > self.limits.max_debug_bytes:
            raise ArchiveSizeError(
                f"{self.where(DEBUG)}: {entry.size} bytes of JSON, more than the limit of "
                f"{self.limits.max_debug_bytes}; pass limits=Limits(max_debug_bytes=...) if the file is trusted"
            )
        if not isinstance(record, dict) or hashlib.sha256(entry.raw).hexdigest() != record.get("sha256"):
            raise ArchiveEntryError(f"{self.where(DEBUG)}: its SHA-256 is not the one {MANIFEST} records; {_REWRITE}")
        data = self._bytes(entry)
        if hashlib.sha256(data).hexdigest() != debug_sha:
            raise ArchiveEntryError(f"{self.where(DEBUG)}: its content does not hash to debug_sha256; {_REWRITE}")
        document = self._parse_json(DEBUG, data)
        methods = _methods_named(document)
        debug = decode_debug(document, self.where(DEBUG), methods)
        return Sidecar(self.source, archive_sha, debug_sha, debug)


def _methods_named(document: object) -> set[str]:
    """Every name a debug table's rows may use as a method (checked against the archive on pairing)."""
    names = document.get("names") if isinstance(document, dict) else None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def check_pair(archive: Archive, sidecar: Sidecar) -> None:
    """Refuse a sidecar that was not written with ``archive``, naming both files' hashes."""
    assert archive.separate_debug is not None, "only a handles-only archive has a .debug file"
    expected = archive.separate_debug["sha256"]
    if sidecar.archive_sha256 == archive.sha256 and sidecar.debug_sha256 == expected:
        methods = {info.method for info in sidecar.debug.values()}
        handles = tuple(sorted(sidecar.debug))
        if methods <= set(archive.methods) and handles == archive.handles:
            return
    raise DebugSidecarError(
        f"debug file {sidecar.source!r} does not belong to archive {archive.source!r}: it was written for "
        f"an archive of sha256 {sidecar.archive_sha256} (debug info sha256 {sidecar.debug_sha256}), but "
        f"this archive's sha256 is {archive.sha256} and it expects debug info sha256 {expected}. Use the "
        '.debug file saved together with this archive (pytest_backendconf.save(..., debug_info="separate") '
        "writes both), or save the model again to get a matching pair."
    )


def read_format(data: bytes, source: str, limits: Limits) -> str | None:
    """The ``format`` a file's manifest names (``None`` if it has none), to tell a sidecar from an archive."""
    reader = ZipReader(data, source, limits)
    first = reader._parse_zip()[0]
    if first.method != _STORED:
        return None  # neither format deflates its manifest: the reader of archives says so
    manifest = reader._json(first)
    return manifest.get("format") if isinstance(manifest, dict) else None


def symbolicate_hint(source: str) -> str:
    """``backendconf symbolicate model.bcpt.debug`` for an archive loaded from ``source``."""
    if source.startswith("<"):
        return "backendconf symbolicate ARCHIVE.debug"
    return shell_command(["backendconf", "symbolicate", default_sidecar_path(source)])
