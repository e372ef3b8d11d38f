"""The blob format: an ExecuTorch program (``.pte``) and the tables the runtime side needs.

A blob is what ``preprocess`` returns and an archive stores. It is
deterministic (the header is JSON with sorted keys; ExecuTorch's ``.pte``
bytes are the same in every process for the same program) and safe to read
from an untrusted file: no pickle, the lengths and the CRC-32 are checked,
and a bad blob raises ``ValueError`` naming the problem. Reading one needs
neither ``executorch.exir`` nor the runtime.

The frame is `pytest_backendconf.blobs` (magic ``b"\\x89BCET\\r\\n\\x1a"``,
format version, CRC-32, JSON header), the payload the ``.pte``.

The header says which flat user inputs the ExecuTorch method takes, what
each user output is (a tensor of a dtype, or a constant), for every
instruction of the method the debug handles of the FX nodes it runs and
what it is (a kernel or a delegate), and the injected fault, if any.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_backendconf.blobs import DTYPES as DTYPES  # the header's dtypes (lowering checks against them)
from pytest_backendconf.blobs import Fault, outputs_from_json, pack_blob, unpack_header

MAGIC = b"\x89BCET\r\n\x1a"
#: Bumped on any incompatible change; a reader refuses blobs newer than itself.
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction of the ExecuTorch method: what runs and which FX nodes it covers."""

    what: str  # "kernel aten::add.out" or "delegate XnnpackBackend"
    handles: tuple[int, ...]
    nodes: tuple[str, ...]


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
    return pack_blob(MAGIC, FORMAT_VERSION, header.to_json(), program)


def decode(blob: Any) -> tuple[Header, bytes]:
    """``(header, .pte bytes)`` of a blob; ``ValueError`` naming what is wrong."""
    return unpack_header(
        blob, MAGIC, FORMAT_VERSION, kind="executorch backend blob", upgrade="backendconf-executorch", parse=_header
    )


def _header(raw: dict[str, Any], program: bytes) -> Header:
    outputs = outputs_from_json(raw["outputs"])
    fault = raw.get("fault")
    return Header(
        method=str(raw["method"]),
        fed=tuple(bool(f) for f in raw["fed"]),
        outputs=outputs,
        instructions=tuple(
            Instruction(str(i["what"]), tuple(int(h) for h in i["handles"]), tuple(str(n) for n in i["nodes"]))
            for i in raw["instructions"]
        ),
        partitioners=tuple(str(p) for p in raw["partitioners"]),
        fault=Fault.from_json(fault) if fault else None,
    )
