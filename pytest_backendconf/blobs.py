"""A checked frame for a backend's blob: a JSON header and an engine's payload, safe to read.

Also the two steps around it that such a backend's ``compile`` and
``execute`` share: `compile_each` and `checked_handle`.

A backend's ``preprocess`` returns bytes that an archive stores and that
``compile`` later reads, maybe from an untrusted file on a target. Most
backends need the same frame around their engine's own format (an ONNX
model, an ExecuTorch ``.pte``): a magic, a format version that a reader
refuses when it is newer than itself, a CRC-32, and a JSON header with the
tables the runtime side needs. `pack_blob` and `unpack_blob` are that frame,
so that each backend does not write (and test) the same length and checksum
code again. Layout (integers little-endian)::

    magic (8 bytes) | u32 format version | u32 CRC-32 of the rest
    | u64 header length | u64 payload length | header (UTF-8 JSON) | payload

The header is written with sorted keys and no whitespace, so the same
arguments give the same bytes in every process. Reading never executes
anything (no pickle); every problem is a ``ValueError`` naming the blob's
kind and what is wrong, which ``compile`` passes on. `unpack_header` is
`unpack_blob` with the backend's own check of the header, and `Fault`,
`outputs_from_json` and `DTYPES` the parts of a header that several
backends' headers share.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from typing import Any, Callable, Collection, Mapping, TypeVar

from .errors import OperatorRefusedError

_PREFIX = struct.Struct("<8sIIQQ")

_Handle = TypeVar("_Handle")
_Header = TypeVar("_Header")

#: dtype names a header may use (torch's, without the ``torch.`` prefix).
DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool"})


@dataclasses.dataclass(frozen=True)
class Fault:
    """An injected fault (docs/backend-contract.md#fault-injection): raise at FX node ``node`` (its op ``op``)
    with debug handle ``handle``. ``dataclasses.asdict`` of it is its JSON form."""

    node: str
    op: str
    handle: int

    @classmethod
    def from_json(cls, raw: Any) -> Fault:
        """The fault of its JSON form (a ``KeyError`` or ``TypeError`` where that is malformed)."""
        return cls(str(raw["node"]), str(raw["op"]), int(raw["handle"]))


def pack_blob(magic: bytes, version: int, header: Mapping[str, object], payload: bytes) -> bytes:
    """The framed blob of ``header`` (JSON-compatible, no NaN) and ``payload``.

    :param magic: exactly 8 bytes that say whose blob this is.
    :param version: the format version of the header and payload.
    """
    if len(magic) != 8:
        raise ValueError(f"a blob magic is 8 bytes, not {len(magic)} ({magic!r})")
    head = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    rest = head + bytes(payload)
    return _PREFIX.pack(magic, version, zlib.crc32(rest), len(head), len(payload)) + rest


def unpack_blob(blob: object, magic: bytes, version: int, *, kind: str, upgrade: str) -> tuple[Any, bytes]:
    """``(header, payload)`` of a blob written by `pack_blob`; ``ValueError`` naming what is wrong.

    The header is the JSON value the blob holds, unchecked: its shape is the caller's to check.

    :param version: the newest format version this reader knows; newer blobs are refused.
    :param kind: what the messages call the blob, e.g. ``"executorch backend blob"``.
    :param upgrade: what to upgrade when a blob is newer than this reader (a distribution name).
    """
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError(f"the {kind} must be bytes, not {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _PREFIX.size or blob[:8] != magic:
        raise ValueError(f"not a valid {kind} (bad magic or too short); was it written by another backend?")
    _, found, crc, head_len, payload_len = _PREFIX.unpack_from(blob)
    if found > version:
        raise ValueError(f"{kind} format {found} is newer than this reader ({version}); upgrade {upgrade}")
    rest = blob[_PREFIX.size :]
    if len(rest) != head_len + payload_len:
        raise ValueError(
            f"{kind} is truncated or padded: {len(rest)} bytes after the prefix, "
            f"expected {head_len} (header) + {payload_len} (payload)"
        )
    if zlib.crc32(rest) != crc:
        raise ValueError(f"{kind} is corrupt: CRC-32 checksum mismatch")
    try:
        header = json.loads(rest[:head_len].decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"{kind} has a malformed header: {exc}") from None
    return header, rest[head_len:]


def unpack_header(
    blob: object, magic: bytes, version: int, *, kind: str, upgrade: str, parse: Callable[[Any, bytes], _Header]
) -> tuple[_Header, bytes]:
    """`unpack_blob`, then ``(parse(header, payload), payload)``.

    ``parse`` checks the header's shape (the payload is there for checks
    against its length); a ``ValueError``, ``KeyError`` or ``TypeError`` it
    raises is a ``ValueError`` saying that the ``kind`` has a malformed header.
    """
    raw, payload = unpack_blob(blob, magic, version, kind=kind, upgrade=upgrade)
    try:
        return parse(raw, payload), payload
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{kind} has a malformed header: {exc}") from None


def outputs_from_json(raw: Any, dtypes: Collection[str] = DTYPES) -> tuple[tuple[str, Any], ...]:
    """A header's user outputs, each ``["tensor", dtype name]`` or ``["constant", JSON value]``, checked."""
    outputs = []
    for kind, value in raw:
        if kind == "tensor" and value not in dtypes:
            raise ValueError(f"output dtype {value!r} is not one of {sorted(dtypes)}")
        if kind not in ("tensor", "constant"):
            raise ValueError(f"output kind {kind!r} is not 'tensor' or 'constant'")
        outputs.append((kind, value))
    return tuple(outputs)


def compile_each(processed: Mapping[str, bytes], load: Callable[[bytes], _Handle]) -> dict[str, _Handle]:
    """``{method: load(blob)}``: a ``compile`` whose blobs each hold all their method needs.

    A ``ValueError`` from ``load`` (a damaged or foreign blob, from
    `unpack_blob`) is raised again with the method's name in front, so the
    error says which of the archive's blobs it was.
    """
    handles: dict[str, _Handle] = {}
    for method, blob in processed.items():
        try:
            handles[method] = load(blob)
        except OperatorRefusedError as exc:
            # The same error: its kind says what to do. An archive stores the blob as blobs/<method>.bin.
            exc.where = f"method {method!r} (archive entry 'blobs/{method}.bin'), {exc.where}"
            raise
        except ValueError as exc:
            raise ValueError(f"method {method!r}: {exc}") from exc
    return handles


def checked_handle(handle: object, handle_type: type[_Handle], compiled_by: str) -> _Handle:
    """``handle``, if it is a ``handle_type``; else a ``TypeError`` naming what ``execute`` expects.

    :param compiled_by: the method that makes such handles, e.g. ``"OnnxRuntimeBackend.compile"``.
    """
    if not isinstance(handle, handle_type):
        raise TypeError(f"execute() expects a handle returned by {compiled_by}, got {type(handle).__name__}")
    return handle
