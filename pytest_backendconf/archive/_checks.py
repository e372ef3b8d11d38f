"""Strict reading helpers shared by the archive modules: the JSON parser and message pieces.

Every archive entry that holds JSON is parsed by `parse_json`, which
refuses duplicate keys, ``NaN``/``Infinity`` and out-of-range numbers, so
two readers can never disagree about what a file says.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ..errors import ArchiveManifestError

if TYPE_CHECKING:
    from typing import TypeGuard

_T = TypeVar("_T")

#: The fix every damaged-archive message ends with.
REWRITE = (
    "the file was changed or damaged after it was written; restore an intact copy, "
    "or lower the model and save it again with pytest_backendconf.save"
)
#: Deepest nesting of values, structures and JSON the archive accepts.
MAX_NESTING = 64


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (``bool`` is not one)."""
    return type(value) is int


def kind(value: object) -> str:
    """What a JSON value is, in words, for messages."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def short(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters, for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def field(mapping: dict, key: str, expected: type[_T], where: str) -> _T:
    """``mapping[key]`` if it is of type ``expected``, else an `ArchiveManifestError` naming it."""
    value = mapping.get(key)
    if not isinstance(value, expected) or (expected is int and not is_int(value)):
        words = {dict: "an object", list: "a list", str: "a string", int: "an integer"}[expected]
        raise ArchiveManifestError(f"{where}: {key} must be {words}, got {kind(value)}; {REWRITE}")
    return value


def parse_json(where: str, data: bytes) -> Any:
    """Strict JSON from UTF-8 ``data``; any problem is an `ArchiveManifestError` naming ``where``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArchiveManifestError(f"{where}: is not UTF-8 ({exc}); {REWRITE}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ArchiveManifestError(f"{where}: JSON nested too deeply; {REWRITE}") from None
    except ValueError as exc:
        raise ArchiveManifestError(f"{where}: is not valid JSON ({exc}); {REWRITE}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:30]} is out of range")
    return value
