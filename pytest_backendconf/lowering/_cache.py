"""The preprocess cache (``--backendconf-cache=DIR``): a rerun reuses the blobs of unchanged lowerings.

An entry is one ``preprocess`` result, stored under a key that covers everything the blob may
depend on: the exported program's content (graph, node metadata, signature, weights and
constants), the compile spec, the debug handles given to ``preprocess`` (blobs carry them; a
lowering numbers its own from 0, so they are the same in every run), the backend's identity
(`_identity`: name, version, a hash of the files of the packages its class comes from, its
settings and the file that registered it, so an edited or reconfigured backend never meets its old
blobs) and the torch build. A hit skips ``preprocess``; ``compile`` and ``execute`` always run.

The cache serves one backend object (the run's selected backend): a wrapper or a deliberately
different backend object always runs its own ``preprocess``. Entries are written to a temporary
file and renamed (`write_atomic`), read back through the archive's checked reader
(`read_cache_entry`) and trusted for bytes only. The folder is not trusted (docs/security.md, "The
preprocess cache"): an entry is taken only when its MAC verifies under the cache's secret, kept
outside the folder (`cache_secret`); anything else there, a damaged or foreign entry, a FIFO,
device or link under an entry's name, is a miss and is removed (the link itself, never its
target). With ``verify``, a share of the hits runs ``preprocess`` again and a blob that differs
fails the lowering (`CacheMismatchError`). The folder is kept under its size cap by removing the
least recently used entries first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

import torch

from .. import _compat
from ..archive import (
    DEFAULT_LIMITS,
    FileTooLargeError,
    SpecialFileError,
    cache_secret,
    encode_cache_entry,
    read_cache_entry,
    read_regular_file,
    remove_file,
    write_atomic,
)
from ..debuginfo import walk_nodes
from ..errors import ArchiveError, CacheEntryMacError, CacheMismatchError
from ._identity import backend_identity

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

    from ..backend import Backend
    from ..registry import Source

#: The folder's size cap when none is given (``--backendconf-cache-size``), in MiB.
DEFAULT_MAX_MIB = 1024
#: The entry files' suffix: only these are read, counted and evicted.
SUFFIX = ".bcpc"
_KEY_VERSION = 1
_TAG = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# A pytest-backendconf preprocess cache (--backendconf-cache); safe to delete.\n"
)


class _Uncacheable(Exception):
    """The program holds a value with no stable text (an object's address): it is never cached."""


class PreprocessCache:
    """The folder of cached ``preprocess`` results for one backend object."""

    def __init__(
        self,
        directory: str | os.PathLike,
        backend: Backend,
        backend_version: str | None,
        max_bytes: int,
        *,
        secret: bytes | None = None,
        verify: float = 0.0,
        source: Source | None = None,
    ) -> None:
        """:param secret: what entries are bound to (their MAC); None: the machine's (`cache_secret`).
        :param verify: the share of hits (0 to 1) whose ``preprocess`` runs again to compare (`cached_preprocess`).
        :param source: where the registry found the backend (its file is part of the key); None for a
            backend object no registry holds.
        """
        self.directory = Path(directory)
        self.backend = backend
        self.backend_version = backend_version
        self.max_bytes = max_bytes
        self.secret = cache_secret()[0] if secret is None else secret
        self.verify = verify
        self.source = source
        # Taken now, before any check runs: what a backend sets on itself later (a table of compiled
        # kernels) is not a setting, and must not make the key depend on what ran first.
        self._identity = backend_identity(backend, backend_version, source)
        self._lock = threading.Lock()
        #: What this process's lowerings found: hits, misses, entries stored, damaged entries removed,
        #: entries refused (their MAC did not verify), hits verified by running ``preprocess`` again.
        self.counts = {"hits": 0, "misses": 0, "stored": 0, "removed": 0, "refused": 0, "verified": 0}

    def prepare(self) -> None:
        """Create the folder (and its ``CACHEDIR.TAG``); an `OSError` if it cannot be written.

        The tag is written afresh, never read: whatever stands under its name (a FIFO, a link to
        ``/dev/zero``) is replaced, not opened, and the write proves the folder writable now.
        """
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self.directory / _TAG, _TAG_TEXT, sync=False)

    def key(self, program: ExportedProgram, spec: dict, handles: Mapping[Node, int]) -> str | None:
        """The entry key of ``preprocess(program, spec, handles)``; None when it cannot be cached."""
        try:
            parts = {
                "version": _KEY_VERSION,
                "program": program_digest(program),
                "spec": json.dumps(spec, sort_keys=True),
                "handles": [handles[n] for n in walk_nodes(program.graph_module)],
                "backend": self.identity(),
                "torch": torch_build(),
            }
        except (_Uncacheable, TypeError, ValueError, KeyError):
            return None
        if parts["backend"] is None:
            return None
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def identity(self) -> str | None:
        """The backend's part of every key, as one string (None: it is not cached; `identity_problem` says why)."""
        return self._identity.text

    def identity_problem(self) -> str:
        """Why this backend is not cached ("" when it is)."""
        return self._identity.reason

    def get(self, key: str) -> bytes | None:
        """The blob stored under ``key``, or None; a damaged, foreign or special entry is removed."""
        path = self._path(key)
        try:
            data = read_regular_file(path, self.max_bytes)  # no FIFO, device or link: never blocks or follows
            blob = read_cache_entry(data, str(path), key, DEFAULT_LIMITS, self.secret)
        except (ArchiveError, SpecialFileError, FileTooLargeError) as exc:
            remove_file(path)  # the entry itself: a link goes, its target stays
            self._count("refused" if isinstance(exc, CacheEntryMacError) else "removed")
            self._count("misses")
            return None
        except OSError:  # none stored (or unreadable now): a miss
            self._count("misses")
            return None
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)  # recently used: evicted last
        self._count("hits")
        return blob

    def put(self, key: str, blob: bytes) -> None:
        """Store ``blob`` under ``key`` and keep the folder under its cap; a failed write only costs the entry."""
        data = encode_cache_entry(key, blob, self.secret)
        if len(data) > self.max_bytes:
            return
        try:
            write_atomic(self._path(key), data, sync=False)
            self._count("stored")
            self.evict()
        except OSError:
            pass

    def evict(self) -> None:
        """Remove the least recently used entries until the folder's entries fit in ``max_bytes``."""
        entries = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory):
                if entry.name.endswith(SUFFIX):
                    with contextlib.suppress(OSError):
                        info = entry.stat(follow_symlinks=False)  # a link's own size: its target is not ours
                        entries.append(
                            (info.st_mtime_ns, entry.name, info.st_size if stat.S_ISREG(info.st_mode) else 0)
                        )
        total = sum(size for _, _, size in entries)
        for _, name, size in sorted(entries):
            if total <= self.max_bytes:
                break
            remove_file(self.directory / name)  # another run may have removed it first
            total -= size

    def check_hit(self, key: str, blob: bytes, fresh: bytes, what: str) -> None:
        """Compare a hit's ``blob`` with ``fresh``, what ``preprocess`` makes now; a mismatch removes the
        entry and is a `CacheMismatchError` naming it."""
        self._count("verified")
        if fresh == blob:
            return
        path = self._path(key)
        remove_file(path)
        raise CacheMismatchError(
            f"preprocess cache entry {str(path)!r} holds another blob ({len(blob)} bytes, SHA-256 "
            f"{hashlib.sha256(blob).hexdigest()[:16]}...) than preprocess() of backend {self.backend.name!r} "
            f"makes now for {what} ({len(fresh)} bytes, SHA-256 {hashlib.sha256(fresh).hexdigest()[:16]}...): "
            "the entry was tampered with or is stale, or preprocess() "
            "is not deterministic (the contract requires it). The entry is removed; if the folder may have been "
            "written by others, delete it, and if preprocess() depends on something outside the key (a "
            "compiler library, an environment variable), put that into the backend's version"
        )

    def _path(self, key: str) -> Path:
        return self.directory / (key + SUFFIX)

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1


_ACTIVE: PreprocessCache | None = None


def use_preprocess_cache(cache: PreprocessCache | None) -> None:
    """Make ``cache`` the one this process's lowerings use for its backend (None: no cache)."""
    global _ACTIVE
    _ACTIVE = cache


def active_cache() -> PreprocessCache | None:
    """The cache `use_preprocess_cache` set, if any."""
    return _ACTIVE


def cached_preprocess(
    backend: Backend,
    program: ExportedProgram,
    spec: dict,
    handles: Mapping[Node, int],
    preprocess: Callable[[], bytes],
    *,
    what: str = "the program",
) -> bytes:
    """``preprocess()``'s blob, from the active cache when it serves ``backend`` and holds the key.

    A hit the cache's ``verify`` share picks runs ``preprocess()`` again; other bytes than the entry's
    are a `CacheMismatchError` naming the entry and ``what`` (the method, the partition).
    """
    cache = _ACTIVE
    key = cache.key(program, spec, handles) if cache is not None and cache.backend is backend else None
    if key is not None:
        assert cache is not None
        blob = cache.get(key)
        if blob is not None:
            if cache.verify and _RANDOM.random() < cache.verify:
                cache.check_hit(key, blob, preprocess(), what)
            return blob
    blob = preprocess()
    if key is not None:
        cache.put(key, blob)  # type: ignore[union-attr]
    return blob


#: Which hits are verified: not predictable from the entries (nor seeded by a test's random state).
_RANDOM = random.SystemRandom()


# --- the key's parts ------------------------------------------------------------------------------


def torch_build() -> str:
    """The torch build: its version and the commit it was built from."""
    return f"{torch.__version__}+{getattr(torch.version, 'git_version', 'unknown')}"


def program_digest(program: ExportedProgram) -> str:
    """A hash of an exported program's content that is the same in every process for the same program.

    Built from text that does not depend on the process: node names, ops, arguments, the values'
    dtypes and shapes, the source lines (without the number FX gives its generated code) and module
    paths; the signature, the shape ranges and the input/output structure; the bytes of every
    weight and constant. An argument with no stable text raises `_Uncacheable`.
    """
    digest = hashlib.sha256()

    def put(*parts: object) -> None:
        for part in parts:
            digest.update(str(part).encode())
            digest.update(b"\0")

    for node in walk_nodes(program.graph_module):
        meta = node.meta
        put(node.op, node.name, _target(node.target), _text(node.args), _text(node.kwargs))
        put(_value_text(meta.get("val")), _stack_text(meta.get("stack_trace")), _text(meta.get("nn_module_stack")))
    put(_text(program.graph_signature.input_specs), _text(program.graph_signature.output_specs))
    put(sorted((str(k), str(v)) for k, v in program.range_constraints.items()))
    put(program.call_spec.in_spec, program.call_spec.out_spec)
    for name, value in sorted({**program.state_dict, **program.constants}.items()):
        put(name, _tensor_digest(value))
    return digest.hexdigest()


# FX numbers the code it generates per process ("<eval_with_key>.43"): the same program exported after
# other programs has another number in its stack traces, and the same source.
_GENERATED_CODE = re.compile(r"<eval_with_key>\.\d+")


def _stack_text(stack_trace: object) -> object:
    return _GENERATED_CODE.sub("<eval_with_key>", stack_trace) if isinstance(stack_trace, str) else stack_trace


def _target(target: object) -> str:
    if isinstance(target, str):
        return target
    if _compat.is_op_overload(target):
        return str(target)
    if _compat.is_higher_order_op(target):
        return f"higher_order.{target.name()}"
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if not isinstance(name, str):
        raise _Uncacheable(repr(target))
    return f"{getattr(target, '__module__', '')}.{name}"


def _text(value: object) -> str:
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}({', '.join(_text(v) for v in value)})"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{_text(k)}: {_text(v)}" for k, v in sorted(value.items(), key=lambda i: str(i[0]))) + "}"
        )
    if isinstance(value, torch.Tensor):
        return _value_text(value)
    text = repr(value)
    if " at 0x" in text:  # an object's address: different in every process
        raise _Uncacheable(text)
    return text


def _value_text(value: object) -> str:
    """A node's value as the program records it: a tensor's dtype, shape and strides, else its text."""
    if isinstance(value, torch.Tensor):
        return f"tensor({value.dtype}, {tuple(str(d) for d in value.shape)}, {tuple(str(s) for s in value.stride())})"
    if isinstance(value, (list, tuple)):
        return f"({', '.join(_value_text(v) for v in value)})"
    return _text(value)


def _tensor_digest(value: object) -> str:
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        raise _Uncacheable(type(value).__name__)
    tensor = value.detach().cpu()
    described = f"{tensor.dtype}{tuple(tensor.shape)}"
    if tensor.is_quantized:
        described += f"{tensor.qscheme()}"
        if tensor.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            described += f"{tensor.q_scale()!r}{tensor.q_zero_point()}"
        else:
            described += (
                f"{_tensor_digest(tensor.q_per_channel_scales())}{_tensor_digest(tensor.q_per_channel_zero_points())}"
            )
        tensor = tensor.int_repr()
    # A fresh copy: its storage holds exactly the tensor's bytes (a view's may hold more).
    raw = bytes(tensor.reshape(-1).clone().view(torch.uint8).untyped_storage())
    return described + hashlib.sha256(raw).hexdigest()
