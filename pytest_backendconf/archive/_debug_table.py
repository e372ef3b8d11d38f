"""``debug.json``: the debug info of every handle, in shared tables, and its size next to torch's.

File names, source lines and names are stored once each in tables; frames,
stacks and module hierarchies are deduplicated rows of indexes into them;
then one row per handle. The decoder shares the decoded stacks and
hierarchies between handles, which symbolication uses to format each once.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Hashable, Iterator, Mapping, NamedTuple

from ._checks import REWRITE as _REWRITE
from ._checks import is_int as _is_int
from ._checks import kind as _kind
from ._checks import short as _short
from ..debuginfo import DebugInfo, Frame
from ..errors import ArchiveManifestError

if TYPE_CHECKING:
    from torch.export import ExportedProgram

INT64_MAX = 2**63 - 1
#: Source line numbers are below this (a file of a billion lines is not a model).
MAX_LINE = 2**31


class _Table:
    """Deduplicates values into a list, by first appearance."""

    def __init__(self) -> None:
        self.index: dict[Hashable, int] = {}
        self.items: list[object] = []

    def __call__(self, value: Hashable) -> int:
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.items)
            self.items.append(list(value) if isinstance(value, tuple) else value)
        return found


def encode_debug(debug: Mapping[int, DebugInfo]) -> bytes:
    """``debug.json``: tables of files, source lines and names; frames, stacks and
    module hierarchies deduplicated; then one row per handle, in handle order:
    ``[handle - previous handle, op, node, method, hierarchy, stack]``."""
    files, lines, names = _Table(), _Table(), _Table()
    frames, stacks, hierarchies = _Table(), _Table(), _Table()
    portable = PortablePaths()
    rows = []
    previous = 0
    for handle in sorted(debug):
        info = debug[handle]
        stack = []
        for f in info.frames:
            row: tuple = (
                files(portable.relative(f.file)),
                f.line,
                names(f.name),
                -1 if f.source is None else lines(f.source),
            )
            if f.col is not None or f.end_col is not None:
                row += (f.col, f.end_col)
            stack.append(frames(row))
        hierarchy = tuple(i for pair in info.module_hierarchy for i in (names(pair[0]), names(pair[1])))
        rows.append(
            [
                handle - previous,
                names(info.op),
                names(info.node),
                names(info.method),
                hierarchies(hierarchy),
                stacks(tuple(stack)),
            ]
        )
        previous = handle
    document = {
        "files": files.items,
        "lines": lines.items,
        "names": names.items,
        "frames": frames.items,
        "stacks": stacks.items,
        "hierarchies": hierarchies.items,
        "nodes": rows,
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def decode_debug(document: object, where: str, methods: set[str]) -> dict[int, DebugInfo]:
    def bad(what: str) -> ArchiveManifestError:
        return ArchiveManifestError(f"{where}: {what}; {_REWRITE}")

    if not isinstance(document, dict):
        raise bad(f"must be a JSON object, got {_kind(document)}")
    tables = {}
    for key in ("files", "lines", "names", "frames", "stacks", "hierarchies", "nodes"):
        value = document.get(key)
        if not isinstance(value, list):
            raise bad(f"{key} must be a list, got {_kind(value)}")
        tables[key] = value
    for key in ("files", "lines", "names"):
        for i, s in enumerate(tables[key]):
            if not isinstance(s, str):
                raise bad(f"{key}[{i}] must be a string, got {_kind(s)}")
    files, lines, names = tables["files"], tables["lines"], tables["names"]
    portable = PortablePaths()
    files = [portable.absolute(f) for f in files]

    def index(value: object, table: list, what: str, optional: bool = False) -> Any:
        if optional and value == -1 and _is_int(value):
            return None
        if not _is_int(value) or not 0 <= value < len(table):
            raise bad(f"{what} refers to {_short(value)}, outside its table of {len(table)}")
        return table[value]

    frames = []
    for i, row in enumerate(tables["frames"]):
        what = f"frames[{i}]"
        if not isinstance(row, list) or len(row) not in (4, 6):
            raise bad(f"{what} must be [file, line, name, source(, col, end_col)], got {_short(row)}")
        if not _is_int(row[1]) or not 0 <= row[1] < MAX_LINE:
            raise bad(f"{what} has line {_short(row[1])}; lines are integers from 0 to {MAX_LINE - 1}")
        source = index(row[3], lines, f"{what} source", optional=True)
        col = end_col = None
        if len(row) == 6:
            col, end_col = row[4], row[5]
            # Carets are drawn under the source line: a column past its end is a lie, and
            # an unbounded one would make symbolication allocate at will.
            width = len(source) if source is not None else 0
            for v in (col, end_col):
                if v is not None and (not _is_int(v) or not 0 <= v <= width):
                    raise bad(f"{what} has column {_short(v)}, outside its source line of {width} characters")
            if col is not None and end_col is not None and end_col < col:
                raise bad(f"{what} has end column {end_col} before its column {col}")
        frames.append(
            Frame(
                file=index(row[0], files, f"{what} file"),
                line=row[1],
                name=index(row[2], names, f"{what} name"),
                source=source,
                col=col,
                end_col=end_col,
            )
        )
    stacks = []
    n_frames = len(frames)
    for i, row in enumerate(tables["stacks"]):
        if not isinstance(row, list):
            raise bad(f"stacks[{i}] must be a list, got {_kind(row)}")
        if all(type(f) is int and 0 <= f < n_frames for f in row):
            stacks.append(tuple([frames[f] for f in row]))
        else:
            stacks.append(tuple(index(f, frames, f"stacks[{i}]") for f in row))
    hierarchies = []
    n_names = len(names)
    for i, row in enumerate(tables["hierarchies"]):
        if not isinstance(row, list) or len(row) % 2:
            raise bad(f"hierarchies[{i}] must be a list of (name, class) index pairs, got {_short(row)}")
        if all(type(v) is int and 0 <= v < n_names for v in row):
            items = [names[v] for v in row]
        else:
            items = [index(v, names, f"hierarchies[{i}]") for v in row]
        hierarchies.append(tuple(zip(items[::2], items[1::2])))
    debug: dict[int, DebugInfo] = {}
    handle = 0
    n_hierarchies, n_stacks = len(hierarchies), len(stacks)
    # One row per node, so the checks of a well-formed row are inline; a row
    # that fails any of them goes through index() for the error naming it.
    for i, row in enumerate(tables["nodes"]):
        if not isinstance(row, list) or len(row) != 6:
            raise bad(f"nodes[{i}] must be [handle delta, op, node, method, hierarchy, stack], got {_short(row)}")
        delta, op, node, method, hierarchy, stack = row
        if type(delta) is not int or delta < (0 if i == 0 else 1) or handle + delta > INT64_MAX:
            raise bad(f"nodes[{i}] has handle delta {_short(delta)}; handles must increase and fit int64")
        handle += delta
        if not (
            type(op) is int
            and 0 <= op < n_names
            and type(node) is int
            and 0 <= node < n_names
            and type(method) is int
            and 0 <= method < n_names
            and type(hierarchy) is int
            and 0 <= hierarchy < n_hierarchies
            and type(stack) is int
            and 0 <= stack < n_stacks
            and names[method] in methods
        ):
            what = f"nodes[{i}]"
            name = index(method, names, f"{what} method")
            if name not in methods:
                raise bad(f"{what} names method {name!r}, which the manifest does not list")
            index(op, names, f"{what} op")
            index(node, names, f"{what} node")
            index(hierarchy, hierarchies, f"{what} hierarchy")
            index(stack, stacks, f"{what} stack")
        debug[handle] = DebugInfo._from_row(
            handle, names[op], names[node], names[method], hierarchies[hierarchy], stacks[stack]
        )
    return debug


class DebugInfoSizes(NamedTuple):
    """Sizes for the debug-info size target (debug info ≤ 1/3 of torch's stack traces)."""

    #: Bytes ``debug.json`` occupies in the archive (deflated).
    debug_bytes: int
    #: Bytes of the ``stack_trace`` strings ``torch.export.save`` stores for the same programs.
    torch_stack_trace_bytes: int
    #: Bytes of ``debug.json`` uncompressed.
    debug_uncompressed_bytes: int

    @property
    def ratio(self) -> float:
        """``debug_bytes / torch_stack_trace_bytes`` (the target is ≤ 1/3)."""
        return self.debug_bytes / self.torch_stack_trace_bytes if self.torch_stack_trace_bytes else math.inf


def torch_stack_trace_bytes(program: ExportedProgram) -> int:
    """UTF-8 bytes of the ``stack_trace`` strings ``torch.export.save`` stores for ``program``."""
    import zipfile

    import torch

    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    total, found = 0, False
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as z:
        for info in z.infolist():
            if not info.filename.endswith(".json"):
                continue
            try:
                document = json.loads(z.read(info))
            except ValueError:
                continue
            for text in _values_of(document, "stack_trace"):
                found = True
                total += len(text.encode("utf-8"))
    if found:
        return total
    return sum(
        len((node.meta.get("stack_trace") or "").encode("utf-8"))
        for module in program.graph_module.modules()
        if hasattr(module, "graph")
        for node in module.graph.nodes
    )


def _values_of(document: object, key: str) -> Iterator[str]:
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if k == key and isinstance(v, str):
                    yield v
                else:
                    stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)


class _LoadedModules:
    """The stored path of each loaded module's file, kept in step with ``sys.modules``.

    Mapping a source file to its module used to walk every loaded module on
    every save: about 2,300 once torch is imported, two path calls each,
    most of a small archive's save time. This index reads each module once.
    `sync` sees in O(1) whether ``sys.modules`` changed (its length, and its
    last entry: a new entry always goes last), reads only the entries added
    since, and starts over when one was removed or imported again; a lookup
    checks that the module it found is still loaded under its name. The
    result is what walking ``sys.modules`` in order gives, the first module
    of a file winning, with one exception: a module put in place of another
    under the same name (``sys.modules[name] = other``, nothing else
    imported or removed) is seen when the other's file is next looked up,
    not before.
    """

    def __init__(self) -> None:
        #: ``{name: module}`` as indexed, in ``sys.modules`` order.
        self._seen: dict[str, ModuleType] = {}
        self._last: tuple[str | None, ModuleType | None] = (None, None)
        #: ``{absolute file: (stored path, module name, module)}``, by first appearance.
        self._files: dict[str, tuple[str, str, ModuleType]] = {}
        #: ``{stored path: absolute file}``, the first file stored under that path.
        self._stored: dict[str, str] = {}
        self._lock = threading.RLock()

    def stored_path(self, file: str) -> str | None:
        """The stored path of the loaded module whose file is ``file`` (absolute), if any."""
        with self._lock:
            found = self._files.get(file)
            if found is not None and sys.modules.get(found[1]) is not found[2]:
                self._rebuild()  # replaced under its name since it was indexed
                found = self._files.get(file)
            return found[0] if found else None

    def file_of(self, stored: str) -> str | None:
        """The absolute file of the loaded module stored as ``stored``, if any."""
        with self._lock:
            file = self._stored.get(stored)
            if file is not None and self.stored_path(file) != stored:
                file = self._stored.get(stored)
            return file

    def sync(self) -> None:
        """Bring the index up to date with ``sys.modules``."""
        with self._lock:
            modules, seen = sys.modules, self._seen
            try:
                last = next(reversed(modules))
                if len(modules) == len(seen) and last == self._last[0] and modules[last] is self._last[1]:
                    return
                added: list[tuple[str, ModuleType]] = []
                for name in reversed(modules):  # what was added since is at the end: dicts keep order
                    module = modules[name]
                    if seen.get(name, _MISSING) is module:
                        break
                    added.append((name, module))
            except (RuntimeError, KeyError, StopIteration):  # empty, or changed under us by another thread
                self._rebuild()
                return
            if len(modules) != len(seen) + len(added) or any(name in seen for name, _ in added):
                self._rebuild()  # something was removed or imported again
                return
            for name, module in reversed(added):
                self._add(name, module)

    def _rebuild(self) -> None:
        self._seen, self._files, self._stored = {}, {}, {}
        for name, module in list(sys.modules.items()):
            self._add(name, module)

    def _add(self, name: str, module: ModuleType) -> None:
        self._seen[name] = module
        self._last = (name, module)
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.endswith(".py") and name != "__main__":
            absolute = os.path.abspath(file)
            if absolute not in self._files:
                parts = name.split(".")
                base = os.path.basename(file)
                stored = "/".join(parts + [base] if base == "__init__.py" else parts[:-1] + [base])
                self._files[absolute] = (stored, name, module)
                self._stored.setdefault(stored, absolute)


_MISSING = object()
_LOADED = _LoadedModules()


class PortablePaths:
    """Source paths as the archive stores them: relative to the import root, as a module path is.

    A file of an imported module is stored as its module's path
    (``pytest_backendconf/conformance/zoo.py`` for the module
    ``pytest_backendconf.conformance.zoo``), whatever the installation; any
    other file relative to the deepest ``sys.path`` entry holding it, else
    by its name. The same code checked out elsewhere gives the same
    archive, and the build machine's layout stays out of it. Reading
    resolves a stored path against this process's loaded modules and
    ``sys.path`` (nothing is imported), so tracebacks point at the local
    file when there is one; otherwise they show the stored path.
    """

    def __init__(self) -> None:
        self._roots: list[str] | None = None
        self._synced = False
        self._cache: dict[str, str] = {}

    @property
    def roots(self) -> list[str]:
        if self._roots is None:
            roots: list[str] = []
            for entry in sys.path:
                root = os.path.abspath(entry or os.curdir)
                if root not in roots and os.path.isdir(root):
                    roots.append(root)
            self._roots = roots
        return self._roots

    def _loaded(self) -> _LoadedModules:
        # sys.modules as at this writer's first use, as a walk of it then would give.
        if not self._synced:
            _LOADED.sync()
            self._synced = True
        return _LOADED

    def relative(self, file: str) -> str:
        found = self._cache.get(file)
        if found is None:
            found = file
            if os.path.isabs(file):
                found = self._loaded().stored_path(file) or self._under_root(file) or os.path.basename(file)
            self._cache[file] = found
        return found

    def _under_root(self, file: str) -> str | None:
        # The deepest root holding the file: "pkg/model.py", as the module pkg.model is found.
        under = [os.path.relpath(file, r) for r in self.roots if file.startswith(r.rstrip(os.sep) + os.sep)]
        return min(under, key=len).replace(os.sep, "/") if under else None

    def absolute(self, stored: str) -> str:
        if os.path.isabs(stored) or stored.startswith("<") or ".." in stored.split("/"):
            return stored
        found = self._loaded().file_of(stored)
        if found is not None:
            return found
        for root in self.roots:
            candidate = os.path.join(root, *stored.split("/"))
            if os.path.isfile(candidate) and self.relative(candidate) == stored:
                return candidate
        return stored
