"""The delegate-backend contract, in one file: what a vendor implements.

A backend is any object with a ``name`` and the four hooks of `Backend`;
nothing needs to inherit from anything. The optional parts are separate
protocols, so that a type checker tells a vendor which ones an object has.
What each hook must do, and what the conformance suite checks of it, is in
``docs/backend-contract.md``. Importing this module never imports torch.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node

    from .capabilities import Capabilities

    #: One flat input or output of a lowered method: a tensor, or a Python constant of the program
    #: (``archive.ValueSpec`` describes each).
    Value: TypeAlias = "torch.Tensor | bool | int | float | str | None"

#: The compile-spec key that asks a backend declaring ``fault_injection`` to
#: raise a `BackendError` when execution reaches one node (docs/backend-contract.md,
#: "Fault injection"). Its value is ``{"node": "<FX node name>"}``.
FAULT_KEY = "__backendconf_fault__"


@runtime_checkable
class Backend(Protocol):
    """The four hooks every backend has (docs/backend-contract.md#the-four-hooks)."""

    #: Unique among registered backends; matches ``[a-z][a-z0-9_]*``.
    name: str

    def is_available(self) -> bool:
        """Whether ``compile`` and ``execute`` can run in this process."""
        ...

    def preprocess(
        self, program: ExportedProgram, compile_spec: dict[str, Any], debug_handles: Mapping[Node, int]
    ) -> bytes:
        """Host only: turn one method's exported program into a deterministic blob.

        ``debug_handles[node]`` is the debug handle of any node of ``program``,
        nested subgraphs included. Raise `UnsupportedNodeError(node, reason)`
        for a node the backend cannot compile.
        """
        ...

    def compile(
        self, processed: dict[str, bytes], method_compile_spec: dict[str, dict[str, Any]]
    ) -> Mapping[str, object]:
        """Turn every method's blob into a handle for `execute`; runs at lowering (if available) and every load.

        A handle is the backend's own business: the package only hands it back to `execute`.
        """
        ...

    # ``handle``: what this backend's compile returned, of the type it chose (hence Any).
    def execute(self, handle: Any, inputs: list[Value]) -> Sequence[Value]:
        """Run one method on its flat user inputs; return its flat outputs.

        A failure tied to a node raises `BackendError(message, debug_handle=h)`.
        """
        ...


@runtime_checkable
class DeclaresCapabilities(Protocol):
    """A backend that declares what the suite may expect of it (`Capabilities`)."""

    capabilities: Capabilities


@runtime_checkable
class ExplainsUnavailability(Protocol):
    """A backend that says why ``is_available()`` is false (shown in the header, report and errors)."""

    def unavailable_reason(self) -> str: ...


@runtime_checkable
class ProfilesExecution(Protocol):
    """A backend that times its nodes: ``bc.profile`` and the ``execute_profiled_events`` check use it."""

    def execute_profiled(
        self, handle: Any, inputs: list[Value]
    ) -> tuple[Sequence[Value], Sequence[tuple[int | Sequence[int], int, int]]]:
        """``execute``, plus events ``(debug_handle, start_ns, end_ns)`` on ``time.perf_counter_ns``.

        At least one event per node run; a fused kernel is reported under
        each node it covers, or once with the list of their handles in place
        of the one; every event lies within the call.
        """
        ...


@runtime_checkable
class ChecksBlobVersions(Protocol):
    """A backend that says which releases' blobs it reads; ``load`` asks before ``compile``."""

    version: str

    def accepts_blob_version(self, version: str) -> bool:
        """Whether blobs written by backend ``version`` (as the archive records it) can be compiled here."""
        ...


@runtime_checkable
class DeclaresCacheIdentity(Protocol):
    """A backend that names its own settings for the preprocess cache's key (``--backendconf-cache``)."""

    def cache_identity(self) -> str | None:
        """Every setting of this object that changes a blob, as text that is the same in every process.

        Two objects whose ``preprocess`` may return different bytes for the same program and spec must
        give different texts. The files of the backend's packages, its ``version``, the file that
        registered it and the torch build are in the key already. None: never cache this backend.
        Without this method the key holds the object's attributes, when all of them are plain data.
        """
        ...


def fault_node_name(compile_spec: Mapping[str, object]) -> str | None:
    """The FX node name at which ``compile_spec`` asks for an injected fault, or None.

    For a backend's ``preprocess``: when this returns a name, the blob must
    make ``execute`` raise ``BackendError(..., debug_handle=debug_handles[node])``
    on reaching that node. A malformed value is a `ValueError` naming the key
    and the expected shape.
    """
    fault = compile_spec.get(FAULT_KEY)
    if fault is None:
        return None
    if not (isinstance(fault, Mapping) and set(fault) == {"node"} and isinstance(fault["node"], str)):
        raise ValueError(f"compile-spec key {FAULT_KEY!r} must be {{'node': '<FX node name>'}}, got {fault!r}")
    return str(fault["node"])


_LEADING_NUMBERS = re.compile(r"(\d+)(?:\.(\d+))?")


def release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string such as ``"1.4.0rc1"``; ``None`` if it has none."""
    match = _LEADING_NUMBERS.match(version.strip()) if isinstance(version, str) else None
    if match is None:
        return None
    return int(match[1]), int(match[2] or 0)


def same_major_not_newer(blob_version: str, ours: str) -> bool:
    """A blob version policy for ``accepts_blob_version``: same major release, not a newer minor.

    The project's own backends use it as
    ``return same_major_not_newer(version, self.version)``: a newer minor may
    write blobs with features this release cannot run; an older one within
    the major writes nothing this one cannot read. A version without leading
    numbers is refused.
    """
    theirs, mine = release(blob_version), release(ours)
    if theirs is None or mine is None:
        return False
    return theirs[0] == mine[0] and theirs <= mine


#: The method compile spec a TorchScript backend gets for a method its record names no options for:
#: ``torch._C._jit_to_backend`` cannot type an empty dict ("Tracer cannot infer type of {}").
TORCHSCRIPT_DEFAULT_METHOD_SPEC: dict[str, str] = {"": ""}


@dataclasses.dataclass(frozen=True)
class TorchScriptBackend:
    """A backend written in C++ against TorchScript's ``PyTorchBackendInterface``.

    Its shared library registers the backend class and its preprocess function
    with torch under ``name`` (``torch::jit::backend<T>(name)`` and
    ``backend_preprocess_register(name, preprocess)``); models are lowered to it
    with ``torch._C._jit_to_backend``. ``pytest --backend=NAME`` runs the
    suite's TorchScript form (docs/writing-a-backend.md, "An existing
    TorchScript backend").

    :param name: the name its C++ registers.
    :param library: its shared library, loaded with ``torch.ops.load_library``
        in the processes that run it (the backend host, the target), never in
        the pytest process unless ``--backendconf-in-process``; ``None`` if
        something else loads it.
    :param compile_spec: method compile specs by method name (``{"forward":
        {"key": "value"}}``); a method it does not name gets ``{"": ""}``.
    :param capabilities: what the suite may expect of it (its dtypes,
        tolerances, ``thread_safe``, ``deterministic``).
    """

    name: str
    library: str | os.PathLike[str] | None = None
    compile_spec: Mapping[str, Mapping[str, Any]] | None = None
    capabilities: Capabilities | None = None

    def library_path(self) -> str | None:
        return None if self.library is None else os.fspath(self.library)

    def method_compile_spec(self, methods: list[str]) -> dict[str, dict[str, object]]:
        """The compile spec lowering ``methods`` with ``torch._C._jit_to_backend``."""
        given = self.compile_spec or {}
        return {m: dict(given.get(m) or TORCHSCRIPT_DEFAULT_METHOD_SPEC) for m in methods}

    def is_available(self) -> bool:
        """Whether its library can be found; the C++ ``is_available()`` is asked where it is loaded."""
        path = self.library_path()
        return path is None or os.path.isfile(path)

    def unavailable_reason(self) -> str:
        return f"its library {self.library_path()} does not exist"

    def describe(self) -> str:
        """``TorchScript, library /opt/x.so``: its kind, for `backendconf list` and the header."""
        path = self.library_path()
        return "TorchScript, " + (f"library {path}" if path else "no library (loaded by its plugin)")
