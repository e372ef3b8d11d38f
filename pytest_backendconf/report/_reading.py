"""Reading a report JSON someone else wrote: bounded nesting, and every field the page prints checked.

A report is a file CI passes around, so whatever it holds is treated as
data from outside: JSON nested deeper than any report is refused before it
is parsed (Python's parser would recurse once per level), and the fields
the HTML page and ``report ops`` print are checked for their type, numbers
as numbers, with an error naming the field. Never imports torch.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from ._report import OUTCOMES
from ..errors import ReportError

#: How deep a JSON document (a report, an ``--inputs`` file) may nest: a report is six levels deep,
#: an ``--inputs`` tensor one level per dimension.
MAX_JSON_DEPTH = 64
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of a JSON text nest (strings skipped); linear in its length."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub("", text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def load_json(text: str, what: str, fix: str, error: type[Exception] = ReportError) -> Any:
    """``json.loads(text)``, refusing a document nested deeper than `MAX_JSON_DEPTH` first.

    :param what: the file as the error names it (``report 'r.json'``).
    :param fix: what to pass instead, for the error.
    """
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{what} nests {depth} levels deep; at most {MAX_JSON_DEPTH} are read. {fix}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise error(f"{what} is not valid JSON ({exc}); {fix}") from None


# --- the fields the page prints ---------------------------------------------------------------

#: Objects of the report (null allowed) and, in each, the fields that must be strings, counts or numbers.
_SECTIONS: dict[str, dict[str, str]] = {
    "backend": {
        "name": "string",
        "version": "string",
        "source": "string",
        "available": "boolean",
        "unavailable_reason": "string",
    },
    "environment": {
        "torch": "string",
        "python": "string",
        "python_implementation": "string",
        "machine": "string",
        "platform": "string",
    },
    "hypothesis": {"profile": "string", "seed": "integer", "derandomized": "boolean"},
    "run": {
        "started": "string",
        "duration": "number",
        "exit_status": "integer",
        "xdist_workers": "count",
        "select": "list",
        "target": "object",
    },
    "known_failures": {"file": "string", "entries": "count", "stale": "list"},
    "errors": {"total": "count", "by_type": "object", "by_stage": "object"},
    "ops": {"dtypes": "list", "overloads": "object"},
    "delegation": {},
}
#: The fields of each ``tests[]`` entry (id, category and outcome are checked by `parse_report`).
_TEST_FIELDS = {
    "case": "string",
    "stage": "string",
    "reason": "string",
    "reproduce": "string",
    "error": "object",
    "known_failure": "object",
    "details": "object",
}
_ERROR_FIELDS = {"type": "string", "module": "string", "message": "string"}
#: ``run.target``: the device a target command reached (`target.probe`).
_TARGET_FIELDS = {
    "command": "string",
    "machine": "string",
    "python": "string",
    "torch": "string",
    "pytest_backendconf": "string",
    "backends": "object",
    "connect_seconds": "number",
    "round_trip_ms": "number",
}
_KNOWN_FIELDS = {"pattern": "string", "reason": "string", "link": "string"}


def check_page_fields(document: dict[str, Any], name: str) -> None:
    """Check the fields of a report (already through `parse_report`) that the HTML page prints.

    A wrong type is a `ReportError` naming the field; null stands for "not
    recorded" everywhere. Numbers must be JSON numbers (never a string): the
    page writes them as they are.
    """
    for section, fields in _SECTIONS.items():
        value = document.get(section)
        if value is None:
            continue
        _expect(value, "object", name, section)
        _check_fields(value, fields, name, section)
    target = (document.get("run") or {}).get("target")
    if target is not None:
        _check_fields(target, _TARGET_FIELDS, name, "run.target")
        for backend, entry in (target.get("backends") or {}).items():
            _expect(entry, "object", name, f"run.target.backends.{backend}")
            _check_fields(
                entry, {"distribution": "string", "version": "string"}, name, f"run.target.backends.{backend}"
            )
    for key in ("by_type", "by_stage"):
        for label, count in ((document.get("errors") or {}).get(key) or {}).items():
            _expect(count, "count", name, f"errors.{key}.{label}")
    for category, counts in document["summary"].items():
        for outcome in ("total", "scored", "not_needed", *OUTCOMES):
            if counts.get(outcome) is not None:
                _expect(counts[outcome], "count", name, f"summary.{category}.{outcome}")
    ops = document.get("ops") or {}
    for i, dtype in enumerate(ops.get("dtypes") or []):
        _expect(dtype, "string", name, f"ops.dtypes[{i}]")
    for overload, row in (ops.get("overloads") or {}).items():
        _expect(row, "object", name, f"ops.overloads.{overload}")
        for dtype, state in (row or {}).items():
            _expect(state, "string", name, f"ops.overloads.{overload}.{dtype}")
    for i, test in enumerate(document["tests"]):
        where = f"tests[{i}]"
        _check_fields(test, _TEST_FIELDS, name, where)
        if test.get("error") is not None:
            _check_fields(test["error"], _ERROR_FIELDS, name, f"{where}.error")
        if test.get("known_failure") is not None:
            _check_fields(test["known_failure"], _KNOWN_FIELDS, name, f"{where}.known_failure")


def _check_fields(value: dict[str, Any], fields: dict[str, str], name: str, where: str) -> None:
    for key, kind in fields.items():
        if value.get(key) is not None:
            _expect(value[key], kind, name, f"{where}.{key}")


_KINDS = {
    "string": (lambda v: isinstance(v, str), "a string"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
    "integer": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a count (an integer >= 0)"),
    "number": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf"),
        "a finite number",
    ),
    "list": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "an object"),
}


def _expect(value: Any, kind: str, name: str, field: str) -> None:
    test, words = _KINDS[kind]
    if not test(value):
        shown = json.dumps(value)[:40] if isinstance(value, (str, int, float, bool)) else type(value).__name__
        raise ReportError(
            f"report {name!r}: {field[:120]} must be {words} or null, got {shown}; pass the file "
            "--backendconf-report wrote"
        )


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with control and format characters escaped (``\x1b``, ``\n``, ``\u202e``).

    What a command prints from an archive or a report is the file's, not
    ours: a terminal escape or a newline in a field must not reach the
    terminal as such (a forged ``target: ok`` line). ``keep_newlines`` keeps
    the line breaks of text this package laid out itself.
    """
    out = []
    for ch in str(text):
        if keep_newlines and ch == "\n":
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs"):  # Cs: a lone surrogate no terminal encodes
            out.append(repr(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)
