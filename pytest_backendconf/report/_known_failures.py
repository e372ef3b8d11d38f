"""Known-failures files: read, match against check ids, and write them back after a run.

The file format and the workflow are documented in ``docs/ci-gating.md``.
Never imports torch.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterable, NamedTuple


from .._quoting import toml_comment, toml_string
from ._failure_facts import FIGURE_KEYS, facts_of, number_toml
from ._words import counted
from ..checks import ROOT_ID, id_matches
from ._machine import WHEN_KEYS, applies
from ._record import FAILING, PASSING, ReportTest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The longest test-id pattern an entry may have: ids are under 200 characters, and fnmatch's cost
#: grows with a pattern's brackets (a 20 KB ``[[[…`` pattern took 11 s to match once).
MAX_PATTERN_LENGTH = 1000
#: The largest known-failures file read: a whole suite's entries, one line each, take well under 1 MiB.
MAX_KNOWN_FAILURES_BYTES = 16 * 2**20
#: The most wildcards (``*``, ``?``, ``[``) a pattern may have: a test-id pattern needs two or three, and
#: each costs a scan of the id when a pattern is tried; with the literal-text filters of
#: `KnownFailureIndex`, this keeps a lookup within milliseconds whatever the file (docs/benchmarks.md).
MAX_PATTERN_WILDCARDS = 16
ENTRY_EXAMPLE = '"backendconf::parity::small_cnn[float16]" = { reason = "why it fails", link = "https://…" }'
#: What a generated entry records of its failure, beside its reason (`_failure_facts`): read, kept, never matched.
FACT_KEYS = ("node", "op", "output", "figures")
_ENTRY_KEYS = {"reason", "link", "when", "strict", *FACT_KEYS}


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    """One entry of a known-failures file: a test-id pattern, why it fails, and where that is tracked."""

    pattern: str
    reason: str
    link: str = ""
    #: Where the entry is in its file, for warnings (0 when unknown).
    line: int = dataclasses.field(default=0, compare=False)
    #: Where it applies: ``(key, value)`` pairs of its ``when`` table (`WHEN_KEYS`); empty: everywhere.
    when: tuple[tuple[str, Any], ...] = ()
    #: False: its check may pass or fail without failing the run (its reason says why the outcome varies).
    strict: bool = True
    #: Where the failure starts: the node the outputs first diverge at, and its operator ("" when unknown).
    node: str = ""
    op: str = ""
    #: The output furthest out of tolerance (None when unknown or not a comparison).
    output: int | None = None
    #: Its figures: ``(key, number)`` pairs of `FIGURE_KEYS` (``max_abs_error``, ``closeness``, ``rtol`` …).
    figures: tuple[tuple[str, float | int], ...] = ()

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"pattern": self.pattern, "reason": self.reason, "link": self.link}
        if not self.strict:
            found["strict"] = False
        if self.when:
            found["when"] = {key: list(value) if isinstance(value, tuple) else value for key, value in self.when}
        found.update(self.facts())
        return found

    def facts(self) -> dict[str, Any]:
        """``node``, ``op``, ``output`` and ``figures``, those it has (`_failure_facts`)."""
        found: dict[str, Any] = {}
        if self.node:
            found["node"] = self.node
        if self.op:
            found["op"] = self.op
        if self.output is not None:
            found["output"] = self.output
        if self.figures:  # JSON has no inf or NaN: the report writes them as strings, as its numerics do
            found["figures"] = {k: v if math.isfinite(v) else str(v) for k, v in self.figures}
        return found

    def applies_to(self, machine: dict[str, Any]) -> bool:
        """Whether this entry holds on ``machine`` (`describe_machine`): elsewhere its check must pass."""
        return applies(dict(self.when), machine)

    def matches(self, test_id: str) -> bool:
        return id_matches(test_id, self.pattern)


def load_known_failures_file(path: Path, what: str) -> list[KnownFailure]:
    """`load_known_failures` for the report commands, which run without pytest: a mistake is a `ReportError`."""
    import pytest

    from ..errors import ReportError

    try:
        return load_known_failures(path, what)
    except pytest.UsageError as exc:
        raise ReportError(str(exc)) from None


def load_known_failures(path: Path, option: str) -> list[KnownFailure]:
    """The entries of a known-failures file, in file order; a `pytest.UsageError` for any mistake."""
    import pytest  # here, not at import: the report package loads without pytest (backendconf replay)

    from ..archive import read_regular_file

    where = f"{option}={path}"
    try:
        # The file the user named (a link to it is followed); never a FIFO or a device, never past the cap.
        text = read_regular_file(path, MAX_KNOWN_FAILURES_BYTES, follow_symlinks=True).decode("utf-8")
    except FileNotFoundError:
        raise pytest.UsageError(
            f"{where}: the file does not exist. Fix the path, or write the file from a run with "
            f"--backendconf-write-known-failures={path}."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise pytest.UsageError(f"{where}: cannot read the file ({exc}).") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise pytest.UsageError(
            f"{where} is not valid TOML: {exc}. Each entry is one line, with the test id quoted as a key: "
            f"{ENTRY_EXAMPLE}"
        ) from None
    except RecursionError:  # the parser recurses once per level of nested arrays or tables
        raise pytest.UsageError(
            f"{where}: its arrays or tables nest too deeply to read; a known-failures file is one level of "
            f"entries: {ENTRY_EXAMPLE}"
        ) from None
    return entries_of(data, path, _key_lines(text))


def entries_of(data: dict[str, Any], path: Any, lines: dict[str, int] | None = None) -> list[KnownFailure]:
    """The entries of a parsed known-failures file, checked; a `pytest.UsageError` naming ``path`` for a mistake.

    :param lines: each key's line in the file (`_key_lines`), for messages and warnings.
    """
    import pytest

    lines = lines or {}
    entries = []
    for pattern, value in data.items():
        entry = f"{path}: entry {pattern[:80]!r}{'…' if len(pattern) > 80 else ''}"
        if not pattern.strip():
            raise pytest.UsageError(f"{entry}: the test-id pattern is empty; write the id of a conformance test.")
        if len(pattern) > MAX_PATTERN_LENGTH:
            raise pytest.UsageError(
                f"{entry}: the pattern is {len(pattern)} characters long; at most {MAX_PATTERN_LENGTH} are "
                "read (a test id is under 200): write the id, or a shorter pattern with * in it."
            )
        if _is_pattern(pattern) and _wildcards(pattern) > MAX_PATTERN_WILDCARDS:
            raise pytest.UsageError(
                f"{entry}: the pattern has {_wildcards(pattern)} wildcards (*, ? and [); at most "
                f"{MAX_PATTERN_WILDCARDS} are read: write the id, or a pattern with fewer wildcards."
            )
        if not isinstance(value, dict):
            raise pytest.UsageError(
                f"{entry} is a {type(value).__name__}, not a table. Write it as "
                f'"{pattern}" = {{ reason = "why it fails", link = "issue URL" }}'
            )
        unknown = sorted(set(value) - _ENTRY_KEYS)
        if unknown:
            hint = ""
            if any(isinstance(value[k], dict) for k in unknown):
                hint = ' (a test id with dots must be quoted whole: "parity::encoder_decoder.decode[float32]" = { … })'
            raise pytest.UsageError(
                f"{entry} has unknown key(s) {', '.join(map(repr, unknown))}; an entry has only "
                f"`reason` (required), `link`, `when` and `strict`, and what it records of its failure: "
                f"`node`, `op`, `output` and `figures` (all optional){hint}."
            )
        strict = value.get("strict", True)
        if not isinstance(strict, bool):
            raise pytest.UsageError(
                f"{entry}{_at(lines, pattern)}: strict must be true or false (without quotes), not {strict!r}; "
                "write strict = false, with a reason saying why the outcome varies, or leave it out."
            )
        if not strict and not (isinstance(value.get("reason"), str) and value["reason"].strip()):
            raise pytest.UsageError(
                f"{entry}{_at(lines, pattern)}: strict = false lets its check pass or fail without failing the "
                'run, so it needs a reason saying why the outcome varies: add reason = "fails on …, passes on …" '
                "(or scope the entry to the machines where it fails with when = { … })."
            )
        if "reason" not in value:
            raise pytest.UsageError(f'{entry} has no reason; add reason = "why it fails" (and link = "issue URL").')
        reason, link = value["reason"], value.get("link", "")
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(f"{entry}: reason must be a non-empty string, not {reason!r}.")
        if not isinstance(link, str):
            raise pytest.UsageError(f'{entry}: link must be a string (an issue URL, or ""), not {link!r}.')
        when = _when(value.get("when", {}), entry)
        facts = _facts(value, f"{entry}{_at(lines, pattern)}")
        entries.append(KnownFailure(pattern, reason, link, lines.get(pattern, 0), when, strict, **facts))
    return entries


def _facts(value: dict[str, Any], entry: str) -> dict[str, Any]:
    """An entry's ``node``, ``op``, ``output`` and ``figures``, checked: what it records of its failure."""
    import pytest

    example = 'node = "sub", op = "aten::sub", output = 0, figures = { max_abs_error = 0.0874, closeness = 314.3 }'
    found: dict[str, Any] = {}
    for key in ("node", "op"):
        if key in value:
            if not isinstance(value[key], str) or not value[key].strip():
                raise pytest.UsageError(
                    f"{entry}: {key} must be a non-empty string (the failure's {key}), not {value[key]!r}; "
                    f"e.g. {example}, or leave it out."
                )
            found[key] = value[key]
    if "output" in value:
        output = value["output"]
        if isinstance(output, bool) or not isinstance(output, int) or output < 0:
            raise pytest.UsageError(
                f"{entry}: output must be the index of an output (an integer from 0, without quotes), not "
                f"{output!r}; e.g. {example}, or leave it out."
            )
        found["output"] = output
    if "figures" in value:
        figures = _table(value["figures"], "figures", FIGURE_KEYS, entry, example, kind=" of numbers")
        bad = [k for k, v in figures.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            raise pytest.UsageError(
                f"{entry}: figures.{bad[0]} must be a number (without quotes), not {figures[bad[0]]!r}; e.g. {example}"
            )
        found["figures"] = tuple((k, figures[k]) for k in FIGURE_KEYS if k in figures)
    return found


def facts_from_json(entry: dict[str, Any]) -> dict[str, Any]:
    """The facts of a report's ``tests[].known_failure`` (`KnownFailure.as_json`), those of the right type.

    A report is read, not trusted: a fact of another type is left out (the
    entry keeps its pattern, reason and link), an ``"inf"`` figure is inf.
    """
    figures = entry.get("figures")
    if isinstance(figures, dict):
        figures = {k: float(v) if v in ("inf", "-inf", "nan") else v for k, v in figures.items()}
    found: dict[str, Any] = {}
    for key, value in (*((k, entry[k]) for k in ("node", "op", "output") if k in entry), ("figures", figures)):
        if value is None:
            continue
        try:
            found.update(_facts({key: value}, "report"))
        except Exception:  # pytest.UsageError: not a fact this reader accepts
            continue
    return found


def _at(lines: dict[str, int], pattern: str) -> str:
    """`` (line N)`` where the entry starts, when known."""
    return f" (line {lines[pattern]})" if pattern in lines else ""


def _when(value: object, entry: str) -> tuple[tuple[str, Any], ...]:
    """An entry's ``when`` table, checked: the machines it applies to (`WHEN_KEYS`)."""
    import pytest

    example = 'when = { machine = "x86_64", cpu_capability = "AVX512", cpu_flags = ["avx512_fp16"] }'
    value = _table(value, "when", WHEN_KEYS, entry, example, note=" (the report header's machine fields)")
    found: list[tuple[str, Any]] = []
    for key in WHEN_KEYS:
        if key not in value:
            continue
        wanted = value[key]
        if key == "cpu_flags":
            if not isinstance(wanted, list) or not wanted or not all(isinstance(f, str) and f for f in wanted):
                raise pytest.UsageError(
                    f"{entry}: when.cpu_flags must be a non-empty list of flag names, e.g. {example}"
                )
            found.append((key, tuple(sorted(wanted))))
        elif not isinstance(wanted, str) or not wanted:
            raise pytest.UsageError(f"{entry}: when.{key} must be a non-empty string, e.g. {example}")
        else:
            found.append((key, wanted))
    return tuple(found)


def _table(
    value: Any, name: str, keys: tuple[str, ...], entry: str, example: str, *, kind: str = "", note: str = ""
) -> dict[str, Any]:
    """An entry's ``name`` table, with only ``keys``; else a usage error naming the keys it may have."""
    import pytest

    if not isinstance(value, dict):
        raise pytest.UsageError(f"{entry}: {name} must be a table{kind}, e.g. {example}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise pytest.UsageError(
            f"{entry}: {name} has unknown key(s) {', '.join(map(repr, unknown))}; it may have "
            f"{', '.join(keys)}{note}, e.g. {example}"
        )
    return value


_KEY = re.compile(r"""\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*[=.]""")


def _key_lines(text: str) -> dict[str, int]:
    """Each key that starts a line → its first line number, in one pass (warnings point at the entry)."""
    found: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _KEY.match(line)
        if match is None:
            continue
        basic, literal, bare = match.groups()
        key = literal if literal is not None else bare
        if basic is not None:
            try:
                key = json.loads(f'"{basic}"')  # a TOML basic string is a JSON string here
            except ValueError:
                key = basic
        found.setdefault(key, number)
    return found


def _is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


def _wildcards(text: str) -> int:
    return text.count("*") + text.count("?") + text.count("[")


class _Pattern(NamedTuple):
    """A wildcard entry, prepared once: cheap necessary conditions first, then its compiled regex."""

    position: int
    suffix: str  # the literal text after its last wildcard: an id it matches ends with it
    shortest: int  # the fewest characters an id it matches has
    chunks: tuple[str, ...]  # its literal runs: an id it matches holds each
    regex: re.Pattern[str]

    def matches(self, text: str) -> bool:
        return (
            len(text) >= self.shortest
            and text.endswith(self.suffix)
            and all(chunk in text for chunk in self.chunks)
            and self.regex.match(text) is not None
        )


def _literal_runs(pattern: str) -> list[str | None]:
    """``pattern`` as fnmatch reads it: literal runs, and None for each ``*``, ``?`` or ``[…]`` class.

    Classes are found as `fnmatch.translate` finds them (``[!``, a ``]`` first
    in the class, an unclosed ``[`` is a literal); a ``?`` and a class are
    one character each, which ``shortest`` below counts.
    """
    parts: list[str | None] = []
    literal = ""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "[":
            j = i + (i < n and pattern[i] == "!")
            j += j < n and pattern[j] == "]"
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                literal += c  # no closing bracket: fnmatch reads '[' as itself
                continue
            i = j + 1
        elif c not in "*?":
            literal += c
            continue
        parts += [literal, "" if c == "*" else None]
        literal = ""
    return parts + [literal]


def _prepare(position: int, pattern: str) -> _Pattern:
    parts = _literal_runs(pattern)
    literals = [p for p in parts if p]
    shortest = sum(map(len, literals)) + parts.count(None)  # '*' is "", each '?' or class None
    chunks = tuple(sorted(set(literals), key=len, reverse=True))
    return _Pattern(position, parts[-1] or "", shortest, chunks, re.compile(fnmatch.translate(pattern)))


class KnownFailureIndex:
    """The entries of known-failures files, looked up by check id in time independent of their number.

    An entry whose pattern has no ``*``, ``?`` or ``[`` matches only its own
    id, so it is found in a dict; the others are filed under the literal
    text before their first wildcard, and a check id is tried only against
    the patterns filed under one of its own prefixes. Of those, a pattern is
    matched (its regex compiled once, here) only when the id ends with its
    literal suffix, is long enough and holds each of its literal runs: cheap
    tests that leave, for a hostile file of long patterns sharing one
    prefix, only the few wildcards `MAX_PATTERN_WILDCARDS` allows to scan.
    The first entry in file order wins, as when every pattern is tried in turn.
    """

    def __init__(self, entries: Iterable[KnownFailure]) -> None:
        self.entries = list(entries)
        self._exact: dict[str, int] = {}
        self._by_prefix: dict[str, list[_Pattern]] = {}
        for i, entry in enumerate(self.entries):
            self._exact.setdefault(entry.pattern, i)
            if _is_pattern(entry.pattern):
                prefix = re.split(r"[*?\[]", entry.pattern, maxsplit=1)[0]
                self._by_prefix.setdefault(prefix, []).append(_prepare(i, entry.pattern))

    def matching(self, test_id: str) -> list[int]:
        """The positions of every entry matching ``test_id``, in file order."""
        name = test_id.removeprefix(f"{ROOT_ID}::")
        full = f"{ROOT_ID}::{name}"
        found = {self._exact[k] for k in (full, name) if k in self._exact}
        for text in (full, name):
            for end in range(len(text) + 1):
                for pattern in self._by_prefix.get(text[:end], ()):
                    if pattern.position not in found and pattern.matches(text):
                        found.add(pattern.position)
        return sorted(found)

    def entry_for(self, test_id: str, *exact: str) -> KnownFailure | None:
        """The entry naming ``test_id``: one whose pattern is one of ``exact`` first, else the first matching."""
        named = [self._exact[k] for k in exact if k in self._exact]
        if named:
            return self.entries[min(named)]
        found = self.matching(test_id)
        return self.entries[found[0]] if found else None


def format_known_failures(entries: Iterable[KnownFailure], backend: str) -> str:
    """A known-failures file: a comment header, then one sorted inline-table line per entry."""
    lines = [
        toml_comment(f"Known conformance failures of backend {backend!r}, for pytest --backendconf-known-failures."),
        "# Each key is a test id (fnmatch patterns allowed); a listed test that passes fails the run.",
        "# Written by --backendconf-write-known-failures; edit the reasons and links freely.",
    ]
    for entry in sorted(entries, key=lambda e: e.pattern):
        lines.append(entry_toml(entry))
    return "\n".join(lines) + "\n"


def entry_toml(entry: KnownFailure) -> str:
    """One entry as its one line of TOML: ``"id" = { reason = "…", link = "…", node = "sub", … }``."""
    reason, link = toml_string(entry.reason), toml_string(entry.link)
    when = f", when = {when_toml(entry.when)}" if entry.when else ""
    strict = "" if entry.strict else ", strict = false"
    facts = "".join(
        f", {key} = {toml_string(value)}" if isinstance(value, str) else f", {key} = {value}"
        for key, value in (("node", entry.node), ("op", entry.op), ("output", entry.output))
        if value not in ("", None)
    )
    if entry.figures:
        figures = ", ".join(f"{key} = {number_toml(value)}" for key, value in entry.figures)
        facts += f", figures = {{ {figures} }}"
    return f"{toml_string(entry.pattern)} = {{ reason = {reason}, link = {link}{when}{strict}{facts} }}"


def when_toml(when: tuple[tuple[str, Any], ...]) -> str:
    """An entry's ``when`` as TOML: ``{ cpu_flags = ["avx512_fp16"] }``."""
    parts = [
        f"{key} = [{', '.join(map(toml_string, value))}]"
        if isinstance(value, tuple)
        else f"{key} = {toml_string(value)}"
        for key, value in when
    ]
    return f"{{ {', '.join(parts)} }}"


def merge_known_failures(
    results: Iterable[ReportTest],
    existing: Iterable[KnownFailure],
    stale: set[str] | None,
    removed: dict[str, str] | None = None,
) -> list[KnownFailure]:
    """The entries to write after a run: the failing tests, keeping what people wrote where it still holds.

    An existing entry is kept as written when the tests it matched in this
    run include a failure and no pass, or when it matched no test of this run
    but still names a check of the suite (it is outside the selection);
    otherwise it is dropped and its still-failing tests are listed one by
    one with its reason and link. A non-strict entry (``strict = false``) is
    kept as written whenever it matched a test. A failing test no entry covers gets the
    first line of its failure as the reason. An entry written here for a failing test
    records where its failure starts and its figures (`failure_entry`).

    :param removed: filled with each dropped entry's pattern → why, in words, for the terminal.
    """
    results = list(results)
    outcome = {r.id: r.outcome for r in results}
    kept: dict[str, KnownFailure] = {}
    covered: set[str] = set()
    unique: dict[str, KnownFailure] = {}
    for entry in existing:
        unique.setdefault(entry.pattern, entry)  # the applied file's entry wins over the target's
    existing = list(unique.values())
    index = KnownFailureIndex(existing)
    matches: dict[int, list[str]] = {}
    for test_id in outcome:  # each id against the entries it can match, not every entry against every id
        for i in index.matching(test_id):
            matches.setdefault(i, []).append(test_id)
    for position, entry in enumerate(existing):
        matched = matches.get(position, [])
        if not matched:
            if stale is None or entry.pattern not in stale:
                kept[entry.pattern] = entry
            elif removed is not None:
                removed[entry.pattern] = "it names no check of the suite"
            continue
        failing = [i for i in matched if outcome[i] in FAILING]
        if not entry.strict:  # its outcome varies by its own account: a pass here does not make it stale
            kept[entry.pattern] = entry
            covered.update(failing)
            continue
        passing = [i for i in matched if outcome[i] in PASSING]
        if failing and not passing:
            kept[entry.pattern] = entry
            covered.update(failing)
        elif removed is not None:
            why = f"{passing[0]} passes now" if passing else "none of its checks failed in this run"
            if len(passing) > 1:
                why = f"{counted(len(passing), 'check')} it lists pass now ({passing[0]}, …)"
            if failing:
                why += f"; still failing, and now listed one by one: {counted(len(failing), 'check')}"
            removed[entry.pattern] = why
    for result in results:
        if result.outcome not in FAILING or result.id in covered:
            continue
        prior = index.entry_for(result.id)
        written = failure_entry(result)
        kept[result.id] = (
            written if prior is None else dataclasses.replace(written, reason=prior.reason, link=prior.link)
        )
    return sorted(kept.values(), key=lambda e: e.pattern)


def failure_entry(result: ReportTest) -> KnownFailure:
    """The entry for a failing check: its failure's first line as the reason, and what its outcome says
    of where the failure starts and how far off it is (`_failure_facts.facts_of`)."""
    return KnownFailure(result.id, result.first_line(), "", **facts_of(result.details, result.reproduction))
