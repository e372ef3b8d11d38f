"""The typed checks of data read back from JSON: one vocabulary of kinds, one wording of what is wrong.

A report, a shard's report, a check outcome from the backend host: each is
JSON that may come from elsewhere, and each field is checked against a kind
(`KINDS`) by `check_type`. The error names the field, the kind it must be and
what it holds (``tests[3].duration must be a finite number, got "1"``); the
caller adds whose file it is and the fix, in its own error type. Never
imports torch or pytest.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping, TypeVar

__all__ = ["KINDS", "InvalidField", "check_choice", "check_type", "field", "shown"]

T = TypeVar("T")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Each kind: (its test, how an error says it).
KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "string": (lambda v: isinstance(v, str), "a string"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
    "integer": (_integer, "an integer"),
    "count": (lambda v: _integer(v) and v >= 0, "a count (an integer >= 0)"),  # type: ignore[operator]
    "number": (_number, "a finite number"),
    "seconds": (lambda v: _number(v) and v >= 0, "a number of seconds >= 0"),  # type: ignore[operator]
    "list": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "an object"),
}


class InvalidField(ValueError):
    """A field that is not of its kind: ``str()`` is ``<field> must be <kind>[ or null], got <value>``."""

    def __init__(self, where: str, kind: str, value: object, optional: bool) -> None:
        self.where = where
        super().__init__(f"{where[:120]} must be {KINDS[kind][1]}{' or null' if optional else ''}, got {shown(value)}")


def shown(value: object) -> str:
    """How a wrong value looks in an error: scalars as JSON (cut), containers by their JSON type."""
    if value is None:
        return "null or nothing"
    if isinstance(value, (str, int, float, bool)):
        return json.dumps(value)[:40]
    return "an object" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__


def check_type(value: Any, kind: str, where: str, *, optional: bool = False) -> Any:
    """``value`` when it is of ``kind`` (or None and ``optional``); else `InvalidField` naming ``where``."""
    if value is None and optional:
        return None
    if not KINDS[kind][0](value):
        raise InvalidField(where, kind, value, optional)
    return value


def field(data: Mapping[str, Any], key: str, kind: str, where: str = "", *, optional: bool = False) -> Any:
    """``data[key]`` checked by `check_type` (a missing key is null); ``where`` is the path of ``data``."""
    return check_type(data.get(key), kind, f"{where}.{key}" if where else key, optional=optional)


def check_choice(value: Any, choices: tuple[str, ...], where: str) -> Any:
    """``value`` when it is one of ``choices``; else a `ValueError` naming ``where`` and the choices."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{where[:120]} is {shown(value)}, not one of {', '.join(choices)}")
    return value
