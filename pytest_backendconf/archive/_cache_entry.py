"""The file of one preprocess-cache entry: a blob and the key it was stored under, read back strictly.

The entry is a zip in the archive's one fixed layout (`pack`): ``manifest.json`` (format, schema
version, the key, the blob's SHA-256 and size, and the entry's MAC) then ``blob.bin``.
`read_cache_entry` accepts exactly that and returns the blob's bytes, nothing more: a cache folder
may be a restored CI cache or a share others write, so what comes back is checked like any archive,
and a damaged, truncated or foreign file is an `ArchiveError` (the cache treats it as a miss).

The MAC (HMAC-SHA256 under the cache's secret, `cache_secret`) covers the key and the blob: an
entry is taken only if it was made by someone holding the secret, for that key. An internally
consistent entry made without it (a good backend's blob under a broken backend's key) is a
`CacheEntryMacError`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import TYPE_CHECKING

from ._checks import REWRITE as _REWRITE
from ._checks import field as _field
from ._checks import short as _short
from ._zip import _STORED, MANIFEST, ZipReader, pack
from ..errors import (
    ArchiveEntryError,
    ArchiveFormatError,
    ArchiveManifestError,
    ArchiveSizeError,
    ArchiveVersionError,
    CacheEntryMacError,
)

if TYPE_CHECKING:
    from ._limits import Limits

CACHE_ENTRY_FORMAT = "backendconf-preprocess-cache"
#: 2.0: the entry's MAC (schema 1 entries, unbound, are misses).
CACHE_ENTRY_SCHEMA = (2, 0)
BLOB = "blob.bin"


def entry_mac(secret: bytes, key: str, blob: bytes) -> str:
    """The entry's MAC: HMAC-SHA256 under ``secret`` of the format's name, the key and the blob, each
    length-prefixed (no two different (key, blob) pairs give the same message)."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (CACHE_ENTRY_FORMAT.encode(), key.encode("utf-8"), blob):
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.hexdigest()


def encode_cache_entry(key: str, blob: bytes, secret: bytes) -> bytes:
    """The bytes of the entry file holding ``blob`` under ``key``, bound to ``secret`` by its MAC."""
    manifest = {
        "format": CACHE_ENTRY_FORMAT,
        "schema_version": list(CACHE_ENTRY_SCHEMA),
        "key": key,
        "blob": {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)},
        "mac": entry_mac(secret, key, blob),
    }
    return pack([(MANIFEST, json.dumps(manifest, sort_keys=True).encode()), (BLOB, blob)])


def read_cache_entry(data: bytes, source: str, key: str, limits: Limits, secret: bytes) -> bytes:
    """The blob an entry file holds, if it is intact, was stored under ``key`` and its MAC verifies under
    ``secret``; else an `ArchiveError` (`CacheEntryMacError` for the MAC)."""
    return _EntryReader(data, source, limits).read(key, secret)


class _EntryReader(ZipReader):
    def where(self, entry: str) -> str:
        return f"cache entry {self.source!r}, entry {entry!r}"

    def read(self, key: str, secret: bytes) -> bytes:
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
        mac = manifest.get("mac")
        expected = entry_mac(secret, key, blob).encode()
        # bytes, not str: compare_digest refuses a str that is not ASCII (a hostile manifest's)
        if not isinstance(mac, str) or not hmac.compare_digest(mac.encode("utf-8", "replace"), expected):
            raise CacheEntryMacError(
                f"{where}: its MAC does not verify under this cache's secret (an entry of another machine "
                "or user, or one written without the secret)"
            )
        return blob
