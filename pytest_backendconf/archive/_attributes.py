"""``attributes.json``: the wrapper attributes a lowered module carries, and their tensors.

Each record names an attribute, its kind (plain attribute, parameter or
buffer) and its value in the encoding of `_tensor_codec`. The reader
refuses any name that would replace a member of the lowered module.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

from ._checks import REWRITE as _REWRITE
from ._checks import kind as _kind
from ._checks import short as _short
from ._tensor_codec import Encoded, ValueEncoder, check_tensor_meta, check_value, decode_value, is_tensor
from ..errors import ArchiveError, ArchiveManifestError

if TYPE_CHECKING:
    import torch

    from ..lowering import WrapperModule

#: Method names the wrapper needs for itself.
RESERVED_METHODS = frozenset({"lowered", "extra_attributes", "bundled_inputs"})
_ATTRIBUTE_KINDS = ("attribute", "parameter", "buffer")


def encode_attributes(wrapper: WrapperModule | None, extra: Mapping[str, object]) -> Encoded:
    encoder = ValueEncoder()
    records = []
    for name, value in extra.items():
        where = f"attribute {name!r}"
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("__") or name in dir(type(wrapper)):
            raise ArchiveError(
                f"cannot save the lowered module: {where} is not an identifier, is a dunder, or "
                "shadows a member of the lowered module; give it another name"
            )
        record: dict[str, Any] = {"name": name}
        if wrapper is not None and name in wrapper._parameters:
            record["kind"] = "parameter"
            record["requires_grad"] = bool(is_tensor(value) and value.requires_grad)
        elif wrapper is not None and name in wrapper._buffers:
            record["kind"] = "buffer"
            record["persistent"] = name not in wrapper._non_persistent_buffers_set
        else:
            record["kind"] = "attribute"
        if record["kind"] != "attribute" and value is not None and not is_tensor(value):
            raise ArchiveError(f"cannot save the lowered module: {where} is a {record['kind']} but not a tensor")
        try:
            record["value"] = encoder.encode(value, where)
        except ArchiveError as exc:
            raise ArchiveError(f"cannot save the lowered module: {exc}") from None
        records.append(record)
    document = {"attributes": records, "tensors": encoder.meta}
    try:
        text = json.dumps(document, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except ValueError as exc:  # pragma: no cover - the encoder already refuses these
        raise ArchiveError(f"cannot encode the lowered module's attributes: {exc}") from None
    return Encoded(text.encode("ascii"), encoder.data)


def check_attributes(document: object, where: str, methods: set[str]) -> tuple[list[dict], list[dict]]:
    def bad(what: str) -> ArchiveManifestError:
        return ArchiveManifestError(f"{where}: {what}; {_REWRITE}")

    if not isinstance(document, dict):
        raise bad(f"must be a JSON object, got {_kind(document)}")
    records, tensors = document.get("attributes"), document.get("tensors")
    if not isinstance(records, list) or not isinstance(tensors, list):
        raise bad("must have lists 'attributes' and 'tensors'")
    metas = [check_tensor_meta(meta, f"{where}, tensors[{i}]") for i, meta in enumerate(tensors)]
    names = set()
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise bad(f"attributes[{i}] must be an object, got {_kind(record)}")
        name, kind = record.get("name"), record.get("kind")
        if (
            not isinstance(name, str)
            or not name.isidentifier()
            or name.startswith("__")
            or name in names
            or name in methods
            or name in RESERVED_METHODS
            or name in _WRAPPER_MEMBERS
        ):
            raise bad(f"attributes[{i}] has name {_short(name)}, which cannot be restored on the lowered module")
        names.add(name)
        if kind not in _ATTRIBUTE_KINDS:
            raise bad(f"attribute {name!r} has kind {_short(kind)}; expected one of {_ATTRIBUTE_KINDS}")
        if "value" not in record:
            raise bad(f"attribute {name!r} has no value")
        value = record["value"]
        check_value(value, len(metas), f"{where}, attribute {name!r}")
        if kind != "attribute":
            if not (value is None or isinstance(value, dict) and "tensor" in value):
                raise bad(f"attribute {name!r} is a {kind} but its value is not a tensor")
            flag = "requires_grad" if kind == "parameter" else "persistent"
            if not isinstance(record.get(flag), bool):
                raise bad(f"attribute {name!r} must have a boolean {flag!r}")
            if (
                record.get("requires_grad")
                and value is not None
                and (not metas[value["tensor"]]["dtype"].startswith(("float", "bfloat", "complex")))
            ):
                raise bad(f"parameter {name!r} requires grad but its tensor is not floating point")
    return records, metas


# Names an attribute may never take: the wrapper's own state and methods.
_WRAPPER_MEMBERS = frozenset({"_baseline", "training", "lowered"})


def restore_attributes(wrapper: WrapperModule, records: list[dict], tensors: list[torch.Tensor], where: str) -> None:
    import torch

    taken = set(wrapper.__dict__) | set(dir(type(wrapper)))
    for record in records:
        name = record["name"]
        if name in taken:
            raise ArchiveManifestError(
                f"{where}: attribute {name!r} would replace a member of the lowered module; {_REWRITE}"
            )
        value = decode_value(record["value"], tensors, where)
        if record["kind"] == "parameter":
            parameter = None if value is None else torch.nn.Parameter(value, requires_grad=record["requires_grad"])
            wrapper.register_parameter(name, parameter)
        elif record["kind"] == "buffer":
            wrapper.register_buffer(name, value, persistent=record["persistent"])
        else:
            setattr(wrapper, name, value)
