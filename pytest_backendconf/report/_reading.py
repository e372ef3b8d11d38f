"""The one reader of report files: bounded nesting, the schema version, every field's type, the tests as records.

A report is a file CI passes around, so whatever it holds is treated as
data from outside: JSON nested deeper than any report is refused before it
is parsed (Python's parser would recurse once per level), the schema's
major version must be ours, every field a reader uses or prints is checked
for its type (numbers as numbers) and each test is read as a `ReportTest`,
with an error naming the file, the field and the fix. ``report gate``,
``merge``, ``html``, ``ops``, shards and known failures all read here
(`read_report`). Never imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from pathlib import Path
from typing import Any, Iterable

from .._validation import KINDS, check_type, field, shown
from ..errors import ReportError
from ._record import OUTCOMES, ReportTest, from_entries
from ._report import REPORT_SCHEMA, REPORT_SCHEMA_VERSION

#: How deep a JSON document (a report, an ``--inputs`` file) may nest: a report is six levels deep,
#: an ``--inputs`` tensor one level per dimension.
MAX_JSON_DEPTH = 64
#: The largest report file read: a whole default suite's report is a few MiB.
MAX_REPORT_BYTES = 128 * 2**20
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


# --- one report file ---------------------------------------------------------------------------

_FIX = "pass the file --backendconf-report wrote"


@dataclasses.dataclass
class Report:
    """One ``--backendconf-report`` file, checked: its tests as records, and the fields its readers use.

    ``document`` is the whole JSON (every field a reader prints already
    checked for its type); ``label`` is the column title a merge gives it.
    """

    path: str
    document: dict[str, Any]
    tests: list[ReportTest]
    backend: str
    backend_version: str | None
    torch: str
    python: str
    platform: str
    exit_status: int | None
    select: list[str]
    #: ``{category: {"total", "passed", "scored"}}`` as the run counted them.
    summary: dict[str, dict[str, int]]
    label: str = ""

    def section(self, key: str) -> dict[str, Any]:
        """A top-level object of the report (``backend``, ``run``, ``known_failures``, …); {} when null."""
        value = self.document.get(key)
        return value if isinstance(value, dict) else {}

    @property
    def machine(self) -> dict[str, Any]:
        """The machine the report names, as `describe_machine` gives it (strings, a list of flags)."""
        environment = self.section("environment")
        machine: dict[str, Any] = {k: v if isinstance(v := environment.get(k), str) else "" for k in _MACHINE_KEYS}
        flags = environment.get("cpu_flags")
        machine["cpu_flags"] = [f for f in flags if isinstance(f, str)] if isinstance(flags, list) else []
        return machine


_MACHINE_KEYS = ("machine", "cpu_model", "cpu_capability", "cpu_flags")


def report_files(paths: Iterable[str]) -> list[str]:
    """The report files named by ``paths``: a file as given, a directory as its ``*.json`` files.

    A directory lets a CI job merge whatever reports its matrix produced
    (``backendconf report merge reports/``) without a shell glob.
    """
    return [file for file, _ in _report_files(paths)]


def _report_files(paths: Iterable[str]) -> list[tuple[str, bool]]:
    """`report_files`, each with whether it was named (True) or found in a folder (False)."""
    files = []
    for path in paths:
        if Path(path).is_dir():
            # Every *.json entry but folders: a FIFO, a device or a link among them is refused by name when read.
            found = sorted(str(p) for p in Path(path).glob("*.json") if p.is_symlink() or not p.is_dir())
            if not found:
                raise ReportError(
                    f"directory {path!r} holds no report (*.json); run the suite with --backendconf-report=FILE first"
                )
            files += [(file, False) for file in found]
        else:
            files.append((path, True))
    return files


def read_report(path: str | Path, *, follow_symlinks: bool = True) -> Report:
    """Read and check one report file: its size and nesting, schema version, types and tests.

    The one reader of report files (gate, merge, shards, html, ops, known
    failures); a `ReportError` names the file, the field and the fix. A FIFO or a
    device is refused, and a symbolic link unless ``follow_symlinks`` (a file the
    user named may be one; a file found in a folder may not).
    """
    from ..archive import read_regular_file

    name = str(path)
    try:
        text = read_regular_file(path, MAX_REPORT_BYTES, follow_symlinks=follow_symlinks).decode("utf-8")
    except OSError as exc:
        raise ReportError(f"cannot read report {name!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ReportError(f"report {name!r} is not UTF-8 text; {_FIX}") from None
    return parse_report(load_json(text, f"report {name!r}", _FIX), name)


def read_reports(paths: Iterable[str]) -> list[Report]:
    """`read_report` of every file `report_files` finds in ``paths`` (a folder's links are not followed)."""
    return [read_report(path, follow_symlinks=named) for path, named in _report_files(paths)]


def read_matrix(path: str) -> dict[str, Any]:
    """The ops matrix of a ``--backendconf-report`` file; `ReportError` names the file and the fix."""
    from ._ops import ops_matrix

    matrix = ops_matrix(read_report(path).tests)
    if matrix is None:
        raise ReportError(
            f"report {path!r} has no ops checks: run the suite with the ops category "
            f"(e.g. `pytest --backend=NAME -m ops --backendconf-report={path}`)"
        )
    return matrix


def parse_report(document: object, name: str) -> Report:
    """Check ``document`` against the report schema (major version 1, any minor) and read its tests."""
    if not isinstance(document, dict) or document.get("schema") != REPORT_SCHEMA:
        found = (
            f'its "schema" is {document.get("schema")!r}, expected {REPORT_SCHEMA!r}'
            if isinstance(document, dict)
            else f"it holds {shown(document)}, not an object"
        )
        raise ReportError(f"{name!r} is not a backendconf report ({found}); {_FIX}")
    version = document.get("schema_version")
    if not (isinstance(version, list) and len(version) == 2 and all(KINDS["integer"][0](v) for v in version)):
        raise ReportError(f'report {name!r}: "schema_version" must be [major, minor], got {version!r}')
    if version[0] != REPORT_SCHEMA_VERSION[0]:
        ours = f"{REPORT_SCHEMA_VERSION[0]}.{REPORT_SCHEMA_VERSION[1]}"
        raise ReportError(
            f"report {name!r} has schema version {version[0]}.{version[1]}; this backendconf reads "
            f"version {REPORT_SCHEMA_VERSION[0]}.x (it writes {ours}); merge reports written by the "
            "same major version of pytest-backendconf, or upgrade it"
        )
    try:
        return _parse(document, name)
    except ValueError as exc:
        raise ReportError(f"report {name!r}: {exc}; {_FIX}") from None


def _parse(document: dict[str, Any], name: str) -> Report:
    backend = field(document, "backend", "object")
    environment = field(document, "environment", "object")
    run = field(document, "run", "object")
    summary_doc = field(document, "summary", "object")
    _check_sections(document)
    summary = {}
    for category, counts in summary_doc.items():
        where = f"summary.{category}"
        check_type(counts, "object", where)
        for outcome in ("scored", "not_needed", *OUTCOMES):
            field(counts, outcome, "count", where, optional=True)
        total, passed = field(counts, "total", "count", where), field(counts, "passed", "count", where)
        if passed > total:
            raise ValueError(f"{where} has more passed checks than its total")
        # 1.3: the score's denominator (delegation runs lowered whole left out); before, the total.
        scored = counts.get("scored")
        summary[category] = {"total": total, "passed": passed, "scored": total if scored is None else scored}
    tests = from_entries(document.get("tests"))
    exit_status = run.get("exit_status")
    select = run.get("select") or []
    return Report(
        path=name,
        document=document,
        tests=tests,
        backend=field(backend, "name", "string", "backend"),
        backend_version=field(backend, "version", "string", "backend", optional=True),
        torch=field(environment, "torch", "string", "environment"),
        python=str(environment.get("python") or "?"),
        platform=str(environment.get("platform") or "?"),
        exit_status=exit_status,
        select=[str(s) for s in select],
        summary=summary,
    )


#: Objects of the report (null allowed) and, in each, the kind of each field a reader prints.
_SECTIONS: dict[str, dict[str, str]] = {
    "backend": {
        "version": "string",
        "source": "string",
        "available": "boolean",
        "unavailable_reason": "string",
        "capabilities": "object",
        "not_under_test": "list",
    },
    "environment": {
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
        "shard": "object",
    },
    "known_failures": {"file": "string", "entries": "count", "stale": "list"},
    "errors": {"total": "count", "by_type": "object", "by_stage": "object", "compile_errors": "object"},
    "ops": {"dtypes": "list", "overloads": "object", "samples": "object"},
    "delegation": {},
}
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


def _check_sections(document: dict[str, Any]) -> None:
    """The optional sections' fields; null stands for "not recorded" everywhere. Numbers must be JSON
    numbers (never a string): the page writes them as they are."""
    for section, fields in _SECTIONS.items():
        value = check_type(document.get(section), "object", section, optional=True)
        for key, kind in fields.items():
            field(value or {}, key, kind, section, optional=True)
    target = (document.get("run") or {}).get("target")
    if target is not None:
        for key, kind in _TARGET_FIELDS.items():
            field(target, key, kind, "run.target", optional=True)
        for backend, entry in (target.get("backends") or {}).items():
            where = f"run.target.backends.{backend}"
            check_type(entry, "object", where)
            field(entry, "distribution", "string", where, optional=True)
            field(entry, "version", "string", where, optional=True)
    for key in ("by_type", "by_stage", "compile_errors"):
        for label, count in ((document.get("errors") or {}).get(key) or {}).items():
            check_type(count, "count", f"errors.{key}.{label}")
    ops = document.get("ops") or {}
    for key, kind in (("count", "count"), ("digest", "string"), ("source", "string")):
        field(ops.get("samples") or {}, key, kind, "ops.samples", optional=True)
    for i, dtype in enumerate(ops.get("dtypes") or []):
        check_type(dtype, "string", f"ops.dtypes[{i}]")
    for overload, row in (ops.get("overloads") or {}).items():
        check_type(row, "object", f"ops.overloads.{overload}")
        for dtype, state in row.items():
            check_type(state, "string", f"ops.overloads.{overload}.{dtype}")


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
