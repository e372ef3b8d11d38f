"""The structure of a method's inputs and outputs: the archive's own small JSON format.

A lowered method takes and returns nested values whose leaves are the flat
inputs and outputs the backend sees. The archive records that nesting as
JSON (docs/archive-format.md, "Structures")::

    "leaf"                                    one flat input or output
    "none"                                    None (no flat value)
    {"tuple": [s, ...]}                       a tuple
    {"list": [s, ...]}                        a list
    {"dict": [[key, s], ...]}                 a dict; keys are JSON scalars
    {"namedtuple": {"name": n, "fields": [f, ...], "items": [s, ...]}}

A named tuple is kept by its name and field names only: the reader builds
a fresh ``collections.namedtuple`` with them and never looks a class up.
`check` reads a structure strictly; `flatten` and `rebuilder` are what the
lowered module uses at call time, without torch's pytree. Archives of
schema 1.0 stored torch's ``treespec_dumps`` strings instead;
`from_treespec_1_0` reads the forms they can hold without importing
anything, and refuses the rest.
"""

from __future__ import annotations

import collections
import keyword
import math
import operator
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, cast

from ._checks import MAX_NESTING, parse_json, short
from ..errors import ArchiveManifestError

if TYPE_CHECKING:
    from typing import TypeGuard

    from .._compat import TreeSpec

LEAF = "leaf"
NONE = "none"
#: Most nodes a structure may have; far more than any real signature.
MAX_NODES = 100_000
_INT64 = 2**63


class StructureError(ValueError):
    """A structure is malformed; the text says where in it."""


# --- reading -----------------------------------------------------------------------------


def check(structure: object) -> int:
    """Verify ``structure`` strictly and return its number of leaves; `StructureError` if malformed."""
    budget = [MAX_NODES]
    return _check(structure, "structure", 0, budget)


def _check(node: object, path: str, depth: int, budget: list[int]) -> int:
    budget[0] -= 1
    if budget[0] < 0:
        raise StructureError(f"structure has more than {MAX_NODES} nodes")
    if depth > MAX_NESTING:
        raise StructureError(f"{path} is nested more than {MAX_NESTING} levels deep")
    if node == LEAF and type(node) is str:
        return 1
    if node == NONE and type(node) is str:
        return 0
    if not isinstance(node, dict) or len(node) != 1:
        raise StructureError(f"{path} is {short(node)}, not a structure node")
    ((tag, body),) = node.items()
    if tag in ("tuple", "list"):
        if not isinstance(body, list):
            raise StructureError(f"{path}.{tag} must be a list, got {short(body)}")
        return sum(_check(child, f"{path}.{tag}[{i}]", depth + 1, budget) for i, child in enumerate(body))
    if tag == "dict":
        if not isinstance(body, list):
            raise StructureError(f"{path}.dict must be a list of [key, structure] pairs, got {short(body)}")
        seen: set = set()
        total = 0
        for i, item in enumerate(body):
            if not isinstance(item, list) or len(item) != 2:
                raise StructureError(f"{path}.dict[{i}] must be a [key, structure] pair, got {short(item)}")
            key = item[0]
            _check_key(key, f"{path}.dict[{i}]")
            # As in a Python dict, 1, 1.0 and True are one key.
            if key in seen:
                raise StructureError(f"{path}.dict[{i}] repeats the key {key!r}")
            seen.add(key)
            total += _check(item[1], f"{path}[{key!r}]", depth + 1, budget)
        return total
    if tag == "namedtuple":
        if not isinstance(body, dict) or set(body) != {"name", "fields", "items"}:
            raise StructureError(f"{path}.namedtuple must be an object with name, fields and items, got {short(body)}")
        name, fields, items = body["name"], body["fields"], body["items"]
        if not _is_identifier(name):
            raise StructureError(f"{path}.namedtuple name {short(name)} is not a Python identifier")
        if (
            not isinstance(fields, list)
            or not all(_is_identifier(f) and not f.startswith("_") for f in fields)
            or len(set(fields)) != len(fields)
        ):
            raise StructureError(
                f"{path}.namedtuple fields {short(fields)} must be distinct identifiers not starting with '_'"
            )
        if not isinstance(items, list) or len(items) != len(fields):
            raise StructureError(f"{path}.namedtuple items must be a list of {len(fields)} structures")
        return sum(_check(child, f"{path}.{f}", depth + 1, budget) for f, child in zip(fields, items))
    raise StructureError(f"{path} has the unknown kind {short(tag)}")


def _check_key(key: object, path: str) -> None:
    if key is None or type(key) in (str, bool):
        return
    if type(key) is int and -_INT64 <= key < _INT64:
        return
    if type(key) is float and math.isfinite(key):
        return
    raise StructureError(
        f"{path} has key {short(key)}; keys are strings, int64 integers, finite floats, booleans or null"
    )


def _is_identifier(value: object) -> TypeGuard[str]:
    return type(value) is str and value.isidentifier() and not keyword.iskeyword(value)


# --- describing, for messages -----------------------------------------------------------


def describe(structure: Any, limit: int = 300) -> str:
    """A short Python-like picture of ``structure``: ``*`` for each leaf."""
    text = _describe(structure)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(node: Any) -> str:
    if node == LEAF:
        return "*"
    if node == NONE:
        return "None"
    ((tag, body),) = node.items()
    if tag == "tuple":
        inner = ", ".join(_describe(c) for c in body)
        return f"({inner},)" if len(body) == 1 else f"({inner})"
    if tag == "list":
        return "[" + ", ".join(_describe(c) for c in body) + "]"
    if tag == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe(c)}" for k, c in body) + "}"
    return f"{body['name']}(" + ", ".join(f"{f}={_describe(c)}" for f, c in zip(body["fields"], body["items"])) + ")"


def describe_value(value: object, depth: int = 0) -> str:
    """The same picture for a call's actual value (anything that is not a container is a leaf)."""
    if depth > MAX_NESTING:
        return "..."
    kind = type(value)
    if value is None:
        return "None"
    if type(value) is tuple:
        inner = ", ".join(describe_value(v, depth + 1) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if type(value) is list:
        return "[" + ", ".join(describe_value(v, depth + 1) for v in value) + "]"
    if type(value) is dict:
        return "{" + ", ".join(f"{k!r}: {describe_value(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple) and hasattr(kind, "_fields"):
        return (
            f"{kind.__name__}("
            + ", ".join(f"{f}={describe_value(v, depth + 1)}" for f, v in zip(kind._fields, value))
            + ")"
        )
    return "*"


# --- using, at call time -------------------------------------------------------------------


def flatten(structure: Any, value: object) -> list | None:
    """The leaves of ``value`` in ``structure``'s order, or ``None`` if ``value`` is not shaped like it."""
    out: list = []
    return out if _flatten(structure, value, out) else None


def _flatten(node: Any, value: object, out: list) -> bool:
    if node == LEAF:
        out.append(value)
        return True
    if node == NONE:
        return value is None
    ((tag, body),) = node.items()
    if tag == "tuple" or tag == "list":
        if (
            not isinstance(value, (tuple, list))
            or type(value) is not (tuple if tag == "tuple" else list)
            or len(value) != len(body)
        ):
            return False
        return all(_flatten(c, v, out) for c, v in zip(body, value))
    if tag == "dict":
        if type(value) is not dict or len(value) != len(body):
            return False
        for key, child in body:
            if key not in value or not _flatten(child, value[key], out):
                return False
        return True
    fields = tuple(body["fields"])
    if not isinstance(value, tuple) or getattr(type(value), "_fields", None) != fields:
        return False
    return all(_flatten(c, v, out) for c, v in zip(body["items"], value))


def rebuilder(structure: Any) -> Callable[[Sequence[object]], object]:
    """A function from the flat outputs to ``structure`` filled with them.

    A single leaf, and a flat tuple, list or dict of leaves, are rebuilt
    directly (the common cases, one call each); anything else by a walk.
    """
    if structure == LEAF:
        return operator.itemgetter(0)
    if structure == NONE:
        return lambda outputs: None
    ((tag, body),) = structure.items()
    flat = tag != "namedtuple" and all((c if tag != "dict" else c[1]) == LEAF for c in body)
    if flat and tag == "tuple":
        return tuple
    if flat and tag == "list":
        return list
    if flat and tag == "dict":
        keys = tuple(k for k, _ in body)
        return lambda outputs: dict(zip(keys, outputs))
    classes: dict[int, type] = {}
    _make_classes(structure, classes)
    return lambda outputs: _build(structure, iter(outputs), classes)


def _make_classes(node: Any, classes: dict[int, type]) -> None:
    if not isinstance(node, dict):
        return
    ((tag, body),) = node.items()
    if tag == "namedtuple":
        classes[id(body)] = collections.namedtuple(body["name"], body["fields"])
        children = body["items"]
    elif tag == "dict":
        children = [c for _, c in body]
    else:
        children = body
    for child in children:
        _make_classes(child, classes)


def _build(node: Any, leaves: Iterator[object], classes: dict[int, type]) -> object:
    if node == LEAF:
        return next(leaves)
    if node == NONE:
        return None
    ((tag, body),) = node.items()
    if tag == "tuple":
        return tuple(_build(c, leaves, classes) for c in body)
    if tag == "list":
        return [_build(c, leaves, classes) for c in body]
    if tag == "dict":
        return {k: _build(c, leaves, classes) for k, c in body}
    return classes[id(body)](*(_build(c, leaves, classes) for c in body["items"]))


# --- writing, from torch.export's call spec --------------------------------------------------


def from_treespec(spec: TreeSpec, what: str) -> object:
    """The structure of a torch pytree ``TreeSpec`` (through `_compat`); `StructureError` names what cannot be stored."""
    from .._compat import treespec_node

    def convert(node: TreeSpec, path: str, depth: int) -> object:
        if depth > MAX_NESTING:
            raise StructureError(f"{what} is nested more than {MAX_NESTING} levels deep")
        kind, context, children = treespec_node(node)
        if kind is None:
            return LEAF
        if kind is type(None):
            return NONE
        if kind is tuple or kind is list:
            return {kind.__name__: [convert(c, f"{path}[{i}]", depth + 1) for i, c in enumerate(children)]}
        if kind is dict:
            items = []
            for key, child in zip(cast("list[object]", context), children):  # a dict's context: its keys
                _check_key(key, f"{what} at {path}")
                items.append([key, convert(child, f"{path}[{key!r}]", depth + 1)])
            return {"dict": items}
        fields = getattr(kind, "_fields", None)
        if isinstance(kind, type) and issubclass(kind, tuple) and isinstance(fields, tuple):
            record = {
                "namedtuple": {
                    "name": kind.__name__,
                    "fields": list(fields),
                    "items": [convert(c, f"{path}.{f}", depth + 1) for f, c in zip(fields, children)],
                }
            }
            _check(record, path, 0, [MAX_NODES])
            return record
        raise StructureError(
            f"{what} holds a {getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)} at "
            f"{path}, which an archive cannot record; use tuples, lists, dicts with string or number "
            "keys, or named tuples"
        )

    return convert(spec, "the top level", 0)


# --- archives of schema 1.0: torch's treespec_dumps strings -------------------------------------

#: The node types of 1.0 strings read here. Anything else (OrderedDict,
#: defaultdict, deque, named tuples, torch.Size, types registered by user
#: code, enum keys) would need a type looked up by name: refused.
_OLD_TYPES = {"builtins.tuple": "tuple", "builtins.list": "list", "builtins.dict": "dict"}


def from_treespec_1_0(text: object) -> object:
    """The structure of a ``treespec_dumps`` string of a schema 1.0 archive; `StructureError` otherwise.

    Only JSON is parsed; no module is imported and no name is looked up.
    """
    if not isinstance(text, str):
        raise StructureError(f"is {short(text)}, not a treespec string")
    try:
        document = parse_json("treespec", text.encode("utf-8", "surrogatepass"))
    except ArchiveManifestError as exc:
        raise StructureError(f"is not JSON ({str(exc).split(';')[0]})") from None
    if not isinstance(document, list) or len(document) != 2 or document[0] != 1 or type(document[0]) is not int:
        raise StructureError(f"is not a protocol-1 treespec ([1, node]), got {short(document)}")
    budget = [MAX_NODES]
    return _old_node(document[1], "treespec", 0, budget)


def _old_node(node: Any, path: str, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise StructureError(f"has more than {MAX_NODES} nodes")
    if depth > MAX_NESTING:
        raise StructureError(f"{path} is nested more than {MAX_NESTING} levels deep")
    if not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"}:
        raise StructureError(f"{path} is {short(node)}, not a treespec node (type, context, children_spec)")
    kind, context, children = node["type"], node["context"], node["children_spec"]
    if not isinstance(children, list):
        raise StructureError(f"{path}.children_spec must be a list, got {short(children)}")
    if kind is None:
        if context is not None or children:
            raise StructureError(f"{path} is a leaf with a context or children")
        return LEAF
    tag = _OLD_TYPES.get(kind) if isinstance(kind, str) else None
    if tag is None:
        raise StructureError(
            f"{path} has type {short(kind)}, which this release does not read from schema 1.0 archives "
            "(reading it would mean looking up code by name); re-lower the model and save it with this release"
        )
    items = [_old_node(c, f"{path}.children_spec[{i}]", depth + 1, budget) for i, c in enumerate(children)]
    if tag in ("tuple", "list"):
        if context != "null":
            raise StructureError(f'{path} is a {tag} with context {short(context)} (expected "null")')
        return {tag: items}
    if not isinstance(context, str):
        raise StructureError(f"{path} is a dict whose context {short(context)} is not a JSON string")
    try:
        keys = parse_json("context", context.encode("utf-8", "surrogatepass"))
    except ArchiveManifestError as exc:
        raise StructureError(f"{path} has a dict context that is not JSON ({str(exc).split(';')[0]})") from None
    if not isinstance(keys, list) or len(keys) != len(items):
        raise StructureError(f"{path} is a dict of {len(items)} children whose keys are {short(keys)}")
    pairs = []
    for i, key in enumerate(keys):
        # An object key is an enum ({"__enum__": ...}, looked up by module name) or worse: refused.
        _check_key(key, f"{path} key {i}")
        pairs.append([key, items[i]])
    structure = {"dict": pairs}
    _check(structure, path, 0, [MAX_NODES])  # repeated keys
    return structure
