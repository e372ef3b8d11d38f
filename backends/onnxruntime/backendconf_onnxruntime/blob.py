"""The blob format: an ONNX model and the tables the runtime needs, checked on read.

A blob is what ``preprocess`` returns and an archive stores. It is
deterministic (the header is JSON with sorted keys, the model is serialized
deterministically) and safe to read from an untrusted file: no pickle, the
length and CRC-32 of every part are checked, and a bad blob raises
``ValueError`` naming the problem. Neither ``onnx`` nor ``torch.onnx`` is
needed to read one.

The frame is `pytest_backendconf.blobs` (magic ``b"\\x89BCORT\\r\\n"``,
format version, CRC-32, JSON header), the payload the ONNX model.

The header (`Header`) says, per flat user input, whether it is fed to the
model and how; per user output, where it comes from and its dtype and
shape; for every ONNX node, the debug handle of the FX node it came from;
and the injected fault, if any.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_backendconf.blobs import DTYPES, pack_blob, unpack_header

MAGIC = b"\x89BCORT\r\n"
#: Bumped on any incompatible change; a reader refuses blobs newer than itself.
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TensorSlot:
    """A tensor input or output of the method: its ONNX name, dtype and shape.

    ``widened`` is true for float16/bfloat16 tensors that the model carries
    as float32 (see ``exporter``): inputs are fed widened, outputs narrowed.
    """

    name: str
    dtype: str
    shape: tuple[int | None, ...]  # None: a symbolic size (dynamic shapes)
    widened: bool = False


@dataclasses.dataclass(frozen=True)
class Fault:
    """An injected fault (docs/backend-contract.md#fault-injection): raise at node ``node`` with ``handle``.

    ``flag`` is the ONNX output that tells whether the node ran (it sits in
    a ``torch.cond`` branch); ``None`` when the node runs on every call.
    """

    node: str
    op: str
    handle: int
    flag: str | None


@dataclasses.dataclass(frozen=True)
class Header:
    """What the runtime needs besides the model itself."""

    #: Per flat user input: a `TensorSlot` fed to the model, or ``None`` for
    #: a Python constant (baked into the model at export, not fed).
    inputs: tuple[TensorSlot | None, ...]
    #: Per user output: ``("tensor", TensorSlot)`` or ``("constant", value)``.
    outputs: tuple[tuple[str, Any], ...]
    #: ONNX node name -> debug handle of the FX node it was exported from.
    nodes: dict[str, int]
    fault: Fault | None = None

    def model_outputs(self) -> list[str]:
        """The ONNX outputs to fetch, each once, in a fixed order."""
        names = [slot.name for kind, slot in self.outputs if kind == "tensor"]
        if self.fault is not None and self.fault.flag is not None:
            names.append(self.fault.flag)
        return list(dict.fromkeys(names))


def encode(header: Header, model: bytes) -> bytes:
    """The blob of one method; the same arguments give the same bytes."""
    return pack_blob(MAGIC, FORMAT_VERSION, _header_to_json(header), model)


def decode(blob: bytes) -> tuple[Header, bytes]:
    """Check and split a blob; ``ValueError`` naming the problem if it is not one."""
    return unpack_header(
        blob,
        MAGIC,
        FORMAT_VERSION,
        kind="onnxruntime backend blob",
        upgrade="backendconf-onnxruntime",
        parse=lambda data, model: _header_from_json(data),
    )


# --- JSON ------------------------------------------------------------------------


def _slot_to_json(slot: TensorSlot) -> dict:
    return {"name": slot.name, "dtype": slot.dtype, "shape": list(slot.shape), "widened": slot.widened}


def _slot_from_json(data: Any) -> TensorSlot:
    if not isinstance(data, dict):
        raise TypeError(f"a tensor slot must be an object, got {data!r}")
    name, dtype, shape, widened = data["name"], data["dtype"], data["shape"], data["widened"]
    if not isinstance(name, str) or dtype not in DTYPES or not isinstance(widened, bool):
        raise ValueError(f"bad tensor slot {data!r}")
    if not isinstance(shape, list) or not all(d is None or (type(d) is int and d >= 0) for d in shape):
        raise ValueError(f"bad shape in tensor slot {data!r}")
    return TensorSlot(name, dtype, tuple(shape), widened)


def _header_to_json(header: Header) -> dict:
    fault = header.fault
    return {
        "inputs": [None if slot is None else _slot_to_json(slot) for slot in header.inputs],
        "outputs": [
            {"kind": "tensor", "slot": _slot_to_json(value)}
            if kind == "tensor"
            else {"kind": "constant", "value": value}
            for kind, value in header.outputs
        ],
        "nodes": dict(sorted(header.nodes.items())),
        "fault": None if fault is None else dataclasses.asdict(fault),
    }


def _header_from_json(data: Any) -> Header:
    if not isinstance(data, dict):
        raise TypeError("the header must be a JSON object")
    inputs = tuple(None if item is None else _slot_from_json(item) for item in data["inputs"])
    outputs = []
    for item in data["outputs"]:
        if item["kind"] == "tensor":
            outputs.append(("tensor", _slot_from_json(item["slot"])))
        elif item["kind"] == "constant":
            outputs.append(("constant", item["value"]))
        else:
            raise ValueError(f"unknown output kind {item['kind']!r}")
    nodes = data["nodes"]
    if not isinstance(nodes, dict) or not all(isinstance(k, str) and type(v) is int for k, v in nodes.items()):
        raise ValueError("the node table must map node names to integer handles")
    fault = data["fault"]
    if fault is not None:
        fault = Fault(
            node=str(fault["node"]),
            op=str(fault["op"]),
            handle=int(fault["handle"]),
            flag=None if fault["flag"] is None else str(fault["flag"]),
        )
    return Header(inputs=inputs, outputs=tuple(outputs), nodes=dict(nodes), fault=fault)
