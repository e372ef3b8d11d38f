"""Symbolication: the text of each debug handle, formatted once and looked up by handle.

A log can name the same handles millions of times; each handle's text is
formatted once per table, and tables are cached per archive (by path,
size, mtime and inode) or per in-memory object.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Callable, Hashable, Iterable, Mapping

from ._info import (
    MAX_TEXT_CHARS,
    DebugInfo,
    Frame,
    clip,
    format_missing,
    one_line,
    format_range,
    hierarchy_prefix,
    traceback_text,
)


INT64_MAX = 2**63 - 1
#: Texts kept per table: each is formatted once per handle, but a table's
#: memory must not grow with the number of distinct handles a log names.
MAX_CACHED_TEXTS = 50_000
#: Characters of one symbolication call's text (each handle's is capped at `MAX_TEXT_CHARS`);
#: beyond it the text ends with "… (N more handles)". A million typical handles fit.
MAX_SYMBOLICATE_CHARS = 256 * 2**20


def join_texts(text: Callable[[int], str], handles: list[int]) -> str:
    """The texts of ``handles``, one after the other, within `MAX_SYMBOLICATE_CHARS`."""
    parts: list[str] = []
    size = 0
    for h in handles:
        part = text(h)
        size += len(part) + 1
        if size > MAX_SYMBOLICATE_CHARS:
            parts.append(f"… ({len(handles) - len(parts)} more handles; symbolicate fewer at a time)")
            break
        parts.append(part)
    return "\n".join(parts)


#: Characters of text a table keeps cached (besides the count of `MAX_CACHED_TEXTS`).
MAX_CACHED_CHARS = 64 * 2**20


def check_handles(handles: int | Iterable[int]) -> list[int]:
    """``handles`` as a list of ints; anything else is a `TypeError` naming the first bad one."""
    if isinstance(handles, int):
        handles = (handles,)
    handles = list(handles)
    for h in handles:
        if type(h) is not int:
            raise TypeError(f"debug handles are integers, got {short_repr(h)} ({type(h).__name__})")
    return handles


def short_repr(value: object, limit: int = 40) -> str:
    """``repr`` for messages, cut short; an int too long to print says how many digits it has."""
    if type(value) is int and not -(10**limit) < value < 10**limit:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SymbolTable:
    """Formats the text of each handle once; lookups are dictionary hits.

    Handles share stacks and module hierarchies (decoded from the archive's
    tables as shared objects), so the traceback and hierarchy lines are
    formatted once per distinct stack and hierarchy, found by object
    identity (each entry keeps its object, so a reused id never matches).
    """

    #: What the table was built for (`cached_table`), or None: a cached table must belong to it.
    owner: weakref.ref[object] | None

    def __init__(self, debug: Mapping[int, DebugInfo]) -> None:
        self.debug = debug
        self.cache: dict[int, str] = {}
        self.cached_chars = 0
        self._tracebacks: dict[int, tuple[tuple[Frame, ...], str]] = {}
        self._hierarchies: dict[tuple[int, str], tuple[tuple[tuple[str, str], ...], str]] = {}

    def text(self, handle: int) -> str:
        found = self.cache.get(handle)
        if found is None:
            info = self.debug.get(handle)
            if info is None:
                # Not cached: a log can name any number of distinct unknown handles.
                if not 0 <= handle <= INT64_MAX:
                    return format_missing([short_repr(handle)])
                return format_missing([handle])
            found = clip(
                f"debug handle {handle} (method {one_line(info.method)!r}, node {one_line(info.node)!r}, {one_line(info.op)}):\n"
                f"{self._body(info)}",
                MAX_TEXT_CHARS,
            )
            if len(self.cache) >= MAX_CACHED_TEXTS or self.cached_chars > MAX_CACHED_CHARS:
                self.cache.clear()  # bounded; refilled by the handles the log uses most
                self.cached_chars = 0
            self.cache[handle] = found
            self.cached_chars += len(found)
        return found

    def range_text(self, handles: list[int]) -> str:
        """The text of a fused kernel covering ``handles`` (`format_range`), as its runtime error shows it."""
        handles = list(dict.fromkeys(handles))
        known = [self.debug[h] for h in handles if h in self.debug]
        missing = [h if 0 <= h <= INT64_MAX else short_repr(h) for h in handles if h not in self.debug]
        return format_range(known, missing)

    def _body(self, info: DebugInfo) -> str:
        """``str(info)``, from the shared parts."""
        key = (id(info.module_hierarchy), info.method)
        prefix = self._hierarchies.get(key)
        if prefix is None or prefix[0] is not info.module_hierarchy:
            prefix = self._hierarchies[key] = (
                info.module_hierarchy,
                hierarchy_prefix(info.module_hierarchy, info.method),
            )
        traceback = self._tracebacks.get(id(info.frames))
        if traceback is None or traceback[0] is not info.frames:
            if self.cached_chars > MAX_CACHED_CHARS:
                self._tracebacks.clear()
            traceback = self._tracebacks[id(info.frames)] = (info.frames, traceback_text(info.frames))
            self.cached_chars += len(traceback[1])
        op = one_line(info.op)
        hierarchy = f"{prefix[1]}.{op}" if prefix[1] else op
        return f"  Module hierarchy:{hierarchy}\n{traceback[1]}"


_TABLES: "collections.OrderedDict[Hashable, SymbolTable]" = collections.OrderedDict()
_TABLES_LOCK = threading.Lock()


def cached_table(key: Hashable, owner: object, debug: Callable[[], Mapping[int, DebugInfo]]) -> SymbolTable:
    """The cached table of ``key`` (built from ``debug()`` when missing); ``owner`` must be alive and the same."""
    with _TABLES_LOCK:
        found = _TABLES.get(key)
        # id() keys are reused after collection: the table must belong to this very object.
        if found is not None and (owner is None or (found.owner is not None and found.owner() is owner)):
            _TABLES.move_to_end(key)
            return found
    table = SymbolTable(debug())
    table.owner = weakref.ref(owner) if owner is not None else None
    with _TABLES_LOCK:
        _TABLES[key] = table
        while len(_TABLES) > 8:
            _TABLES.popitem(last=False)
    return table
