"""Known-failures files: read, match against check ids, and write them back after a run.

The file format and the workflow are documented in ``docs/ci-gating.md``.
Never imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Iterable


from ._check import id_matches
from ._report import FAILING, TestResult

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENTRY_EXAMPLE = '"backendconf::parity::small_cnn[float16]" = { reason = "why it fails", link = "https://…" }'
_ENTRY_KEYS = {"reason", "link"}


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    """One entry of a known-failures file: a test-id pattern, why it fails, and where that is tracked."""

    pattern: str
    reason: str
    link: str = ""
    #: Where the entry is in its file, for warnings (0 when unknown).
    line: int = dataclasses.field(default=0, compare=False)

    def as_json(self) -> dict[str, str]:
        return {"pattern": self.pattern, "reason": self.reason, "link": self.link}

    def matches(self, test_id: str) -> bool:
        return id_matches(test_id, self.pattern)


def load_known_failures(path: Path, option: str) -> list[KnownFailure]:
    """The entries of a known-failures file, in file order; a `pytest.UsageError` for any mistake."""
    import pytest  # here, not at import: the report package loads without pytest (backendconf replay)

    where = f"{option}={path}"
    try:
        text = path.read_text(encoding="utf-8")
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
    entries = []
    for pattern, value in data.items():
        entry = f"{path}: entry {pattern!r}"
        if not pattern.strip():
            raise pytest.UsageError(f"{entry}: the test-id pattern is empty; write the id of a conformance test.")
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
                f"`reason` (required) and `link` (optional){hint}."
            )
        if "reason" not in value:
            raise pytest.UsageError(f'{entry} has no reason; add reason = "why it fails" (and link = "issue URL").')
        reason, link = value["reason"], value.get("link", "")
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(f"{entry}: reason must be a non-empty string, not {reason!r}.")
        if not isinstance(link, str):
            raise pytest.UsageError(f'{entry}: link must be a string (an issue URL, or ""), not {link!r}.')
        entries.append(KnownFailure(pattern, reason, link, _line_of(text, pattern)))
    return entries


def _line_of(text: str, key: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        line = line.lstrip()
        for spelling in (json.dumps(key), f"'{key}'", key):
            if line.startswith(spelling) and line[len(spelling) :].lstrip().startswith(("=", ".")):
                return number
    return 0


def format_known_failures(entries: Iterable[KnownFailure], backend: str) -> str:
    """A known-failures file: a comment header, then one sorted inline-table line per entry."""
    lines = [
        f"# Known conformance failures of backend {backend!r}, for pytest --backendconf-known-failures.",
        "# Each key is a test id (fnmatch patterns allowed); a listed test that passes fails the run.",
        "# Written by --backendconf-write-known-failures; edit the reasons and links freely.",
    ]
    for entry in sorted(entries, key=lambda e: e.pattern):
        reason, link = _toml_str(entry.reason), _toml_str(entry.link)
        lines.append(f"{_toml_str(entry.pattern)} = {{ reason = {reason}, link = {link} }}")
    return "\n".join(lines) + "\n"


def _toml_str(text: str) -> str:
    # A JSON string is a TOML basic string once DEL is escaped too.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def merge_known_failures(
    results: Iterable[TestResult], existing: Iterable[KnownFailure], stale: set[str] | None
) -> list[KnownFailure]:
    """The entries to write after a run: the failing tests, keeping what people wrote where it still holds.

    An existing entry is kept as written when the tests it matched in this
    run include a failure and no pass, or when it matched no test of this run
    but still names a check of the suite (it is outside the selection);
    otherwise it is dropped and its still-failing tests are listed one by
    one with its reason and link. A failing test no entry covers gets the
    first line of its failure as the reason.
    """
    results = list(results)
    outcome = {r.id: r.outcome for r in results}
    kept: dict[str, KnownFailure] = {}
    covered: set[str] = set()
    unique: dict[str, KnownFailure] = {}
    for entry in existing:
        unique.setdefault(entry.pattern, entry)  # the applied file's entry wins over the target's
    existing = list(unique.values())
    for entry in existing:
        matched = [i for i in outcome if entry.matches(i)]
        if not matched:
            if stale is None or entry.pattern not in stale:
                kept[entry.pattern] = entry
            continue
        failing = [i for i in matched if outcome[i] in FAILING]
        if failing and not any(outcome[i] in ("passed", "unexpected_pass") for i in matched):
            kept[entry.pattern] = entry
            covered.update(failing)
    for result in results:
        if result.outcome not in FAILING or result.id in covered:
            continue
        prior = next((e for e in existing if e.matches(result.id)), None)
        if prior is not None:
            kept[result.id] = KnownFailure(result.id, prior.reason, prior.link)
        else:
            kept[result.id] = KnownFailure(result.id, result.first_line(), "")
    return sorted(kept.values(), key=lambda e: e.pattern)
