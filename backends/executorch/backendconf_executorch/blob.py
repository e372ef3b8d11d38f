"""The blob format: an ExecuTorch program (``.pte``) and the tables the runtime side needs.

A blob is what ``preprocess`` returns and an archive stores. It is
deterministic (the header is JSON with sorted keys; ExecuTorch's ``.pte``
bytes are the same in every process for the same program) and safe to read
from an untrusted file: no pickle, the lengths and the CRC-32 are checked,
and a bad blob raises ``ValueError`` naming the problem. Reading one needs
neither ``executorch.exir`` nor the runtime.

Layout (integers little-endian)::

    magic b"\\x89BCET\\r\\n\\x1a" | u32 format version | u32 CRC-32 of the rest
    | u64 header length | u64 program length | header (UTF-8 JSON) | program (.pte)

The header says which flat user inputs the ExecuTorch method takes, what
each user output is (a tensor of a dtype, or a constant), for every
instruction of the method the debug handles of the FX nodes it runs and
what it is (a kernel or a delegate), and the injected fault, if any.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from typing import Any

MAGIC = b"\x89BCET\r\n\x1a"
#: Bumped on any incompatible change; a reader refuses blobs newer than itself.
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIIQQ")
#: dtype names the header may use (torch's, without the ``torch.`` prefix).
DTYPES = frozenset(
    {"float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool"}
)


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction of the ExecuTorch method: what runs and which FX nodes it covers."""

    what: str  # "kernel aten::add.out" or "delegate XnnpackBackend"
    handles: tuple[int, ...]
    nodes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Fault:
    """An injected fault: raise at FX node ``node`` (its op ``op``) with debug handle ``handle``."""

    node: str
    op: str
    handle: int


@dataclasses.dataclass(frozen=True)
class Header:
    """What the runtime side knows about one method besides the ``.pte``."""

    method: str
    #: Per flat user input: True if the ExecuTorch method takes it (constants are baked in).
    fed: tuple[bool, ...]
    #: Per user output: ("tensor", dtype name) or ("constant", JSON value).
    outputs: tuple[tuple[str, Any], ...]
    instructions: tuple[Instruction, ...]
    partitioners: tuple[str, ...]
    fault: Fault | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "fed": list(self.fed),
            "outputs": [list(o) for o in self.outputs],
            "instructions": [
                {"what": i.what, "handles": list(i.handles), "nodes": list(i.nodes)} for i in self.instructions
            ],
            "partitioners": list(self.partitioners),
            "fault": dataclasses.asdict(self.fault) if self.fault else None,
        }


def encode(header: Header, program: bytes) -> bytes:
    """The blob of one method."""
    head = json.dumps(header.to_json(), sort_keys=True, separators=(",", ":")).encode("utf-8")
    rest = head + program
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, zlib.crc32(rest), len(head), len(program)) + rest


def decode(blob: Any) -> tuple[Header, bytes]:
    """``(header, .pte bytes)`` of a blob; ``ValueError`` naming what is wrong."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError(f"an executorch backend blob must be bytes, not {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _PREFIX.size or blob[:8] != MAGIC:
        raise ValueError("not an executorch backend blob (bad magic); was it written by another backend?")
    _, version, crc, head_len, program_len = _PREFIX.unpack_from(blob)
    if version > FORMAT_VERSION:
        raise ValueError(
            f"executorch backend blob format {version} is newer than this reader ({FORMAT_VERSION}); "
            "upgrade backendconf-executorch"
        )
    rest = blob[_PREFIX.size:]
    if len(rest) != head_len + program_len:
        raise ValueError(
            f"executorch backend blob is truncated or padded: {len(rest)} bytes after the prefix, "
            f"expected {head_len + program_len}"
        )
    if zlib.crc32(rest) != crc:
        raise ValueError("executorch backend blob is corrupt: CRC-32 mismatch")
    try:
        raw = json.loads(rest[:head_len].decode("utf-8"))
        header = _header(raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"executorch backend blob has a malformed header: {exc}") from exc
    return header, rest[head_len:]


def _header(raw: dict[str, Any]) -> Header:
    outputs = []
    for kind, value in raw["outputs"]:
        if kind == "tensor" and value not in DTYPES:
            raise ValueError(f"output dtype {value!r} is not one of {sorted(DTYPES)}")
        if kind not in ("tensor", "constant"):
            raise ValueError(f"output kind {kind!r} is not 'tensor' or 'constant'")
        outputs.append((kind, value))
    fault = raw.get("fault")
    return Header(
        method=str(raw["method"]),
        fed=tuple(bool(f) for f in raw["fed"]),
        outputs=tuple(outputs),
        instructions=tuple(
            Instruction(str(i["what"]), tuple(int(h) for h in i["handles"]), tuple(str(n) for n in i["nodes"]))
            for i in raw["instructions"]
        ),
        partitioners=tuple(str(p) for p in raw["partitioners"]),
        fault=Fault(str(fault["node"]), str(fault["op"]), int(fault["handle"])) if fault else None,
    )
