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

from pytest_backendconf.blobs import pack_blob, unpack_blob

MAGIC = b"\x89BCIREE\n"
#: Bumped on any incompatible change; a reader refuses blobs newer than itself.
FORMAT_VERSION = 1
#: dtype names the header may use (torch's, without the ``torch.`` prefix).
DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool"})


@dataclasses.dataclass(frozen=True)
class Fault:
    """An injected fault (docs/backend-contract.md#fault-injection): raise at FX node ``node`` with ``handle``."""

    node: str
    op: str
    handle: int


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
    raw, vmfb = unpack_blob(blob, MAGIC, FORMAT_VERSION, kind="iree backend blob", upgrade="backendconf-iree")
    try:
        header = _header(raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"iree backend blob has a malformed header: {exc}") from None
    return header, vmfb


def _header(raw: Any) -> Header:
    if not isinstance(raw, dict):
        raise TypeError("the header must be a JSON object")
    inputs = []
    for dtype in raw["inputs"]:
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"input dtype {dtype!r} is not one of {sorted(DTYPES)}")
        inputs.append(dtype)
    outputs = []
    for kind, value in raw["outputs"]:
        if kind == "tensor" and value not in DTYPES:
            raise ValueError(f"output dtype {value!r} is not one of {sorted(DTYPES)}")
        if kind not in ("tensor", "constant"):
            raise ValueError(f"output kind {kind!r} is not 'tensor' or 'constant'")
        outputs.append((kind, value))
    function = raw["function"]
    if not isinstance(function, str) or not function.isidentifier():
        raise ValueError(f"function {function!r} is not an identifier")
    fault = raw.get("fault")
    return Header(
        function=function,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        fault=Fault(str(fault["node"]), str(fault["op"]), int(fault["handle"])) if fault else None,
    )
