"""Debug info per handle, and the symbolicated texts of docs/backend-contract.md#debug-handles-and-texts.

A `DebugInfo` says which op a handle stands for, where in the user's source
it came from (file, line, the expression's columns), and through which
modules and frames. It is built from the node metadata ``torch.export``
records (``stack_trace``, ``nn_module_stack``) and needs nothing else, so
the same texts can be printed offline from an archive.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import sys
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from .._quoting import visible
from . import _exec_sources, _source

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

#: A node's ``nn_module_stack`` as ``torch.export`` records it: module path -> (path, class or its name).
ModuleStack = Mapping[str, tuple[str, object]]

HERE = " <--- HERE"

# Caps on the text rendered from debug info (docs/archive-format.md, "Bounded text"). Debug
# info may come from a file, where one long source line referenced by every frame of a stack,
# or one long name repeated through a module hierarchy, deflates to nothing and would render
# to gigabytes; every cut says what it left out with "… (N more …)".
#: A frame's file name, function name, and any op, node, method, instance or class name.
MAX_NAME_CHARS = 200
#: The source line a frame shows (a window around its carets when the line is longer).
MAX_SOURCE_CHARS = 240
#: Frames of one stack: the outermost `_FRAMES_HEAD` and the innermost rest.
MAX_FRAMES = 64
_FRAMES_HEAD = 16
#: (instance, class) pairs of one module hierarchy: the outermost `_HIERARCHY_HEAD` and the innermost rest.
MAX_HIERARCHY = 32
_HIERARCHY_HEAD = 8
#: One handle's whole text, and one exception message built from debug info.
MAX_TEXT_CHARS = 64 * 1024


def clip(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text``, cut to ``limit`` characters with "… (N more characters)" where cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def one_line(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """A name or a source line from debug info, on one line and capped (`clip`).

    Debug info travels in archives: a line break or a control character in
    a file name, a node name or a source line is shown as its escape
    (``\\n``), so that no such text starts a line of its own in a runtime
    error, ``symbolicate`` or ``profile``, or passes for a line of theirs.
    """
    return clip(visible(text), limit)


_FRAME_LINE = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<name>.+?)\s*$')


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame of the model source: ``source`` is the whole line, indentation kept."""

    file: str
    line: int
    name: str
    source: str | None = None
    col: int | None = None
    end_col: int | None = None

    def render(self) -> str:
        """The frame as traceback lines, carets under the expression (whole line as fallback)."""
        head = f'  File "{one_line(self.file)}", line {self.line}, in {one_line(self.name)}'
        if not self.source or not self.source.strip():
            return head
        text = visible(self.source.strip())
        indent = len(self.source) - len(self.source.lstrip())
        if self.col is not None and self.end_col is not None and self.end_col > self.col >= indent:
            pad, width = self.col - indent, self.end_col - self.col
        else:
            pad, width = 0, len(text)
        if len(text) > MAX_SOURCE_CHARS:
            text, pad, width = _source_window(text, pad, width)
        return f"{head}\n    {text}\n    {' ' * pad}{'~' * width}{HERE}"


def _source_window(text: str, pad: int, width: int) -> tuple[str, int, int]:
    """At most `MAX_SOURCE_CHARS` of a long source line, starting near the carets, with what was cut."""
    start = max(0, min(pad - 20, len(text) - MAX_SOURCE_CHARS))
    end = start + MAX_SOURCE_CHARS
    before = f"… ({start} more) " if start else ""
    after = f" … ({len(text) - end} more characters)" if end < len(text) else ""
    pad = len(before) + pad - start
    width = max(1, min(width, end - (pad - len(before) + start)))
    return f"{before}{text[start:end]}{after}", pad, width


@dataclasses.dataclass(frozen=True)
class DebugInfo:
    """What a debug handle stands for; ``str()`` is the runtime text block of docs/backend-contract.md."""

    handle: int
    op: str
    node: str
    method: str
    #: ``(instance name, class name)`` from the top module down, e.g. ``(("top", "N"), ("m", "M"))``.
    module_hierarchy: tuple[tuple[str, str], ...]
    #: Model-source frames, outermost first; generated and torch-internal frames dropped.
    frames: tuple[Frame, ...]

    @classmethod
    def _from_row(
        cls,
        handle: int,
        op: str,
        node: str,
        method: str,
        module_hierarchy: tuple[tuple[str, str], ...],
        frames: tuple[Frame, ...],
    ) -> "DebugInfo":
        """The same object as ``DebugInfo(...)``, three times faster to make.

        The archive reader makes one per node (10,000 for a large model); the
        frozen dataclass's ``__init__`` spends most of its time in six
        ``object.__setattr__`` calls. There is no ``__post_init__`` to skip.
        """
        info = object.__new__(cls)
        info.__dict__.update(
            handle=handle, op=op, node=node, method=method, module_hierarchy=module_hierarchy, frames=frames
        )
        return info

    @property
    def file(self) -> str | None:
        return self.frames[-1].file if self.frames else None

    @property
    def line(self) -> int | None:
        return self.frames[-1].line if self.frames else None

    @property
    def col(self) -> int | None:
        return self.frames[-1].col if self.frames else None

    @property
    def end_col(self) -> int | None:
        return self.frames[-1].end_col if self.frames else None

    def hierarchy_text(self) -> str:
        """``top(N)::forward.m(M)::forward.l(L)::forward.aten::mul``."""
        prefix = hierarchy_prefix(self.module_hierarchy, self.method)
        return f"{prefix}.{one_line(self.op)}" if prefix else one_line(self.op)

    def __str__(self) -> str:
        return clip(f"  Module hierarchy:{self.hierarchy_text()}\n{traceback_text(self.frames)}", MAX_TEXT_CHARS)


def hierarchy_prefix(module_hierarchy: tuple[tuple[str, str], ...], method: str) -> str:
    """`DebugInfo.hierarchy_text` without the op: ``top(N)::forward.m(M)::forward``.

    Apart, like `traceback_text`, because many handles share it.
    """
    parts = []
    pairs = list(enumerate(module_hierarchy))
    cut = len(pairs) - MAX_HIERARCHY
    if cut > 0:
        pairs = pairs[:_HIERARCHY_HEAD] + pairs[_HIERARCHY_HEAD + cut :]
    for depth, (name, cls) in pairs:
        called = one_line(method or "forward") if depth == 0 else "forward"
        parts.append(f"{one_line(name)}({one_line(cls)})::{called}")
        if cut > 0 and depth == _HIERARCHY_HEAD - 1:
            parts.append(f"… ({cut} more)")
    return ".".join(parts)


def traceback_text(frames: tuple[Frame, ...]) -> str:
    """The ``Traceback of model source`` lines of `DebugInfo`'s text.

    Apart so that offline symbolication can format a stack that many
    handles share once.
    """
    lines = ["Traceback of model source (most recent call last):"]
    cut = len(frames) - MAX_FRAMES
    if cut > 0:
        lines.extend(frame.render() for frame in frames[:_FRAMES_HEAD])
        lines.append(f"  … ({cut} more frames)")
        lines.extend(frame.render() for frame in frames[_FRAMES_HEAD + cut :])
    else:
        lines.extend(frame.render() for frame in frames)
    if not frames:
        lines.append("  (no source recorded for this node)")
    return "\n".join(lines)


# --- the pinned texts ---------------------------------------------------------


def format_unsupported(info: DebugInfo, reason: str, *, compiler_failure: bool = False) -> str:
    """The text of `UnsupportedNodeError` (its first lines are pinned), or of `CompilerError`
    (``compiler_failure``: the backend claims the node and its compiler failed on it)."""
    said = "failed in this compiler, which claims it" if compiler_failure else "is not supported in this compiler"
    lines = [f"The node of {one_line(info.op)} {said}. Source code:"]
    if info.frames:
        lines.append(info.frames[-1].render())
        if not info.frames[-1].source:
            # Code without a file (exec'd strings): keep the frame, say which op it is.
            lines.append(f"    (no source text for this file; the node is {one_line(info.op)})")
    else:
        lines.append("  (no source recorded for this node)")
    if reason:
        lines.append(f"{'Diagnostic' if compiler_failure else 'Reason'}: {clip(reason, MAX_TEXT_CHARS)}")
    lines.append(str(info))
    lines.append(_locator(info))
    return "\n".join(lines)


def format_runtime(message: str, info: DebugInfo) -> str:
    """The text of `BackendRuntimeError`: the backend's message, then where it happened (capped)."""
    return f"{clip(message, MAX_TEXT_CHARS)}\n{info}\n{_locator(info)}"


#: Nodes of a fused kernel's range shown in full; the others are counted, so the text stays bounded.
MAX_RANGE_NODES = 32


def format_range(infos: Sequence[DebugInfo], missing: Sequence[int | str] = ()) -> str:
    """Where a fused kernel covering several nodes is in the model source: every node with its line.

    The frames all the nodes share (the outermost ones: the same module
    calls) are printed once; then each node, with its op, module hierarchy
    and the frames of its own. Each frame is `Frame.render`'s text, so a
    range reads like the one-node text. At most `MAX_RANGE_NODES` nodes are
    shown; the rest are counted by handle.
    """
    shown = list(infos[:MAX_RANGE_NODES])
    shared = _shared_frames([info.frames for info in shown])
    methods = sorted({info.method for info in shown if info.method})
    where = f" (method {methods[0]!r})" if len(methods) == 1 else ""
    total = len(infos) + len(missing)
    lines = [f"In a fused kernel covering {total} node{'s' if total != 1 else ''}{where}:"]
    if shared:
        lines.append("Model source shared by these nodes (most recent call last):")
        lines.extend(frame.render() for frame in shared)
    previous: tuple[Frame, ...] = ()
    for info in shown:
        lines.append(f"  node {info.node!r}, debug handle {info.handle}: {info.hierarchy_text()}")
        own = info.frames[len(shared) :]
        # Outer frames the node above also had (the same module call) are not repeated.
        same = len(_shared_frames([own, previous])) if previous else 0
        if same:
            lines.append(f"    (the {_outer(same)} of node above)")
        lines.extend(_indent(frame.render()) for frame in own[same:])
        if not info.frames:
            lines.append("    (no source recorded for this node)")
        previous = own
    rest = list(infos[MAX_RANGE_NODES:])
    if rest:
        handles = ", ".join(str(info.handle) for info in rest[:8]) + (", ..." if len(rest) > 8 else "")
        lines.append(f"  ... and {len(rest)} more nodes (debug handles {handles})")
    if missing:
        lines.append(format_missing(list(missing)[:8] + (["..."] if len(missing) > 8 else [])))
    return "\n".join(lines)


def _shared_frames(stacks: list[tuple[Frame, ...]]) -> tuple[Frame, ...]:
    """The outermost frames every stack has, leaving each node at least its own last frame."""
    if len(stacks) < 2 or not all(stacks):
        return ()
    limit = min(len(s) for s in stacks) - 1
    count = 0
    while count < limit and all(s[count] == stacks[0][count] for s in stacks):
        count += 1
    return stacks[0][:count]


def _outer(count: int) -> str:
    return "outer frame" if count == 1 else f"{count} outer frames"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.split("\n"))


def format_missing(handles: Iterable[int | str]) -> str:
    """The pinned text for handles that have no debug info."""
    listed = ", ".join(str(h) for h in handles)
    return f"Debug info for handle(s): debug_handles:{{{listed}}}, was not found."


def _locator(info: DebugInfo) -> str:
    where = f"method {one_line(info.method)!r}, " if info.method else ""
    return f"({where}node {one_line(info.node)!r}, debug handle {info.handle})"


# --- building debug info from torch.export metadata ---------------------------


def op_name(node: Node) -> str:
    """``aten::mul`` for an aten overload, ``higher_order::cond``, ``getitem``, or the node's op."""
    if node.op != "call_function":
        return node.op
    from .._compat import is_higher_order_op, op_schema  # a node means torch is loaded already

    target = node.target
    schema = op_schema(target)
    if schema is not None:
        return schema.name
    if is_higher_order_op(target):
        return f"higher_order::{target.name()}"
    return getattr(target, "__name__", None) or str(target)


def debug_info_for_node(
    node: Node,
    *,
    method: str,
    handle: int,
    inherited_stack: ModuleStack | None = None,
    top_class: str | None = None,
    occurrences: collections.Counter | None = None,
) -> DebugInfo:
    """Build the `DebugInfo` of one node.

    :param inherited_stack: the ``nn_module_stack`` of the node that owns
        the subgraph this node is in (``torch.cond`` branches record none).
    :param occurrences: shared across one lowering, to tell apart several
        nodes of the same op from the same line.
    """
    op = op_name(node)
    stack = node.meta.get("nn_module_stack") or inherited_stack
    hierarchy = _module_hierarchy(stack, top_class)
    frames = list(_parse_stack_trace(node.meta.get("stack_trace")))
    if method and method != "forward" and frames and frames[0].name == "forward":
        # A non-forward method is exported under the name forward (see
        # _lowering._class_exporting); show the user the method's real name.
        frames[0] = dataclasses.replace(frames[0], name=method)
    key = (op, tuple((f.file, f.line, f.name) for f in frames))
    nth = 0
    if occurrences is not None:
        nth = occurrences[key]
        occurrences[key] += 1
    return DebugInfo(
        handle=handle,
        op=op,
        node=node.name,
        method=method,
        module_hierarchy=hierarchy,
        frames=tuple(_with_columns(frames, hierarchy, op, nth)),
    )


def build_debug_infos(
    graph_module: GraphModule, handles: Mapping[Node, int], *, method: str, top_class: str
) -> dict[int, DebugInfo]:
    """`DebugInfo` for every node of ``graph_module`` and its subgraphs, by handle."""
    occurrences: collections.Counter = collections.Counter()
    infos: dict[int, DebugInfo] = {}
    for node, inherited in _nodes_with_owner_stack(graph_module, None):
        handle = handles[node]
        infos[handle] = debug_info_for_node(
            node,
            method=method,
            handle=handle,
            inherited_stack=inherited,
            top_class=top_class,
            occurrences=occurrences,
        )
    return infos


def _nodes_with_owner_stack(
    graph_module: GraphModule, inherited: ModuleStack | None
) -> Iterator[tuple[Node, ModuleStack | None]]:
    for node in graph_module.graph.nodes:
        yield node, inherited
        if node.op == "get_attr":
            sub = getattr(graph_module, str(node.target), None)
            if sub is not None and hasattr(sub, "graph"):
                yield from _nodes_with_owner_stack(sub, node.meta.get("nn_module_stack") or inherited)


def _module_hierarchy(stack: ModuleStack | None, top_class: str | None) -> tuple[tuple[str, str], ...]:
    hierarchy: list[tuple[str, str]] = [("top", top_class or "?")]
    parent = ""
    for path, cls in (stack or {}).values():
        cls_name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
        cls_name = cls_name.rsplit(".", 1)[-1]
        if path == "":
            hierarchy[0] = ("top", cls_name)
            continue
        # "m.l" under "m" is "l"; a path that does not extend the parent stays whole.
        name = path[len(parent) + 1 :] if parent and path.startswith(parent + ".") else path
        hierarchy.append((name, cls_name))
        parent = path
    return tuple(hierarchy)


def _parse_stack_trace(text: str | None) -> Iterator[Frame]:
    if not text:
        return
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = _FRAME_LINE.match(line)
        if not match:
            continue
        file = _exec_sources.user_file(match["file"])
        if _is_generated(file) or _is_torch_internal(file):
            continue
        code = None
        if i + 1 < len(lines) and not _FRAME_LINE.match(lines[i + 1]):
            code = lines[i + 1]
        lineno = int(match["line"])
        source = _source.source_line(file, lineno)
        if source is None and code is not None:
            source = code.strip()
        yield Frame(file=file, line=lineno, name=match["name"], source=source)


def _with_columns(frames: list[Frame], hierarchy: tuple[tuple[str, str], ...], op: str, nth: int) -> Iterator[Frame]:
    """Add the expression's column span to each frame whose file we can read."""
    base = op.split("::")[-1].split(".")[0]
    # Submodule attribute names, outermost first, for matching `self.m(x)`.
    module_names = [name.split(".")[-1] for name, _ in hierarchy[1:]]
    depth = 0
    for i, frame in enumerate(frames):
        innermost = i == len(frames) - 1
        callees: list[str] = []
        if innermost:
            callees = module_names[depth : depth + 1]
        else:
            callee = frames[i + 1].name
            if callee == "forward" and depth < len(module_names):
                callees = [module_names[depth]]
                depth += 1
            else:
                callees = [callee]
        span = None
        if frame.source is not None:  # linecache has notebook cells and REPL input too
            span = _source.expression_span(
                frame.file, frame.line, op=base if innermost else None, callees=callees, occurrence=nth
            )
        if span is None:
            yield frame
        else:
            yield dataclasses.replace(frame, col=span[0], end_col=span[1])


def _is_generated(file: str) -> bool:
    # FX's generated forward ("<eval_with_key>.12") and frozen stdlib modules are not the
    # user's code; "<string>" (exec), "<stdin>" and "<ipython-input-3-…>" cells are.
    return file.startswith(_GENERATED)


_GENERATED = ("<eval_with_key>", "<frozen ")


def _is_torch_internal(file: str) -> bool:
    torch = sys.modules.get("torch")
    root = getattr(torch, "__file__", None)
    if not root:
        return False
    return os.path.abspath(file).startswith(os.path.dirname(os.path.abspath(root)) + os.sep)
