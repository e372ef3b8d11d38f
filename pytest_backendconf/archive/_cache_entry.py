"""The file of one preprocess-cache entry: a blob and the key it was stored under, read back strictly.

The entry is a zip in the archive's one fixed layout (`pack`): ``manifest.json`` (format, schema
version, the key, the blob's SHA-256 and size) then ``blob.bin``. `read_cache_entry` accepts
exactly that and returns the blob's bytes, nothing more: a cache folder is a file any process of
the user's may write, so what comes back is checked like any archive, and a damaged, truncated or
foreign file is an `ArchiveError` (the cache treats it as a miss).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from ._checks import REWRITE as _REWRITE
from ._checks import field as _field
from ._checks import short as _short
from ._zip import _STORED, MANIFEST, ZipReader, pack
from ..errors import ArchiveEntryError, ArchiveFormatError, ArchiveManifestError, ArchiveSizeError, ArchiveVersionError

if TYPE_CHECKING:
    from ._limits import Limits

CACHE_ENTRY_FORMAT = "backendconf-preprocess-cache"
CACHE_ENTRY_SCHEMA = (1, 0)
BLOB = "blob.bin"


def encode_cache_entry(key: str, blob: bytes) -> bytes:
    """The bytes of the entry file holding ``blob`` under ``key``."""
    manifest = {
        "format": CACHE_ENTRY_FORMAT,
        "schema_version": list(CACHE_ENTRY_SCHEMA),
        "key": key,
        "blob": {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)},
    }
    return pack([(MANIFEST, json.dumps(manifest, sort_keys=True).encode()), (BLOB, blob)])


def read_cache_entry(data: bytes, source: str, key: str, limits: Limits) -> bytes:
    """The blob an entry file holds, if it is intact and was stored under ``key``; else an `ArchiveError`."""
    return _EntryReader(data, source, limits).read(key)


class _EntryReader(ZipReader):
    def where(self, entry: str) -> str:
        return f"cache entry {self.source!r}, entry {entry!r}"

    def read(self, key: str) -> bytes:
        entries = self._parse_zip()
        manifest = self._stored_json(entries[0])
        where = self.where(MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("format") != CACHE_ENTRY_FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise ArchiveFormatError(f"{where}: format is {_short(found)}, not {CACHE_ENTRY_FORMAT!r}")
        if manifest.get("schema_version") != list(CACHE_ENTRY_SCHEMA):
            raise ArchiveVersionError(
                f"{where}: schema {_short(manifest.get('schema_version'))}, this release reads "
                f"{list(CACHE_ENTRY_SCHEMA)}"
            )
        if self.layout_problem:
            raise ArchiveFormatError(self.layout_problem)
        by_name = self._check_names(entries)
        if set(by_name) != {MANIFEST, BLOB}:
            raise ArchiveEntryError(f"cache entry {self.source!r}: holds {sorted(by_name)}, not {MANIFEST} and {BLOB}")
        if _field(manifest, "key", str, where) != key:
            raise ArchiveManifestError(f"{where}: was stored under another key (the file was renamed or copied)")
        record = _field(manifest, "blob", dict, where)
        entry = by_name[BLOB]
        if entry.method != _STORED or entry.size != record.get("size"):
            raise ArchiveEntryError(f"{self.where(BLOB)}: is not the {_short(record.get('size'))} stored bytes listed")
        if entry.size > self.limits.max_entry_bytes:
            raise ArchiveSizeError(f"{self.where(BLOB)}: {entry.size} bytes, more than the limit")
        blob = self._bytes(entry)
        if hashlib.sha256(blob).hexdigest() != record.get("sha256"):
            raise ArchiveEntryError(f"{self.where(BLOB)}: its SHA-256 is not the one {MANIFEST} records; {_REWRITE}")
        return blob
