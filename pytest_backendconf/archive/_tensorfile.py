"""Named tensors in a file that cannot execute code: the safetensors layout, written by hand.

Used for the ops category's sample inputs (shipped as data) and for the inputs
a failing comparison saves beside its rerun command. The layout is
safetensors' own (an 8-byte little-endian header length, a JSON header of
``{name: {"dtype", "shape", "data_offsets"}}``, then the raw bytes), so the
files also open with the ``safetensors`` library; no dependency is needed to
write or read them here.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
from pathlib import Path
import functools
from typing import TYPE_CHECKING, Mapping

from ._files import FileTooLargeError, SpecialFileError, read_regular_file

if TYPE_CHECKING:
    import torch

#: safetensors' dtype names for the torch dtypes the suite stores (torch's names).
_CODE_OF_NAME = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "complex64": "C64",
}


@functools.cache
def _codes() -> tuple[dict[torch.dtype, str], dict[str, torch.dtype]]:
    """``({torch dtype: code}, {code: torch dtype})``; torch is imported on first use, so that the
    archive package (which re-exports this module's names) stays importable without it."""
    from ..allowlist import DTYPES

    codes = {DTYPES[name]: code for name, code in _CODE_OF_NAME.items()}
    return codes, {code: dtype for dtype, code in codes.items()}


#: A header larger than this is not one we wrote (safetensors uses the same bound).
_MAX_HEADER = 100_000_000
#: The largest tensor file `read_tensors` reads unless told (a rerun file holds one sample's or one model's inputs).
MAX_FILE_BYTES = 4 * 2**30


class TensorFileError(ValueError):
    """The file is not a tensor file this package can read; the message names the file and the problem."""


def write_tensors(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` to ``path`` atomically (a reader never sees half a file)."""
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise TensorFileError("tensor files are little-endian; writing them on a big-endian host is not supported")
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _codes()[0]:
            raise TensorFileError(f"tensor {name!r} has dtype {tensor.dtype}, which tensor files do not store")
        data = _raw_bytes(tensor)
        header[name] = {
            "dtype": _codes()[0][tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors aligns the data to 8 bytes
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(struct.pack("<Q", len(encoded)))
            out.write(encoded)
            for chunk in chunks:
                out.write(chunk)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a data file is for everyone to read
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_tensors(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES, follow_symlinks: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a file written by `write_tensors` (or by safetensors), and its metadata.

    :param max_bytes: the largest file read (a larger one is a `TensorFileError`, read no further).
    :param follow_symlinks: False for a file found in a folder that may have been written by others (a
        samples cache): a link there is refused. A FIFO or a device is refused either way.
    """
    try:
        data = read_regular_file(path, max_bytes, follow_symlinks=follow_symlinks)
    except (SpecialFileError, FileTooLargeError) as exc:
        raise TensorFileError(f"{exc}; it is not a tensor file this reader takes") from None
    if len(data) < 8:
        raise TensorFileError(f"{path}: too short to be a tensor file ({len(data)} bytes)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(_MAX_HEADER, len(data) - 8):
        raise TensorFileError(
            f"{path}: header length {size} exceeds the file; the file is truncated or not a tensor file"
        )
    try:
        header = json.loads(data[8 : 8 + size])
    except RecursionError:
        raise TensorFileError(f"{path}: the header nests JSON too deeply; the file is not a tensor file") from None
    except ValueError as exc:
        raise TensorFileError(f"{path}: the header is not JSON ({exc}); the file is not a tensor file") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{path}: the header is not a JSON object")
    body = memoryview(data)[8 + size :]
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise TensorFileError(f"{path}: __metadata__ must be a JSON object of strings")
    import torch

    tensors: dict[str, torch.Tensor] = {}
    for name, record in header.items():
        dtype, shape, start, end = _checked_record(path, name, record, len(body))
        if shape and 0 in shape:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(bytearray(body[start:end]), dtype=dtype).reshape(shape)
    return tensors, dict(metadata)


#: Dimensions of one tensor, and the size of each, that a tensor file may declare.
_MAX_NDIM = 64
_MAX_DIM = 2**62


def _checked_record(
    path: str | os.PathLike[str], name: str, record: object, body: int
) -> tuple[torch.dtype, list[int], int, int]:
    """``(dtype, shape, start, end)`` of one header record, each field checked; `TensorFileError` naming it."""
    shown = repr(name) if len(name) <= 60 else repr(name[:57] + "...")

    def bad(what: str) -> TensorFileError:
        return TensorFileError(f"{path}: tensor {shown} {what}; the file is damaged or not a tensor file")

    if not isinstance(record, dict) or set(record) != {"dtype", "shape", "data_offsets"}:
        raise bad("must have exactly the fields dtype, shape and data_offsets")
    code, shape, offsets = record["dtype"], record["shape"], record["data_offsets"]
    dtype = _codes()[1].get(code) if isinstance(code, str) else None
    if dtype is None:
        raise bad(f"has dtype {_short(code)}; tensor files here hold {', '.join(sorted(_codes()[1]))}")
    if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
        raise bad(f"has shape {_short(shape)}; a shape is a list of at most {_MAX_NDIM} sizes")
    if not all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape):
        raise bad(f"has shape {_short(shape)}; sizes are integers from 0 to 2**62")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(v) is int for v in offsets)):
        raise bad(f"has data_offsets {_short(offsets)}; they are two integers [start, end)")
    start, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    if not 0 <= start <= end <= body or end - start != numel * dtype.itemsize:
        raise bad(f"({code} {shape}) does not fit its bytes [{start}, {end}) of the {body} the file holds")
    return dtype, shape, start, end


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    import torch

    c = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    out = bytearray(c.numel() * c.element_size())
    if out:
        # One memcpy into a bytearray-backed tensor; bytes(storage) is per element.
        torch.frombuffer(out, dtype=torch.uint8).copy_(c.reshape(-1).view(torch.uint8))
    return bytes(out)
