"""Find the column span of the expression that produced a graph node.

``torch.export`` records file and line for each frame, not columns. The
carets of docs/backend-contract.md#debug-handles-and-texts need the exact sub-expression, so we parse the
user's file and pick, on that line, the expression that matches the op
(``x * h`` for ``aten::mul``) or the call into the next frame
(``self.m(x)`` for a submodule's ``forward``). When a line holds several
candidates, the n-th node of that op on that line takes the n-th candidate
in evaluation order. No match, no carets under a sub-expression: the whole
line is the fallback.
"""

from __future__ import annotations

import ast
import linecache
from typing import Iterable

# aten op base name -> the Python syntax that produces it.
_BINARY = {
    "add": ast.Add,
    "sub": ast.Sub,
    "rsub": ast.Sub,
    "mul": ast.Mult,
    "div": ast.Div,
    "true_divide": ast.Div,
    "floor_divide": ast.FloorDiv,
    "remainder": ast.Mod,
    "fmod": ast.Mod,
    "pow": ast.Pow,
    "matmul": ast.MatMult,
    "bitwise_and": ast.BitAnd,
    "bitwise_or": ast.BitOr,
    "bitwise_xor": ast.BitXor,
    "__lshift__": ast.LShift,
    "__rshift__": ast.RShift,
    "logical_and": ast.BitAnd,
    "logical_or": ast.BitOr,
}
_COMPARE = {"eq": ast.Eq, "ne": ast.NotEq, "lt": ast.Lt, "le": ast.LtE, "gt": ast.Gt, "ge": ast.GtE}
_UNARY = {"neg": ast.USub, "bitwise_not": ast.Invert, "logical_not": ast.Invert}
_SUBSCRIPT = {"select", "slice", "index", "getitem"}
# Ops whose Python spelling differs from the aten name.
_CALL_ALIASES = {
    "mm": {"mm", "matmul"},
    "bmm": {"bmm", "matmul"},
    "addmm": {"addmm", "linear"},
    "view": {"view", "reshape", "flatten"},
    "_to_copy": {"to", "float", "half", "double", "long", "int", "bool", "type"},
    "expand": {"expand", "expand_as"},
    "clamp": {"clamp", "clip"},
    "amax": {"amax", "max"},
    "amin": {"amin", "min"},
    "cond": {"cond"},
    "t": {"t", "T"},
}


def expression_span(
    file: str, line: int, *, op: str | None, callees: Iterable[str], occurrence: int
) -> tuple[int, int] | None:
    """``(col, end_col)`` (0-based characters) of the expression on ``file:line``.

    :param op: the aten op base name (``"mul"``) when this frame produced
        the node itself, ``None`` for a frame that calls further down.
    :param callees: names the call into the next frame may use: a function
        name, or a submodule attribute for a module's ``forward``.
    :param occurrence: how many earlier nodes with the same op and stack
        came from this line; picks among several candidates.
    """
    candidates: list[ast.AST] = _by_op(file, line, op) if op else []
    callees = set(callees)
    if not candidates and callees:
        candidates = [n for n in _calls(file, line) if _callee_name(n.func) in callees]
    if not candidates:
        calls = _calls(file, line)
        candidates = [*calls] if len(calls) == 1 else []
    if not candidates:
        return None
    chosen = candidates[occurrence % len(candidates)]
    return _char_columns(file, line, chosen)


def source_line(file: str, line: int) -> str | None:
    """The text of ``file:line`` without its line break, or ``None`` if unreadable."""
    text = linecache.getline(file, line)
    return text.rstrip("\r\n") if text else None


def _by_op(file: str, line: int, op: str) -> list[ast.AST]:
    nodes = _single_line_nodes(file, line)
    found: list[ast.AST]
    if op in _BINARY:
        found = [n for n in nodes if isinstance(n, ast.BinOp) and isinstance(n.op, _BINARY[op])]
        if op.startswith("logical_") or not found:
            found += [n for n in nodes if isinstance(n, ast.Call) and _callee_name(n.func) == op]
        return found
    if op in _COMPARE:
        return [
            n for n in nodes if isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], _COMPARE[op])
        ] or [n for n in nodes if isinstance(n, ast.Call) and _callee_name(n.func) == op]
    if op in _UNARY:
        found = [n for n in nodes if isinstance(n, ast.UnaryOp) and isinstance(n.op, _UNARY[op])]
        if found:
            return found
    if op in _SUBSCRIPT:
        found = [n for n in nodes if isinstance(n, ast.Subscript)]
        if found:
            return found
    # aten::special_erfcx is spelled torch.special.erfcx; aten::relu_ is x.relu_().
    names = _CALL_ALIASES.get(op, set()) | {op, op.rstrip("_"), op.lstrip("_"), op.removeprefix("special_")}
    return [n for n in nodes if isinstance(n, ast.Call) and _callee_name(n.func) in names]


def _calls(file: str, line: int) -> list[ast.Call]:
    return [n for n in _single_line_nodes(file, line) if isinstance(n, ast.Call)]


def _callee_name(func: ast.AST) -> str | None:
    """The last name of a call's target: ``self.m`` → ``m``, ``self.layers[0]`` → ``layers``."""
    while isinstance(func, ast.Subscript):
        func = func.value
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _single_line_nodes(file: str, line: int) -> list[ast.AST]:
    return _nodes_by_line(file).get(line, [])


def _nodes_by_line(file: str) -> dict[int, list[ast.AST]]:
    """Expression nodes that start and end on one line, in evaluation order."""
    lines = linecache.getlines(file)
    if not lines:
        return {}
    # Keyed by the very list linecache holds, not by the name alone: a re-run notebook
    # cell or another exec'd "<string>" registers new lines under the same name.
    found = _PARSED.get(file)
    if found is not None and found[0] is lines:
        return found[1]
    by_line = _parse("".join(lines), file)
    if len(_PARSED) >= 256:
        _PARSED.pop(next(iter(_PARSED)))
    _PARSED[file] = (lines, by_line)
    return by_line


_PARSED: dict[str, tuple[list[str], dict[int, list[ast.AST]]]] = {}


def _parse(text: str, file: str) -> dict[int, list[ast.AST]]:
    try:
        tree = ast.parse(text, filename=file)
    except (SyntaxError, ValueError):
        return {}
    by_line: dict[int, list[ast.AST]] = {}
    for node in _post_order(tree):
        if isinstance(node, ast.expr) and getattr(node, "end_lineno", None) == node.lineno:
            by_line.setdefault(node.lineno, []).append(node)
    return by_line


def _post_order(node: ast.AST) -> Iterable[ast.AST]:
    # Children before parents, left to right: the order Python evaluates them.
    for child in ast.iter_child_nodes(node):
        yield from _post_order(child)
    yield node


def _char_columns(file: str, line: int, node: ast.AST) -> tuple[int, int] | None:
    # ast columns count UTF-8 bytes; carets are drawn under characters.
    text = linecache.getline(file, line)
    raw = text.encode("utf-8")
    start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    if end is None or end > len(raw):
        return None
    return len(raw[:start].decode("utf-8", "replace")), len(raw[:end].decode("utf-8", "replace"))
