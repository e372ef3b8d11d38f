"""The blob format: encode and decode a reference-backend program.

A blob is what ``preprocess`` returns and an archive stores, so the format
is compact, deterministic (the same program gives the same bytes) and safe
to read from an untrusted file: no pickle, every count and reference is
checked, and a bad blob raises ``ValueError`` naming the problem.

Layout (all integers little-endian)::

    header   magic b"\\x89BCREF\\r\\n" | u32 format version | u32 CRC-32 of payload
             | u64 payload length
    payload  u32 n_constants, constant*    (the constant pool)
             u32 n_blocks, block*          (block 0 is the program; others are
                                            nested code, e.g. torch.cond branches)
    constant u8 dtype | u8 ndim | u64 dim* | u64 nbytes | raw little-endian data
    block    u32 n_inputs | u32 n_instructions, instruction* | u32 n_outputs, value*
    instruction
             u16 opcode | u8 flags (bit 0: injected fault; bit 1: handle range)
             | i64 debug handle | str FX node name
             | [u16 n_handles, i64 handle*   only with bit 1: a fused kernel's nodes]
             | u16 n_args, value* | u16 n_kwargs, (str name, value)*
    value    u8 tag, then the payload of that tag (see ``_Tag``)
    str      u32 length | UTF-8

Registers are numbered per block: the block's inputs first, then one per
instruction, so instruction ``i`` writes register ``n_inputs + i`` (static
single assignment; the output register is implied, not stored) and may only
read registers below that.

Format 2 (backendconf-reference 0.4.0) added the handle range: an integer
kernel that runs a whole ``dequantize -> conv2d -> quantize`` chain keeps the
debug handles of every node it covers. A blob is written in the lowest
format that holds it, so a program without fused kernels is still format 1,
byte for byte what 0.3.0 wrote; both formats are read.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import struct
import sys
import zlib
from typing import Any

import torch

MAGIC = b"\x89BCREF\r\n"
#: Bumped on any incompatible change; a reader refuses blobs newer than itself.
FORMAT_VERSION = 2
#: The formats this reader reads: 1 has no handle ranges.
READS_VERSIONS = (1, 2)

FLAG_FAULT = 0x01
#: The instruction is a fused kernel and lists the debug handles of the nodes it covers (format 2).
FLAG_RANGE = 0x02
#: At most this many handles in one range.
MAX_RANGE = 2**16 - 1

_HEADER = struct.Struct("<8sIIQ")
_U8, _U16, _U32, _U64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<Q"))
_I64, _F64 = struct.Struct("<q"), struct.Struct("<d")
_MAX_DEPTH = 16  # nesting of lists in one argument; bounds the decoder's recursion
_MAX_NDIM = 64


@dataclasses.dataclass(frozen=True)
class Reg:
    """A reference to a register of the enclosing block."""

    index: int


@dataclasses.dataclass(frozen=True)
class Const:
    """A reference to a tensor of the constant pool."""

    index: int


@dataclasses.dataclass(frozen=True)
class BlockRef:
    """A reference to a nested code block (always one with a higher index)."""

    index: int


#: What an argument can be: an immediate, a reference, or a list of values.
Value = (
    None
    | bool
    | int
    | float
    | str
    | list
    | Reg
    | Const
    | BlockRef
    | torch.dtype
    | torch.memory_format
    | torch.layout
    | torch.device
)


@dataclasses.dataclass
class Instruction:
    """One op call: ``kernel(*args, **kwargs)`` for one FX node."""

    opcode: int
    args: list[Value]
    kwargs: dict[str, Value]
    debug_handle: int
    node: str
    fault: bool = False
    #: A fused kernel's nodes' debug handles, in program order (empty: the instruction is one node,
    #: ``debug_handle``'s). Errors and profiling events of the instruction name the whole range.
    handles: tuple[int, ...] = ()


@dataclasses.dataclass
class Block:
    """A straight-line code block with its inputs and outputs."""

    n_inputs: int
    instructions: list[Instruction]
    outputs: list[Value]


@dataclasses.dataclass
class Program:
    """A whole blob: the constant pool and the code blocks (block 0 runs first)."""

    constants: list[torch.Tensor]
    blocks: list[Block]


class _Tag(enum.IntEnum):
    NONE = 0
    FALSE = 1
    TRUE = 2
    INT = 3  # i64
    FLOAT = 4  # f64
    STR = 5  # str
    LIST = 6  # u32 count, value*
    REG = 7  # u32
    CONST = 8  # u32
    BLOCK = 9  # u32
    DTYPE = 10  # u8 code
    MEMORY_FORMAT = 11  # u8 code
    LAYOUT = 12  # u8 code
    DEVICE = 13  # str


# Codes are part of the format: append only.
_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.bool,
    torch.float64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint64,  # aten.hash_tensor's result
)
_MEMORY_FORMATS = (
    torch.contiguous_format,
    torch.preserve_format,
    torch.channels_last,
    torch.channels_last_3d,
)
_LAYOUTS = (torch.strided,)

_DTYPE_CODE = {d: i for i, d in enumerate(_DTYPES)}
_MEMORY_FORMAT_CODE = {m: i for i, m in enumerate(_MEMORY_FORMATS)}
_LAYOUT_CODE = {k: i for i, k in enumerate(_LAYOUTS)}


def can_encode(value: object) -> bool:
    """Whether ``value`` (an argument, after node references are replaced) fits a blob."""
    try:
        _Writer().value(value)
    except ValueError:
        return False
    return True


# --- encoding ------------------------------------------------------------------------


def encode(program: Program) -> bytes:
    """Serialize ``program``; equal programs give equal bytes."""
    if sys.byteorder != "little":
        # Tensor data is written as raw storage bytes, which must be little-endian.
        raise ValueError("the reference backend writes blobs only on little-endian hosts")
    w = _Writer()
    w.u32(len(program.constants))
    for tensor in program.constants:
        w.tensor(tensor)
    w.u32(len(program.blocks))
    for block in program.blocks:
        w.u32(block.n_inputs)
        w.u32(len(block.instructions))
        for ins in block.instructions:
            w.instruction(ins)
        w.u32(len(block.outputs))
        for value in block.outputs:
            w.value(value)
    payload = b"".join(w.parts)
    # The lowest format that holds the program: without handle ranges, format 1 (what 0.3.0 reads).
    ranges = any(ins.handles for block in program.blocks for ins in block.instructions)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION if ranges else 1, zlib.crc32(payload), len(payload))
    return header + payload


def _raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements in row-major order, whatever its strides or offset."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    data = bytearray(flat.numel() * flat.element_size())
    if data:
        # A memcpy into a bytearray: bytes(t.untyped_storage()) would copy
        # byte by byte through Python (seconds per megabyte).
        torch.frombuffer(data, dtype=torch.uint8).copy_(flat.view(torch.uint8))
    return bytes(data)


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, v: int) -> None:
        self.parts.append(_U8.pack(v))

    def u16(self, v: int) -> None:
        self.parts.append(_U16.pack(v))

    def u32(self, v: int) -> None:
        self.parts.append(_U32.pack(v))

    def u64(self, v: int) -> None:
        self.parts.append(_U64.pack(v))

    def str(self, s: str) -> None:
        data = s.encode("utf-8")
        self.u32(len(data))
        self.parts.append(data)

    def tensor(self, t: torch.Tensor) -> None:
        if t.dtype not in _DTYPE_CODE:
            raise ValueError(f"cannot store a {t.dtype} tensor in a blob")
        if t.layout != torch.strided:
            raise ValueError(f"cannot store a {t.layout} tensor in a blob")
        data = _raw_bytes(t)
        self.u8(_DTYPE_CODE[t.dtype])
        self.u8(t.dim())
        for size in t.shape:
            self.u64(size)
        self.u64(len(data))
        self.parts.append(data)

    def instruction(self, ins: Instruction) -> None:
        self.u16(ins.opcode)
        self.u8((FLAG_FAULT if ins.fault else 0) | (FLAG_RANGE if ins.handles else 0))
        self.parts.append(_I64.pack(ins.debug_handle))
        self.str(ins.node)
        if ins.handles:
            if len(ins.handles) > MAX_RANGE:
                raise ValueError(
                    f"instruction of node {ins.node!r} covers {len(ins.handles)} nodes, more than {MAX_RANGE}"
                )
            self.u16(len(ins.handles))
            for handle in ins.handles:
                self.parts.append(_I64.pack(handle))
        self.u16(len(ins.args))
        for arg in ins.args:
            self.value(arg)
        self.u16(len(ins.kwargs))
        for name in sorted(ins.kwargs):  # sorted: same kwargs, same bytes
            self.str(name)
            self.value(ins.kwargs[name])

    def value(self, v: object, depth: int = 0) -> None:
        # bool before int: bool is a subclass of int.
        if v is None:
            self.u8(_Tag.NONE)
        elif v is True:
            self.u8(_Tag.TRUE)
        elif v is False:
            self.u8(_Tag.FALSE)
        elif type(v) is int:
            if not -(2**63) <= v < 2**63:
                raise ValueError(f"integer {v} does not fit in int64")
            self.u8(_Tag.INT)
            self.parts.append(_I64.pack(v))
        elif type(v) is float:
            self.u8(_Tag.FLOAT)
            self.parts.append(_F64.pack(v))
        elif type(v) is str:
            self.u8(_Tag.STR)
            self.str(v)
        elif isinstance(v, (list, tuple)):
            if depth >= _MAX_DEPTH:
                raise ValueError(f"argument nests lists deeper than {_MAX_DEPTH}")
            self.u8(_Tag.LIST)
            self.u32(len(v))
            for item in v:
                self.value(item, depth + 1)
        elif isinstance(v, (Reg, Const, BlockRef)):
            tag = {Reg: _Tag.REG, Const: _Tag.CONST, BlockRef: _Tag.BLOCK}[type(v)]
            self.u8(tag)
            self.u32(v.index)
        elif isinstance(v, torch.dtype) and v in _DTYPE_CODE:
            self.u8(_Tag.DTYPE)
            self.u8(_DTYPE_CODE[v])
        elif isinstance(v, torch.memory_format) and v in _MEMORY_FORMAT_CODE:
            self.u8(_Tag.MEMORY_FORMAT)
            self.u8(_MEMORY_FORMAT_CODE[v])
        elif isinstance(v, torch.layout) and v in _LAYOUT_CODE:
            self.u8(_Tag.LAYOUT)
            self.u8(_LAYOUT_CODE[v])
        elif isinstance(v, torch.device):
            self.u8(_Tag.DEVICE)
            self.str(str(v))
        else:
            raise ValueError(f"cannot store {type(v).__name__} value {v!r} in a blob")


# --- decoding ------------------------------------------------------------------------


def decode(blob: bytes | bytearray | memoryview) -> Program:
    """Parse and check a blob; raise ``ValueError`` naming what is wrong with it."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError(f"a reference-backend blob must be bytes, not {type(blob).__name__}")
    # A view, not a copy: blobs carry the weights and may be large.
    blob = memoryview(blob).cast("B")
    if bytes(blob[: len(MAGIC)]) != MAGIC:
        raise ValueError(f"not a reference-backend blob: it starts with {bytes(blob[:8])!r}, expected {MAGIC!r}")
    if len(blob) < _HEADER.size:
        raise ValueError(
            f"reference-backend blob is truncated: {len(blob)} bytes, shorter than the {_HEADER.size}-byte header"
        )
    _, version, crc, length = _HEADER.unpack_from(blob)
    if version > FORMAT_VERSION:
        raise ValueError(
            f"reference-backend blob has format version {version}, newer than this "
            f"interpreter's version {FORMAT_VERSION}: upgrade backendconf-reference on the target"
        )
    if version not in READS_VERSIONS:
        raise ValueError(
            f"reference-backend blob has unknown format version {version} "
            f"(this interpreter reads versions {', '.join(str(v) for v in READS_VERSIONS)})"
        )
    payload = blob[_HEADER.size :]
    if len(payload) < length:
        raise ValueError(
            f"reference-backend blob is truncated: the header announces {length} payload "
            f"bytes, {len(payload)} are present"
        )
    if len(payload) > length:
        raise ValueError(
            f"reference-backend blob has {len(payload) - length} unexpected bytes after its {length}-byte payload"
        )
    if zlib.crc32(payload) != crc:
        raise ValueError("reference-backend blob is corrupt: its payload fails the CRC-32 check")
    return _Reader(payload, version).program()


class _Reader:
    """Reads a payload front to back; every read is bounds-checked."""

    def __init__(self, data: memoryview, version: int = FORMAT_VERSION) -> None:
        self.data = data
        self.version = version
        self.pos = 0
        # Limits for the references of the value being read; set per block.
        self.n_constants = 0
        self.n_blocks = 0
        self.block = 0
        self.n_registers = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"malformed reference-backend blob at payload offset {self.pos}: {what}")

    def take(self, n: int, what: str) -> memoryview:
        if n > len(self.data) - self.pos:
            raise self.fail(f"truncated while reading {what} ({n} bytes needed)")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def read(self, fmt: struct.Struct, what: str) -> Any:
        pos = self.pos
        if fmt.size > len(self.data) - pos:
            raise self.fail(f"truncated while reading {what} ({fmt.size} bytes needed)")
        self.pos = pos + fmt.size
        return fmt.unpack_from(self.data, pos)[0]

    def u8(self, what: str) -> int:
        return self.read(_U8, what)

    def u16(self, what: str) -> int:
        return self.read(_U16, what)

    def u32(self, what: str) -> int:
        return self.read(_U32, what)

    def u64(self, what: str) -> int:
        return self.read(_U64, what)

    def count(self, what: str, item_size: int, wide: bool = True) -> int:
        n = self.u32(what) if wide else self.u16(what)
        # Each item takes at least item_size bytes: a count the remaining
        # bytes cannot hold is corrupt, and must not drive a huge allocation.
        if n * item_size > len(self.data) - self.pos:
            raise self.fail(f"{what} is {n}, more than the rest of the blob can hold")
        return n

    def str(self, what: str) -> str:
        n = self.u32(f"length of {what}")
        try:
            return str(self.take(n, what), "utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def program(self) -> Program:
        constants = [self.tensor(i) for i in range(self.count("constant count", 10))]
        self.n_constants = len(constants)
        self.n_blocks = self.count("block count", 12)
        if self.n_blocks == 0:
            raise self.fail("the program has no code block")
        blocks = []
        for index in range(self.n_blocks):
            self.block = index
            blocks.append(self.code_block())
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} bytes left after the last block")
        return Program(constants, blocks)

    def tensor(self, index: int) -> torch.Tensor:
        what = f"constant {index}"
        code = self.u8(f"dtype of {what}")
        if code >= len(_DTYPES):
            raise self.fail(f"{what} has unknown dtype code {code}")
        dtype = _DTYPES[code]
        ndim = self.u8(f"rank of {what}")
        if ndim > _MAX_NDIM:
            raise self.fail(f"{what} has rank {ndim}, more than {_MAX_NDIM}")
        shape = [self.u64(f"shape of {what}") for _ in range(ndim)]
        nbytes = self.u64(f"size of {what}")
        numel = 1
        for size in shape:
            numel *= size
        itemsize = dtype.itemsize
        if nbytes != numel * itemsize:
            raise self.fail(
                f"{what} holds {nbytes} bytes, but a {dtype} tensor of shape {tuple(shape)} needs {numel * itemsize}"
            )
        data = self.take(nbytes, f"data of {what}")
        try:
            if numel == 0:
                return torch.empty(shape, dtype=dtype)
            if dtype == torch.bool:
                # Bytes other than 0 and 1 are not valid bools: normalize them.
                return torch.frombuffer(bytearray(data), dtype=torch.uint8).ne(0).reshape(shape)
            return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)
        except (RuntimeError, ValueError) as exc:
            raise self.fail(f"{what} of shape {tuple(shape)} cannot be built: {exc}") from None

    def code_block(self) -> Block:
        n_inputs = self.u32(f"input count of block {self.block}")
        n_instructions = self.count(f"instruction count of block {self.block}", 17)
        instructions = []
        for i in range(n_instructions):
            self.n_registers = n_inputs + i  # SSA: only earlier registers are readable
            instructions.append(self.instruction(i))
        self.n_registers = n_inputs + n_instructions
        outputs = [
            self.value(f"output {k} of block {self.block}")
            for k in range(self.count(f"output count of block {self.block}", 1))
        ]
        return Block(n_inputs, instructions, outputs)

    def instruction(self, i: int) -> Instruction:
        where = f"instruction {i} of block {self.block}"
        opcode = self.u16(f"opcode of {where}")
        flags = self.u8(f"flags of {where}")
        known = FLAG_FAULT | (FLAG_RANGE if self.version >= 2 else 0)
        if flags & ~known:
            raise self.fail(f"{where} has unknown flags {flags:#04x} for format {self.version}")
        handle = self.read(_I64, f"debug handle of {where}")
        node = self.str(f"node name of {where}")
        where = f"{where} (node {node!r})"
        handles: tuple[int, ...] = ()
        if flags & FLAG_RANGE:
            n = self.count(f"handle count of {where}", 8, wide=False)
            if n == 0:
                raise self.fail(f"{where} has an empty handle range")
            handles = tuple(self.read(_I64, f"handle of {where}") for _ in range(n))
        args = [
            self.value(f"argument {k} of {where}")
            for k in range(self.count(f"argument count of {where}", 1, wide=False))
        ]
        kwargs = {}
        for _ in range(self.count(f"keyword count of {where}", 5, wide=False)):
            name = self.str(f"keyword name of {where}")
            if not name.isidentifier() or name in kwargs:
                raise self.fail(f"{where} has a bad or repeated keyword {name!r}")
            kwargs[name] = self.value(f"keyword {name!r} of {where}")
        return Instruction(opcode, args, kwargs, handle, node, bool(flags & FLAG_FAULT), handles)

    def value(self, what: builtins.str, depth: int = 0) -> Value:
        tag = self.u8(f"tag of {what}")
        if tag == _Tag.NONE:
            return None
        if tag == _Tag.FALSE:
            return False
        if tag == _Tag.TRUE:
            return True
        if tag == _Tag.INT:
            return self.read(_I64, what)
        if tag == _Tag.FLOAT:
            return self.read(_F64, what)
        if tag == _Tag.STR:
            return self.str(what)
        if tag == _Tag.LIST:
            if depth >= _MAX_DEPTH:
                raise self.fail(f"{what} nests lists deeper than {_MAX_DEPTH}")
            n = self.count(f"length of {what}", 1)
            return [self.value(what, depth + 1) for _ in range(n)]
        if tag == _Tag.REG:
            index = self.u32(what)
            if index >= self.n_registers:
                raise self.fail(f"{what} reads register {index}, but only {self.n_registers} are set here")
            return Reg(index)
        if tag == _Tag.CONST:
            index = self.u32(what)
            if index >= self.n_constants:
                raise self.fail(f"{what} names constant {index} of {self.n_constants}")
            return Const(index)
        if tag == _Tag.BLOCK:
            index = self.u32(what)
            # Only later blocks: the nesting is a tree, so running it terminates.
            if not self.block < index < self.n_blocks:
                raise self.fail(
                    f"{what} names block {index}; block {self.block} may only use blocks "
                    f"{self.block + 1}..{self.n_blocks - 1}"
                )
            return BlockRef(index)
        if tag in (_Tag.DTYPE, _Tag.MEMORY_FORMAT, _Tag.LAYOUT):
            tables: dict[int, tuple[torch.dtype | torch.memory_format | torch.layout, ...]] = {
                _Tag.DTYPE: _DTYPES,
                _Tag.MEMORY_FORMAT: _MEMORY_FORMATS,
                _Tag.LAYOUT: _LAYOUTS,
            }
            table = tables[tag]
            code = self.u8(what)
            if code >= len(table):
                raise self.fail(f"{what} has unknown {_Tag(tag).name.lower()} code {code}")
            return table[code]
        if tag == _Tag.DEVICE:
            name = self.str(what)
            try:
                return torch.device(name)
            except (RuntimeError, ValueError):
                raise self.fail(f"{what} names unknown device {name!r}") from None
        raise self.fail(f"{what} has unknown tag {tag}")
