"""The blob format: an IREE VM flatbuffer (``.vmfb``) and the tables the runtime side needs, checked on read.

A blob is what ``preprocess`` returns and an archive stores. It is
deterministic (the header is JSON with sorted keys; ``iree-compile`` writes
the same ``.vmfb`` for the same input, with no source map and no debug
symbols) and safe to read from an untrusted file: no pickle, the lengths and
the CRC-32 are checked, and a bad blob raises ``ValueError`` naming the
problem. Reading one needs neither IREE nor torch.

The frame is `pytest_backendconf.blobs` (magic ``b"\\x89BCIREE\\n"``, format
version, CRC-32, JSON header), the payload the ``.vmfb``.

The header says which function of the module to call, per flat user input
the dtype of the tensor it takes (``None``: a Python constant that
``torch.export`` baked into the program, not fed), per user output a
tensor's dtype or a constant's value, and the injected fault, if any.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_backendconf.blobs import DTYPES, Fault, outputs_from_json, pack_blob, unpack_header

MAGIC = b"\x89BCIREE\n"
#: Bumped on any incompatible change; a reader refuses blobs newer than itself.
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Header:
    """What the runtime side knows about one method besides the ``.vmfb``."""

    #: The function of the VM module that runs the method.
    function: str
    #: Per flat user input: the dtype name of the tensor fed, or None (a constant, baked in).
    inputs: tuple[str | None, ...]
    #: Per user output: ("tensor", dtype name) or ("constant", JSON value).
    outputs: tuple[tuple[str, Any], ...]
    fault: Fault | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "inputs": list(self.inputs),
            "outputs": [list(o) for o in self.outputs],
            "fault": dataclasses.asdict(self.fault) if self.fault else None,
        }


def encode(header: Header, vmfb: bytes) -> bytes:
    """The blob of one method; the same arguments give the same bytes."""
    return pack_blob(MAGIC, FORMAT_VERSION, header.to_json(), vmfb)


def decode(blob: Any) -> tuple[Header, bytes]:
    """``(header, .vmfb bytes)`` of a blob; ``ValueError`` naming what is wrong."""
    return unpack_header(
        blob, MAGIC, FORMAT_VERSION, kind="iree backend blob", upgrade="backendconf-iree", parse=_header
    )


def _header(raw: Any, vmfb: bytes) -> Header:
    if not isinstance(raw, dict):
        raise TypeError("the header must be a JSON object")
    inputs = []
    for dtype in raw["inputs"]:
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"input dtype {dtype!r} is not one of {sorted(DTYPES)}")
        inputs.append(dtype)
    outputs = outputs_from_json(raw["outputs"])
    function = raw["function"]
    if not isinstance(function, str) or not function.isidentifier():
        raise ValueError(f"function {function!r} is not an identifier")
    fault = raw.get("fault")
    return Header(function, tuple(inputs), outputs, Fault.from_json(fault) if fault else None)
