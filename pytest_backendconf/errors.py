"""Every exception and warning the package raises, in one place.

Backend authors raise two of them (`UnsupportedNodeError` from `preprocess`,
`BackendError` from `execute`); the lowering turns those into the
symbolicated texts of docs/backend-contract.md#debug-handles-and-texts. Importing this module never imports
torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar, cast, overload

if TYPE_CHECKING:
    from torch.fx import Node

    from .debuginfo import DebugInfo


class BackendConfError(Exception):
    """Base class of every error raised by pytest-backendconf."""


# --- registry -----------------------------------------------------------------


class RegistryError(BackendConfError):
    """A backend could not be registered or selected; in pytest a usage error."""


class UnknownBackendError(RegistryError, LookupError):
    """No registered backend has the requested name."""


class DuplicateBackendError(RegistryError):
    """Two sources registered a backend under the same name."""


class InvalidBackendError(RegistryError, TypeError):
    """A registered object does not have the shape of a backend (docs/backend-contract.md)."""


class PluginLoadError(RegistryError, ImportError):
    """The plugin providing the selected backend failed to import."""


# --- the backend contract -----------------------------------------------------


class Rejection:
    """One node a backend rejects, with its reason: an entry of `UnsupportedNodeError.rejections`.

    ``debug_info`` is filled in by the lowering (the node's debug handle,
    source line and module hierarchy); ``str()`` is the node's symbolicated
    text, as `UnsupportedNodeError` gives it for a single node. ``node`` is
    what the backend passed: a ``torch.fx.Node`` of its program, if it kept
    the contract.
    """

    __slots__ = ("node", "reason", "debug_info")
    #: The error class whose entry this is, as its text names it.
    _raised_with = "UnsupportedNodeError"

    def __init__(self, node: object, reason: str = "") -> None:
        self.node = node
        self.reason = reason
        self.debug_info: DebugInfo | None = None

    @property
    def debug_handle(self) -> int | None:
        """The node's debug handle in the lowered program, once the lowering has filled it in."""
        return getattr(self.debug_info, "handle", None)

    def __repr__(self) -> str:
        return f"Rejection({getattr(self.node, 'name', self.node)!r}, {self.reason!r})"

    def __str__(self) -> str:
        from .debuginfo import debug_info_for_node, format_unsupported

        info = self.debug_info
        if info is None:
            if not all(hasattr(self.node, a) for a in ("op", "target", "meta", "name")):
                # Not a torch.fx.Node: say so rather than fail inside str().
                reason = f" ({self.reason})" if self.reason else ""
                return (
                    f"{self._raised_with} was raised with {type(self.node).__name__} {self.node!r:.80}, not a "
                    f"torch.fx.Node{reason}; pass the node of the program given to preprocess(), "
                    "so that the error can point at the model's source"
                )
            info = debug_info_for_node(cast("Node", self.node), method="", handle=-1)
        return format_unsupported(info, self.reason, compiler_failure=isinstance(self, CompilerFailure))


class CompilerFailure(Rejection):
    """One node a backend claims and its compiler failed on: an entry of `CompilerError.failures`.

    As a `Rejection`: ``node``, ``reason`` (here the compiler's diagnostic
    line), ``debug_info``; ``str()`` leads with "The node of … failed in this
    compiler, which claims it".
    """

    __slots__ = ()
    _raised_with = "CompilerError"

    def __repr__(self) -> str:
        return f"CompilerFailure({getattr(self.node, 'name', self.node)!r}, {self.reason!r})"


_NO_NODE = object()


class UnsupportedNodeError(BackendConfError):
    """Raised by ``preprocess`` for the graph nodes the backend cannot compile.

    ``UnsupportedNodeError(node, reason)`` rejects one node: ``node`` is the
    ``torch.fx.Node`` and ``reason`` says why, in the backend's words.
    ``UnsupportedNodeError(rejections=[(node, reason), ...])`` rejects every
    node the backend knows it cannot compile, in one call (the first is the
    one the text leads with); the suite then drops every rejected check of a
    batch of operator checks at once. ``str()`` gives the symbolicated text of
    docs/backend-contract.md#debug-handles-and-texts for the first node (the
    op, the user's source line with carets, the module hierarchy and the call
    stack), then the same for each other node.

    ``rejections`` holds every node as a `Rejection` (node, reason, and the
    debug info the lowering fills in); ``node``, ``reason`` and
    ``debug_info`` are the first one's.
    """

    @overload
    def __init__(self, node: Node, reason: str = "") -> None: ...
    @overload
    def __init__(self, *, rejections: Sequence[tuple[Node, str]]) -> None: ...
    def __init__(
        self, node: object = _NO_NODE, reason: str = "", *, rejections: Sequence[tuple[object, str]] | None = None
    ) -> None:
        if rejections is None:
            if node is _NO_NODE:
                raise TypeError(
                    "UnsupportedNodeError takes the rejected node: UnsupportedNodeError(node, reason), or "
                    "rejections=[(node, reason), ...] for several"
                )
            entries = [Rejection(node, reason)]
        else:
            if node is not _NO_NODE or reason:
                raise TypeError(
                    "UnsupportedNodeError takes (node, reason) for one node or rejections=[(node, reason), ...] "
                    "for several, not both"
                )
            entries = _entries(rejections, Rejection, "UnsupportedNodeError(rejections=...)")
        super().__init__(entries[0].node, entries[0].reason)
        #: Every rejected node, the first being ``node``; filled in with debug info by the lowering.
        self.rejections: tuple[Rejection, ...] = tuple(entries)

    # The first rejection's fields, as the one-node error always had them (assignable: a lowering
    # step may add to the reason).
    @property
    def node(self) -> object:
        return self.rejections[0].node

    @property
    def reason(self) -> str:
        return self.rejections[0].reason

    @reason.setter
    def reason(self, value: str) -> None:
        self.rejections[0].reason = value

    @property
    def debug_info(self) -> DebugInfo | None:
        return self.rejections[0].debug_info

    @debug_info.setter
    def debug_info(self, value: DebugInfo | None) -> None:
        self.rejections[0].debug_info = value

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_unsupported, ([(r.node, r.reason, r.debug_info) for r in self.rejections],))

    def __str__(self) -> str:
        first = str(self.rejections[0])
        if len(self.rejections) == 1:
            return first
        more = len(self.rejections) - 1
        rest = "\n".join(str(r) for r in self.rejections[1:])
        return f"{first}\nThe backend rejected {more} more node{'s' if more != 1 else ''}:\n{rest}"


_EntryT = TypeVar("_EntryT", bound=Rejection)


def _entries(given: object, kind: type[_EntryT], call: str) -> list[_EntryT]:
    """``rejections=`` (or ``failures=``) checked: a non-empty list of (node, reason) pairs, each node once."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise TypeError(f"{call} takes a list of (node, reason) pairs, got {type(given).__name__} {given!r:.80}")
    if not given:
        raise ValueError(
            f"{call.replace('...', '[]')} names no node; raise it only for nodes the backend "
            + ("rejects" if kind is Rejection else "claims and failed to compile")
        )
    entries: list[_EntryT] = []
    seen: set[int] = set()
    for k, pair in enumerate(given):
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[1], str):
            raise TypeError(f"{call}: entry {k} is {pair!r:.80}; each entry is a (node, reason) pair, the reason a str")
        if id(pair[0]) in seen:
            raise ValueError(
                f"{call} names node {getattr(pair[0], 'name', pair[0])!r:.80} twice; "
                f"give each {'rejected' if kind is Rejection else 'failing'} node once, with one reason"
            )
        seen.add(id(pair[0]))
        entries.append(kind(pair[0], pair[1]))
    return entries


def _rebuild_unsupported(entries: list[tuple[object, str, DebugInfo | None]]) -> UnsupportedNodeError:
    # The nodes the backend raised with, unpickled: torch.fx Nodes if it kept the contract.
    exc = UnsupportedNodeError(rejections=[(cast("Node", node), reason) for node, reason, _ in entries])
    for rejection, (_, _, info) in zip(exc.rejections, entries):
        rejection.debug_info = info
    return exc


class CompilerError(BackendConfError):
    """Raised by ``preprocess`` for graph nodes the backend claims but its compiler failed to build.

    The second of a compile error's three verdicts (docs/backend-contract.md,
    "Compile errors"): `UnsupportedNodeError` says "the backend does not claim
    this" (the check is *unsupported*); ``CompilerError`` says "the backend
    claims it and its compiler broke" (a verifier error, a legalization crash,
    a link error: the check *fails*, and a known-failures file lists it); any
    other exception from ``preprocess`` leaves the harness unable to tell, and
    the failure's text says so.

    ``CompilerError(node, diagnostic)`` names one node, with the compiler's
    own diagnostic line; ``CompilerError(failures=[(node, diagnostic), ...])``
    names several. ``failures`` holds each as a `CompilerFailure` (node,
    ``reason`` = the diagnostic, and the debug info the lowering fills in);
    ``node``, ``reason`` and ``debug_info`` are the first one's. ``str()`` is
    the symbolicated text of each node, as `UnsupportedNodeError` gives it,
    led by "The node of … failed in this compiler, which claims it".
    `FailingNodes.raise_verdict` raises it for a whole-graph compiler.
    """

    @overload
    def __init__(self, node: Node, reason: str = "") -> None: ...
    @overload
    def __init__(self, *, failures: Sequence[tuple[Node, str]]) -> None: ...
    def __init__(
        self, node: object = _NO_NODE, reason: str = "", *, failures: Sequence[tuple[object, str]] | None = None
    ) -> None:
        if failures is None:
            if node is _NO_NODE:
                raise TypeError(
                    "CompilerError takes the node the compiler failed on: CompilerError(node, diagnostic), or "
                    "failures=[(node, diagnostic), ...] for several"
                )
            entries = [CompilerFailure(node, reason)]
        else:
            if node is not _NO_NODE or reason:
                raise TypeError(
                    "CompilerError takes (node, diagnostic) for one node or failures=[(node, diagnostic), ...] "
                    "for several, not both"
                )
            entries = _entries(failures, CompilerFailure, "CompilerError(failures=...)")
        super().__init__(entries[0].node, entries[0].reason)
        #: Every node the compiler failed on, the first being ``node``; filled in with debug info by the lowering.
        self.failures: tuple[CompilerFailure, ...] = tuple(entries)

    @property
    def node(self) -> object:
        return self.failures[0].node

    @property
    def reason(self) -> str:
        return self.failures[0].reason

    @property
    def debug_info(self) -> DebugInfo | None:
        return self.failures[0].debug_info

    @property
    def rejections(self) -> tuple[CompilerFailure, ...]:
        """``failures``, under the name the lowering fills `UnsupportedNodeError`'s debug info by."""
        return self.failures

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_compiler_error, ([(r.node, r.reason, r.debug_info) for r in self.failures],))

    def __str__(self) -> str:
        first = str(self.failures[0])
        if len(self.failures) == 1:
            return first
        more = len(self.failures) - 1
        rest = "\n".join(str(r) for r in self.failures[1:])
        return f"{first}\nThe compiler failed on {more} more node{'s' if more != 1 else ''}:\n{rest}"


def _rebuild_compiler_error(entries: list[tuple[object, str, DebugInfo | None]]) -> CompilerError:
    exc = CompilerError(failures=[(cast("Node", node), reason) for node, reason, _ in entries])
    for failure, (_, _, info) in zip(exc.failures, entries):
        failure.debug_info = info
    return exc


class BackendError(BackendConfError):
    """Raised by a backend's ``execute`` for a failure tied to a graph node, or to a fused kernel.

    Pass the node's debug handle (``debug_handles[node]`` at preprocess time,
    carried in the blob) so that the user sees their own source line. For an
    error inside a kernel that covers several nodes, pass them all as
    ``debug_handles=[h1, h2, ...]``: the user sees every node of the range
    with its source line. ``debug_handle`` is then the range's first handle.
    """

    def __init__(
        self, message: str, debug_handle: int | None = None, *, debug_handles: Sequence[int] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if debug_handles is not None:
            if debug_handle is not None:
                raise TypeError(
                    "BackendError takes debug_handle=h (one node) or debug_handles=[h1, h2, ...] (a fused "
                    "kernel's nodes), not both"
                )
            if isinstance(debug_handles, (str, bytes)) or not all(type(h) is int for h in debug_handles):
                raise TypeError(
                    f"BackendError(debug_handles=...) takes a list of ints (the fused kernel's nodes' debug "
                    f"handles), got {debug_handles!r:.80}"
                )
            debug_handles = tuple(debug_handles)
            if not debug_handles:
                raise ValueError("BackendError(debug_handles=[]) names no node; give the kernel's handles or none")
        #: The nodes the failure belongs to: ``(debug_handle,)``, a fused kernel's range, or ``()``.
        self.debug_handles: tuple[int, ...] = (
            debug_handles if debug_handles is not None else (() if debug_handle is None else (debug_handle,))
        )
        self.debug_handle = self.debug_handles[0] if self.debug_handles else None


class BackendRuntimeError(BackendConfError, RuntimeError):
    """A `BackendError` re-raised with the model source it points at."""

    def __init__(
        self, text: str, message: str, debug_handle: int | None, debug_handles: Sequence[int] | None = None
    ) -> None:
        super().__init__(text)
        self.message = message
        self.debug_handle = debug_handle
        #: Every node of the failure: one handle, or a fused kernel's range.
        self.debug_handles: tuple[int, ...] = (
            tuple(debug_handles) if debug_handles is not None else (() if debug_handle is None else (debug_handle,))
        )


class BackendUnavailableError(BackendConfError, RuntimeError):
    """The backend's ``is_available()`` is false where it must run (docs/backend-contract.md, availability)."""


class StaleKnownFailureWarning(UserWarning):
    """A known-failures entry matches no conformance check of the selected backend."""


class BackendUnavailableWarning(UserWarning):
    """Lowering went ahead without compiling: the backend is not available here."""


class BackendContractError(BackendConfError):
    """A backend broke the delegate contract (docs/backend-contract.md)."""


class OutputSpecError(BackendContractError):
    """An output of ``execute`` does not match the exported program's output spec.

    :param output: the index of the flat output that differs; None when the outputs as a whole do
        (their count).
    :param node: the name of the program's node that output is (None: not known).
    :param differs: what differs: some of ``"count"``, ``"type"`` (not a tensor), ``"dtype"``,
        ``"shape"``, ``"value"`` (a constant output), in that order.
    """

    def __init__(
        self, message: str, *, output: int | None = None, node: str | None = None, differs: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.output = output
        self.node = node
        self.differs: tuple[str, ...] = tuple(differs)


class InputSpecError(BackendConfError, ValueError):
    """A lowered method was called with inputs that differ from the exported ones."""


class OperatorNotRegisteredError(BackendConfError, RuntimeError):
    """A partitioned module's CPU fallback calls an operator this process has not registered."""


class LoweringError(BackendConfError, ValueError):
    """``to_backend`` was given something it cannot lower; the text names the fix."""


class CacheMismatchError(LoweringError):
    """``--backendconf-cache-verify`` ran ``preprocess`` again on a hit and got other bytes than the entry's.

    The contract requires a deterministic ``preprocess``, so the entry was tampered with or is stale
    (``preprocess`` depends on something its key does not hold); the text names the entry and the program.
    """


# --- archives -------------------------------------------------------------------


class ArchiveError(BackendConfError):
    """An archive cannot be read or written; the text names the entry."""


class CacheEntryMacError(ArchiveError):
    """A preprocess-cache entry's MAC does not verify under this cache's secret: another machine's
    entry, or one written by someone who does not hold the secret. The cache takes it as a miss."""


class OperatorRefusedError(ArchiveError, ValueError):
    """A file names an operator that is not run: not a registered operator, or one with side effects.

    ``operator`` is the name as the file gives it (cut short), ``where`` what named it (a blob, a
    fallback segment, a rerun file, with the node), ``reason`` why it is refused; ``unregistered``
    is true when no operator of that name is registered in this process (a custom op's module not
    imported yet). An `ArchiveError` (a file named it; ``except ArchiveError`` catches it) and a
    ``ValueError``. The rules: docs/design-notes.md, "Operators named by files"; the allowlist:
    pytest_backendconf/allowlist/operators.txt.
    """

    def __init__(self, operator: object, where: str, reason: str, *, unregistered: bool = False) -> None:
        text = operator if isinstance(operator, str) else repr(operator)
        self.operator = text if len(text) <= 80 else text[:77] + "..."
        self.where = where
        self.reason = reason
        self.unregistered = unregistered
        super().__init__()

    def __str__(self) -> str:
        return f"operator {self.operator!r} ({self.where}) is refused: {self.reason}"


class ArchiveFormatError(ArchiveError):
    """Not a zip archive of this format, or truncated."""


class ArchiveVersionError(ArchiveError):
    """The archive's major schema version is not the one this reader knows."""


class ArchiveEntryError(ArchiveError):
    """An entry is missing, unexpected, or has an unsafe name."""


class ArchiveChecksumError(ArchiveError):
    """An entry's SHA-256 does not match the manifest."""


class ArchiveSizeError(ArchiveError):
    """An entry is larger than its declared size or the reader's limits."""


class ArchiveManifestError(ArchiveError):
    """``manifest.json`` (or another JSON entry) has a wrong shape or type."""


class ArchiveBackendError(ArchiveError):
    """The archive names a backend that is not registered here."""


class ReportError(BackendConfError):
    """A report file cannot be read or merged: unreadable, not JSON, or not the schema we read."""


class BackendVersionError(ArchiveVersionError):
    """The backend here does not accept blobs written by the backend version the archive records."""

    def __init__(self, text: str, *, archive_version: str, backend_version: str | None) -> None:
        super().__init__(text)
        #: The backend version that wrote the archive, and the one installed here.
        self.archive_version = archive_version
        self.backend_version = backend_version


class DebugSidecarError(ArchiveError):
    """A ``.debug`` file does not belong to the archive, or a handles-only archive's debug info is needed but absent."""


class TargetUnreachable(BackendConfError):
    """The link to a device, or the device runner itself, failed: not the backend's failure.

    Raised (or reported as a check's error type) when a target command's
    transport ends without the runner saying how its worker ended (ssh exit
    255, adb "device offline", the runner killed), when the runner does not
    answer a kill request, or when a device cannot be reached at all. A
    backend that crashes or hangs on the device is the backend's failure
    (``TargetCrashError``/``TargetTimeoutError``), like ``BackendHostDied`` on the host.
    """


class TargetVersionError(BackendConfError):
    """The device runs another pytest-backendconf or backend version than the host (both named)."""
