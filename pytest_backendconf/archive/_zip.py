"""The archive's zip container: one fixed byte layout, written by `pack` and read back strictly.

Every entry has fixed timestamps (1980-01-01 00:00), fixed Unix attributes
(0644), no extra fields and no comments; ``manifest.json`` comes first.
The reader accepts exactly the layout `pack` writes: data bytes are
covered by CRC-32 (and the manifest's SHA-256), and every header byte is
compared with the header `pack` would write, so a zip re-packed by another
tool is refused. Nothing here knows what the entries mean.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
import zlib
from typing import IO, TYPE_CHECKING, Any, Sequence

from ._checks import REWRITE as _REWRITE
from ._checks import parse_json
from ._files import SpecialFileError, open_regular_file
from ..errors import ArchiveChecksumError, ArchiveEntryError, ArchiveError, ArchiveFormatError, ArchiveSizeError

if TYPE_CHECKING:
    from typing import Protocol

    from ._limits import Limits

    class _Readable(Protocol):
        def read(self, size: int, /) -> object: ...


#: What the readers take an archive (or a ``.debug`` file) from: a path, its bytes, or a binary file object.
ArchiveInput = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]

MANIFEST = "manifest.json"
DEBUG = "debug.json"
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*\Z")

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
# Bytes a deflated entry may inflate to beyond Limits.max_expansion_ratio times its size.
_RATIO_ALLOWANCE = 4096


@dataclasses.dataclass
class ZipEntry:
    name: str
    method: int
    crc: int
    size: int
    raw: memoryview
    offset: int


class ZipReader:
    """Parses and verifies the zip structure of an archive held in memory.

    ``layout_problem`` is set (not raised) when a header differs from the
    one `pack` writes, so that the caller can first say what the manifest
    says about the archive's version.
    """

    def __init__(self, data: bytes, source: str, limits: Limits) -> None:
        self.data = memoryview(data)
        self.source = source
        self.limits = limits
        self.layout_problem: str | None = None

    def where(self, entry: str) -> str:
        return f"archive {self.source!r}, entry {entry!r}"

    def _parse_zip(self) -> list[ZipEntry]:
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
        entries: list[ZipEntry] = []
        pos, expected_offset, total = cd_offset, 0, 0
        for i in range(count):
            if pos + _CENTRAL.size > end_at:
                raise ArchiveFormatError(
                    f"archive {self.source!r}: central directory record #{i} runs past the directory's end; {_REWRITE}"
                )
            (
                csig,
                made_by,
                needed,
                flags,
                method,
                mtime,
                mdate,
                crc,
                csize,
                usize,
                name_len,
                extra_len,
                comment_len,
                disk_start,
                internal,
                external,
                offset,
            ) = _CENTRAL.unpack_from(data, pos)
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
            ratio = self.limits.max_expansion_ratio
            # The allowance lets a tiny entry (a few hundred bytes of JSON) inflate freely.
            if method == _DEFLATED and usize > csize * ratio + _RATIO_ALLOWANCE:
                raise ArchiveSizeError(
                    f"{self.where(name)}: declares {usize} bytes from {csize} deflated bytes, more than "
                    f"the limit of {ratio} times (a zip bomb?); pass limits=Limits(max_expansion_ratio=...) "
                    "if the archive is trusted"
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
                expected_local = local_header(raw_name, method, crc, csize, usize)
                actual_local = bytes(data[offset:data_start])
                expected_central = central_header(raw_name, method, crc, csize, usize, offset)
                actual_central = bytes(data[pos:record_end])
                if actual_local != expected_local:
                    self.layout_problem = self._layout_text(name, "local header", offset, actual_local, expected_local)
                elif actual_central != expected_central:
                    self.layout_problem = self._layout_text(
                        name, "central directory record", pos, actual_central, expected_central
                    )
            entries.append(ZipEntry(name, method, crc, usize, data[data_start:data_end], offset))
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

    def _check_names(self, entries: list[ZipEntry]) -> dict[str, ZipEntry]:
        by_name: dict[str, ZipEntry] = {}
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

    def _bytes(self, entry: ZipEntry) -> bytes:
        if entry.method == _STORED:
            out = bytes(entry.raw)
        else:
            inflater = zlib.decompressobj(-15)
            try:
                out = inflater.decompress(entry.raw, entry.size + 1)
            except zlib.error as exc:
                raise ArchiveChecksumError(
                    f"{self.where(entry.name)}: its deflated data is corrupt ({exc}); {_REWRITE}"
                ) from None
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

    def _json(self, entry: ZipEntry) -> Any:
        if entry.size > self.limits.max_json_bytes:
            raise ArchiveSizeError(
                f"{self.where(entry.name)}: {entry.size} bytes of JSON, more than the limit of "
                f"{self.limits.max_json_bytes}; pass limits=Limits(max_json_bytes=...) if the archive is trusted"
            )
        return self._parse_json(entry.name, self._bytes(entry))

    def _stored_json(self, entry: ZipEntry) -> Any:
        """A manifest's JSON. Manifests are stored, never deflated: a few hundred bytes of text could
        only be deflated to carry an inflation bomb past the first check."""
        if entry.method != _STORED:
            raise ArchiveFormatError(f"{self.where(entry.name)}: is deflated, but this format stores it; {_REWRITE}")
        return self._json(entry)

    def _parse_json(self, name: str, data: bytes) -> Any:
        return parse_json(self.where(name), data)


def local_header(name: bytes, method: int, crc: int, csize: int, usize: int) -> bytes:
    return (
        _LOCAL.pack(_LOCAL_SIG, _VERSION_NEEDED, 0, method, _DOS_TIME, _DOS_DATE, crc, csize, usize, len(name), 0)
        + name
    )


def central_header(name: bytes, method: int, crc: int, csize: int, usize: int, offset: int) -> bytes:
    return (
        _CENTRAL.pack(
            _CENTRAL_SIG,
            _MADE_BY,
            _VERSION_NEEDED,
            0,
            method,
            _DOS_TIME,
            _DOS_DATE,
            crc,
            csize,
            usize,
            len(name),
            0,
            0,
            0,
            0,
            _EXTERNAL_ATTR,
            offset,
        )
        + name
    )


def method_for(name: str) -> int:
    return _DEFLATED if name == DEBUG else _STORED


def stored_bytes(name: str, data: bytes) -> bytes:
    """An entry's bytes as they stand in the zip (deflated for ``debug.json``)."""
    return deflate(data) if method_for(name) == _DEFLATED else data


def pack(entries: Sequence[tuple[str, bytes]]) -> bytes:
    """The zip of ``entries`` (in the given order), in this format's one fixed layout."""
    chunks: list[bytes] = []
    central: list[bytes] = []
    offset = 0
    for name, data in entries:
        raw_name = name.encode("ascii")
        method = method_for(name)
        stored = stored_bytes(name, data)
        crc = zlib.crc32(data)
        header = local_header(raw_name, method, crc, len(stored), len(data))
        central.append(central_header(raw_name, method, crc, len(stored), len(data), offset))
        chunks += (header, stored)
        offset += len(header) + len(stored)
    directory = b"".join(central)
    if offset + len(directory) + _END.size > 2**32 - 1 or len(entries) > 0xFFFF:
        raise ArchiveSizeError(
            f"the archive would be {offset + len(directory)} bytes in {len(entries)} entries; "
            "this format holds at most 4 GiB in 65535 entries"
        )
    chunks += (directory, _END.pack(_END_SIG, 0, 0, len(entries), len(entries), len(directory), offset, 0))
    return b"".join(chunks)


def deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def read_input(file: object, limits: Limits) -> tuple[bytes, str]:
    """The bytes of an archive given as bytes, a path or a binary file object, and its name for messages.

    A file is read by its size and a stream in chunks, stopping at
    ``limits.max_archive_bytes``: nothing is allocated for a limit the
    file does not reach.
    """
    cap = limits.max_archive_bytes
    if isinstance(file, (bytes, bytearray, memoryview)):
        data, source = bytes(file), "<bytes>"
    elif isinstance(file, (str, os.PathLike)):
        source = os.fspath(file)
        if os.path.isdir(source):
            raise ArchiveError(f"{source!r} is a folder, not an archive; pass the archive file itself (a .bcpt file)")
        try:  # the path the caller named (a link is followed); a FIFO or a device is never read
            fd = open_regular_file(source, follow_symlinks=True)
        except SpecialFileError as exc:
            raise ArchiveError(f"{exc} (pass the archive file itself, or its bytes)") from None
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > cap:
                raise ArchiveSizeError(
                    f"archive {source!r} is {size} bytes, more than the limit of {cap}; pass "
                    "limits=Limits(max_archive_bytes=...) if the archive is trusted"
                )
            data = _read_stream(f, cap, source, size)
    elif hasattr(file, "read"):
        source = str(getattr(file, "name", None) or f"<{type(file).__name__}>")
        data = _read_stream(file, cap, source, None)
    else:
        raise ArchiveError(f"load() reads a path, bytes, or a binary file object, got {type(file).__name__}")
    if len(data) > cap:
        raise ArchiveSizeError(
            f"archive {source!r} is more than the limit of {cap} bytes; pass "
            "limits=Limits(max_archive_bytes=...) if the archive is trusted"
        )
    return data, source


_CHUNK = 1 << 20


def _read_stream(f: _Readable, cap: int, source: str, size: int | None) -> bytes:
    chunks = []
    total = 0
    while total <= cap:
        want = min(_CHUNK, cap + 1 - total) if size is None else min(_CHUNK, size + 1 - total)
        if want <= 0:
            break
        chunk = f.read(want)
        if not isinstance(chunk, (bytes, bytearray)):
            raise ArchiveError(f"archive {source!r}: the file object must be opened in binary mode ('rb')")
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
