"""The blob format: an OpenVINO IR (``.xml`` and ``.bin``) and the tables the runtime needs, checked on read.

A blob is what ``preprocess`` returns and an archive stores. It is
deterministic (the header is JSON with sorted keys; the IR's layer names are
renamed in document order, see ``conversion``) and safe to read from an
untrusted file: no pickle, the lengths and the CRC-32 are checked, and a bad
blob raises ``ValueError`` naming the problem. Reading one needs neither
openvino nor torch.

The frame is `pytest_backendconf.blobs` (magic ``b"\\x89BCOVI\\r\\n"``,
format version, CRC-32, JSON header); the payload is the IR's XML followed
by its weights (``xml_length`` bytes of XML, the rest the ``.bin``).

The header (`Header`) says, per flat user input, whether it is fed to the
model and how; per user output, a tensor's dtype or a constant's value;
the inference precision ``compile`` asks the CPU plugin for; for every IR
layer that came from an FX node, that node's debug handle; and the injected
fault, if any.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_backendconf.blobs import DTYPES, Fault, pack_blob, unpack_header

MAGIC = b"\x89BCOVI\r\n"
#: Bumped on any incompatible change; a reader refuses blobs newer than itself.
FORMAT_VERSION = 1
#: Inference precisions of OpenVINO's CPU plugin the header may ask for.
PRECISIONS = frozenset({"f32", "bf16", "f16"})


@dataclasses.dataclass(frozen=True)
class TensorSlot:
    """A tensor input or output of the method: its name and dtype.

    ``widened`` is true for float16/bfloat16 tensors that the IR carries as
    float32 (see ``conversion.WIDENED``): inputs are fed widened, outputs
    rounded to ``dtype``.
    """

    name: str
    dtype: str
    widened: bool = False


@dataclasses.dataclass(frozen=True)
class Header:
    """What the runtime needs besides the IR itself."""

    #: Per flat user input: a `TensorSlot` fed to the model, or ``None`` for
    #: a value baked into the model at conversion (a Python constant).
    inputs: tuple[TensorSlot | None, ...]
    #: Per user output: ``("tensor", TensorSlot)`` or ``("constant", value)``.
    outputs: tuple[tuple[str, Any], ...]
    #: The CPU plugin's ``INFERENCE_PRECISION_HINT`` for this method.
    precision: str
    #: IR layer name -> debug handle of the FX node it was converted from.
    nodes: dict[str, int]
    fault: Fault | None = None


def encode(header: Header, xml: bytes, weights: bytes) -> bytes:
    """The blob of one method; the same arguments give the same bytes."""
    data = _header_to_json(header)
    data["xml_length"] = len(xml)
    return pack_blob(MAGIC, FORMAT_VERSION, data, bytes(xml) + bytes(weights))


def decode(blob: Any) -> tuple[Header, bytes, bytes]:
    """``(header, xml, weights)`` of a blob; ``ValueError`` naming what is wrong."""
    (header, xml_length), payload = unpack_header(
        blob, MAGIC, FORMAT_VERSION, kind="openvino backend blob", upgrade="backendconf-openvino", parse=_parse
    )
    return header, payload[:xml_length], payload[xml_length:]


def _parse(data: Any, payload: bytes) -> tuple[Header, int]:
    header = _header_from_json(data)
    xml_length = data["xml_length"]
    if type(xml_length) is not int or not 0 < xml_length <= len(payload):
        raise ValueError(f"xml_length {xml_length!r} does not fit the {len(payload)}-byte payload")
    return header, xml_length


# --- JSON ------------------------------------------------------------------------


def _slot_from_json(data: Any) -> TensorSlot:
    if not isinstance(data, dict):
        raise TypeError(f"a tensor slot must be an object, got {data!r}")
    name, dtype, widened = data["name"], data["dtype"], data["widened"]
    if not isinstance(name, str) or dtype not in DTYPES or not isinstance(widened, bool):
        raise ValueError(f"bad tensor slot {data!r} (dtype must be one of {sorted(DTYPES)})")
    return TensorSlot(name, dtype, widened)


def _header_to_json(header: Header) -> dict:
    return {
        "inputs": [None if slot is None else dataclasses.asdict(slot) for slot in header.inputs],
        "outputs": [
            {"kind": "tensor", "slot": dataclasses.asdict(value)}
            if kind == "tensor"
            else {"kind": "constant", "value": value}
            for kind, value in header.outputs
        ],
        "precision": header.precision,
        "nodes": dict(sorted(header.nodes.items())),
        "fault": None if header.fault is None else dataclasses.asdict(header.fault),
    }


def _header_from_json(data: Any) -> Header:
    if not isinstance(data, dict):
        raise TypeError("the header must be a JSON object")
    inputs = tuple(None if item is None else _slot_from_json(item) for item in data["inputs"])
    outputs: list[tuple[str, Any]] = []
    for item in data["outputs"]:
        if item["kind"] == "tensor":
            outputs.append(("tensor", _slot_from_json(item["slot"])))
        elif item["kind"] == "constant":
            outputs.append(("constant", item["value"]))
        else:
            raise ValueError(f"unknown output kind {item['kind']!r}")
    precision = data["precision"]
    if precision not in PRECISIONS:
        raise ValueError(f"inference precision {precision!r} is not one of {sorted(PRECISIONS)}")
    nodes = data["nodes"]
    if not isinstance(nodes, dict) or not all(isinstance(k, str) and type(v) is int for k, v in nodes.items()):
        raise ValueError("the node table must map IR layer names to integer handles")
    fault = data["fault"]
    fault = None if fault is None else Fault.from_json(fault)
    return Header(inputs=inputs, outputs=tuple(outputs), precision=precision, nodes=dict(nodes), fault=fault)
