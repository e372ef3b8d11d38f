"""Values and tensors as JSON plus raw bytes: the encoding archives and child-process messages share.

A value is a tensor, a Python scalar, or a list, tuple or dict of values.
`ValueEncoder.encode` turns it into JSON: scalars are JSON literals
(non-finite floats ``{"float": "nan"}``), a tuple is ``{"tuple": [...]}``, a
dict ``{"dict": [[key, value], ...]}``, a tensor ``{"tensor": n}`` where
``n`` indexes a table of tensor records ``{"dtype", "shape"}`` and their raw
little-endian bytes. `check_value` verifies such JSON strictly and
`decode_value` rebuilds the value. One tensor on its own is
`encode_tensor` / `decode_tensor`; `to_message` / `from_message` put a
whole value, tensor bytes included (base64), into one JSON document.

Nothing is ever imported or called by name: dtypes come from a fixed list
and tensors are built with ``torch.frombuffer`` from the bytes.
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from ._checks import MAX_NESTING as _MAX_NESTING
from ._checks import REWRITE as _REWRITE
from ._checks import is_int as _is_int
from ._checks import kind as _kind
from ._checks import short as _short
from ._method_spec import DTYPE_NAMES
from ..errors import ArchiveEntryError, ArchiveError, ArchiveManifestError, ArchiveSizeError

if TYPE_CHECKING:
    import torch
    from typing_extensions import TypeIs

ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex64": 8,
    "complex128": 16,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


class Encoded(NamedTuple):
    json: bytes
    tensor_bytes: list[bytes]


class ValueEncoder:
    """Turns tensors, scalars, and lists/tuples/dicts of them into JSON plus raw tensor bytes.

    Scalars are JSON literals (non-finite floats ``{"float": "nan"}``); a
    tuple is ``{"tuple": [...]}``, a dict ``{"dict": [[key, value], ...]}``,
    a tensor ``{"tensor": n}`` with ``tensors[n] = {"dtype", "shape"}`` and
    its raw bytes. The same tensor object is stored once.
    """

    def __init__(self) -> None:
        self.meta: list[dict[str, Any]] = []
        self.data: list[bytes] = []
        self._seen: dict[int, tuple[int, torch.Tensor]] = {}

    def encode(self, value: object, where: str, depth: int = 0) -> Any:
        """``value`` as JSON (the encoding above); its tensors go to `meta` and `data`."""
        if depth > _MAX_NESTING:
            raise ArchiveError(f"{where} is nested more than {_MAX_NESTING} levels deep (or contains itself)")
        kind = type(value)
        if value is None or kind is bool or kind is str or kind is int:
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"float": repr(value)}
        if type(value) is list:
            return [self.encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if type(value) is tuple:
            return {"tuple": [self.encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]}
        if type(value) is dict:
            items = []
            for k, v in value.items():
                if not (k is None or type(k) in (bool, int, float, str)):
                    raise ArchiveError(
                        f"{where} has a key of type {type(k).__name__}; keys must be str, int, float, bool or None"
                    )
                items.append([self.encode(k, where, depth + 1), self.encode(v, f"{where}[{k!r}]", depth + 1)])
            return {"dict": items}
        if is_tensor(value):
            return {"tensor": self.tensor(value, where)}
        raise ArchiveError(
            f"{where} is a {kind.__module__}.{kind.__qualname__}, which an archive cannot hold; keep "
            "tensors, int, float, bool, str, None, and lists, tuples or dicts of them"
        )

    def tensor(self, t: torch.Tensor, where: str) -> int:
        seen = self._seen.get(id(t))
        if seen is not None and seen[1] is t:
            return seen[0]
        meta, data = encode_tensor(t, where)
        self.meta.append(meta)
        self.data.append(data)
        self._seen[id(t)] = (len(self.meta) - 1, t)
        return len(self.meta) - 1


def encode_tensor(t: torch.Tensor, where: str) -> tuple[dict[str, Any], bytes]:
    """``({"dtype", "shape"}, raw little-endian bytes)`` of a dense CPU-copyable tensor."""
    import torch

    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise ArchiveError(f"{where} is a tensor subclass {type(t).__name__}; save a plain torch.Tensor")
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in DTYPE_NAMES:
        raise ArchiveError(f"{where} has dtype {dtype}; archives hold {', '.join(DTYPE_NAMES)}")
    if t.layout != torch.strided or t.device.type == "meta":
        raise ArchiveError(f"{where} is a {t.layout} tensor on {t.device}; archives hold dense tensors with data")
    if sys.byteorder != "little":
        raise ArchiveError("archives store tensors little-endian; saving on a big-endian host is not supported")
    c = t.detach()
    if c.device.type != "cpu":
        c = c.cpu()
    c = c.resolve_conj().resolve_neg().contiguous()
    # bytes(untyped_storage) copies element by element in Python (seconds per
    # MB); copying into a bytearray-backed uint8 tensor is one memcpy.
    out = bytearray(c.numel() * c.element_size())
    if out:
        torch.frombuffer(out, dtype=torch.uint8).copy_(c.reshape(-1).view(torch.uint8))
    return {"dtype": dtype, "shape": list(c.shape)}, bytes(out)


def decode_tensor(data: bytes, meta: Mapping[str, Any], where: str) -> torch.Tensor:
    """The tensor of `encode_tensor`'s ``(meta, data)``; a bad record is an `ArchiveError` naming ``where``."""
    return tensor_from_checked(data, check_tensor_meta(meta, where), where)


def tensor_from_checked(data: bytes, meta: Mapping[str, Any], where: str) -> torch.Tensor:
    """`decode_tensor` for a record `check_tensor_meta` returned."""
    import torch

    from ..allowlist import dtype_named  # imports torch: only here, where tensors are made

    if sys.byteorder != "little":
        raise ArchiveError(f"{where}: archives store tensors little-endian; this host is big-endian")
    dtype = dtype_named(meta["dtype"], where=where)
    shape = tuple(meta["shape"])
    if len(data) != meta["numel"] * ITEMSIZE[meta["dtype"]]:
        raise ArchiveSizeError(
            f"{where}: {len(data)} bytes do not make a {meta['dtype']} tensor of shape {list(shape)}"
        )
    if meta["numel"] == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def tensor_entries(
    metas: Sequence[Mapping[str, Any]],
    contents: Mapping[str, bytes],
    folder: str,
    owner: str,
    names: Iterable[str],
    where: Callable[[str], str],
) -> list[bytes]:
    """The bytes of the tensors ``metas`` describe, entries ``<folder>/<i>.bin``, each checked for its size.

    :param owner: the entry whose metadata lists them (for messages: "tensor 3 of attributes.json").
    :param names: the archive's entries of that folder: one no tensor refers to is an error.
    :param where: an entry's name → how messages name it (the archive and the entry).
    """
    found = []
    for i, meta in enumerate(metas):
        name = f"{folder}/{i}.bin"
        if name not in contents:
            raise ArchiveEntryError(f"{where(name)}: tensor {i} of {owner} is missing; {_REWRITE}")
        expected = meta["numel"] * ITEMSIZE[meta["dtype"]]
        if len(contents[name]) != expected:
            raise ArchiveSizeError(
                f"{where(name)}: has {len(contents[name])} bytes, but a {meta['dtype']} tensor of shape "
                f"{meta['shape']} needs {expected}; {_REWRITE}"
            )
        found.append(contents[name])
    for name in names:
        index = name[len(folder) + 1 : -len(".bin")]
        if int(index) >= len(metas):
            raise ArchiveEntryError(f"{where(name)}: no tensor of {owner} refers to it; {_REWRITE}")
    return found


def check_tensor_meta(meta: object, where: str) -> dict[str, Any]:
    """``{"dtype", "shape", "numel"}`` of a tensor record, or `ArchiveManifestError`/`ArchiveSizeError`."""
    if not isinstance(meta, dict):
        raise ArchiveManifestError(f"{where}: tensor record must be an object, got {_kind(meta)}; {_REWRITE}")
    dtype, shape = meta.get("dtype"), meta.get("shape")
    if type(dtype) is not str or dtype not in ITEMSIZE:
        raise ArchiveManifestError(
            f"{where}: unknown tensor dtype {_short(dtype)}; archives hold {', '.join(DTYPE_NAMES)}; {_REWRITE}"
        )
    if not isinstance(shape, list) or len(shape) > 64 or not all(_is_int(d) and 0 <= d < 2**62 for d in shape):
        raise ArchiveManifestError(f"{where}: tensor shape {_short(shape)} is not a list of sizes; {_REWRITE}")
    numel = 1
    for d in shape:
        numel *= d
        if numel > 2**62:
            raise ArchiveSizeError(f"{where}: tensor shape {shape} is too large; {_REWRITE}")
    return {"dtype": dtype, "shape": shape, "numel": numel}


def decode_value(tree: Any, tensors: Sequence[torch.Tensor], where: str) -> Any:
    """Inverse of `ValueEncoder.encode`, ``tensors`` by index (call `check_value` first).

    ``tree`` is JSON `check_value` accepted; what it decodes to (a tensor, a scalar, a container of
    them) is the JSON's to say, hence ``Any``.
    """
    if isinstance(tree, list):
        return [decode_value(v, tensors, where) for v in tree]
    if isinstance(tree, dict):
        ((tag, body),) = tree.items()
        if tag == "tensor":
            return tensors[body]
        if tag == "float":
            return float(body)
        if tag == "tuple":
            return tuple(decode_value(v, tensors, where) for v in body)
        return {decode_value(k, tensors, where): decode_value(v, tensors, where) for k, v in body}
    return tree


def check_value(tree: object, n_tensors: int, where: str, depth: int = 0, key: bool = False) -> None:
    """Raise `ArchiveManifestError` unless ``tree`` is a value `ValueEncoder` writes."""

    def bad(what: str) -> ArchiveManifestError:
        return ArchiveManifestError(f"{where}: {what}; {_REWRITE}")

    if depth > _MAX_NESTING:
        raise bad(f"value nested more than {_MAX_NESTING} levels deep")
    if tree is None or isinstance(tree, (bool, int, str)) or (isinstance(tree, float) and math.isfinite(tree)):
        return
    if isinstance(tree, list) and not key:
        for v in tree:
            check_value(v, n_tensors, where, depth + 1)
        return
    if isinstance(tree, dict) and len(tree) == 1:
        ((tag, body),) = tree.items()
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return
        if key:
            raise bad(f"dict key {_short(tree)} is not a scalar")
        if tag == "tensor":
            if not _is_int(body) or not 0 <= body < n_tensors:
                raise bad(f"tensor reference {_short(body)} is outside the table of {n_tensors} tensors")
            return
        if tag == "tuple" and isinstance(body, list):
            for v in body:
                check_value(v, n_tensors, where, depth + 1)
            return
        if tag == "dict" and isinstance(body, list):
            for item in body:
                if not isinstance(item, list) or len(item) != 2:
                    raise bad(f"dict item {_short(item)} is not a [key, value] pair")
                check_value(item[0], n_tensors, where, depth + 1, key=True)
                check_value(item[1], n_tensors, where, depth + 1)
            return
    raise bad(f"{_short(tree)} is not an encoded value")


def to_message(value: object, where: str) -> dict[str, Any]:
    """``value`` as one JSON-compatible document, tensor bytes in base64 (for JSON messages)."""
    encoder = ValueEncoder()
    tree = encoder.encode(value, where)
    tensors = [
        dict(meta, data=base64.b64encode(data).decode("ascii")) for meta, data in zip(encoder.meta, encoder.data)
    ]
    return {"value": tree, "tensors": tensors}


def from_message(message: object, where: str) -> Any:
    """Inverse of `to_message`; anything malformed is an `ArchiveError` naming ``where`` (the value: `decode_value`)."""
    if not isinstance(message, dict) or not isinstance(message.get("tensors"), list) or "value" not in message:
        raise ArchiveManifestError(
            f"{where}: must be an object with 'value' and a list 'tensors', got {_short(message)}"
        )
    tensors = []
    for i, record in enumerate(message["tensors"]):
        here = f"{where}, tensors[{i}]"
        if not isinstance(record, dict) or not isinstance(record.get("data"), str):
            raise ArchiveManifestError(f"{here}: must be an object with a base64 string 'data'")
        try:
            data = base64.b64decode(record["data"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ArchiveManifestError(f"{here}: data is not base64 ({exc})") from None
        tensors.append(decode_tensor(data, {k: v for k, v in record.items() if k != "data"}, here))
    check_value(message["value"], len(tensors), where)
    return decode_value(message["value"], tensors, where)


def is_tensor(value: object) -> TypeIs[torch.Tensor]:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)
