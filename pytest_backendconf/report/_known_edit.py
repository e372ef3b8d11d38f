"""A known-failures file updated line by line: its comments, blank lines and hand-written entries survive.

A merge (``--backendconf-write-known-failures`` onto an existing file, or
``backendconf report known-failures … -o EXISTING``) decides which entries the
file keeps; this module writes that decision into the file's own text. An
entry kept as written keeps its line byte for byte (a comment after it
too), a removed entry's line goes, a changed one is written anew in its
place, and a new entry is inserted before the first entry line whose id
sorts after it (a generated, sorted file stays sorted). Every other line —
comments, blank lines — is kept. The line-by-line edit needs each entry on
a line of its own; a file written otherwise (an entry as a ``[table]``, or
a multi-line value) is written whole instead, and the caller says so.
Never imports torch.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Iterable

from ._known_failures import KnownFailure, _key_lines, entries_of, entry_toml, format_known_failures
from ._words import counted

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclasses.dataclass
class KnownFailuresUpdate:
    """A known-failures file about to be written: its text, what it holds and held, and what to say of it."""

    text: str
    entries: list[KnownFailure]
    #: The entries before: of the file the run applied and of the file written.
    previous: list[KnownFailure]
    #: Each entry dropped (`merge_known_failures`) → why, in words.
    removed: dict[str, str]
    #: Why the existing file was written whole, its comments lost (None: edited line by line, or new).
    rewritten: str | None = None
    #: Further lines to print (``report known-failures`` over several machines: the checks that vary).
    said: list[str] = dataclasses.field(default_factory=list)

    def lines(self, output: str) -> list[str]:
        """``wrote 3 known failures to k.toml (1 added, 2 removed)``, then each removed entry and why."""
        before, after = {e.pattern for e in self.previous}, {e.pattern for e in self.entries}
        gone = sorted(before - after)
        found = [
            f"wrote {counted(len(self.entries), 'known failure')} to {output} ({len(after - before)} added, {len(gone)} removed)"
        ]
        found += [f"removed {pattern}: {self.removed.get(pattern, 'no longer listed')}" for pattern in gone]
        if self.rewritten is not None:
            found.append(f"{output} was written whole, its comments not kept: {self.rewritten}")
        return found + self.said


def existing_text(path: Path) -> str | None:
    """The text of the known-failures file about to be replaced, or None (no regular file there)."""
    from ..archive import read_regular_file
    from ._known_failures import MAX_KNOWN_FAILURES_BYTES

    try:  # a pipe or /dev/stdout is not read (nothing to keep, and reading would block)
        return read_regular_file(path, MAX_KNOWN_FAILURES_BYTES, follow_symlinks=True).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def edited_known_failures(old: str | None, entries: Iterable[KnownFailure], backend: str) -> tuple[str, str | None]:
    """(the file's new text, None) or, when ``old`` cannot be edited line by line, (a whole new file, why).

    :param old: the existing file's text, or None when there is none (a new file gets the usual header).
    """
    entries = sorted(entries, key=lambda e: e.pattern)
    if old is None:
        return format_known_failures(entries, backend), None
    lines = old.splitlines()
    at = _entry_lines(old, lines)
    if isinstance(at, str):
        return format_known_failures(entries, backend), at
    wanted = {e.pattern: e for e in entries}
    written: dict[int, str | None] = {}  # line index -> its new text (None: removed)
    for index, (pattern, before) in at.items():
        entry = wanted.get(pattern)
        if entry is None:
            written[index] = None
        elif entry != before:
            written[index] = entry_toml(entry)
    # The entry lines that stay, in file order: a new entry goes before the first that sorts after it.
    existing = sorted((i, found) for i, found in at.items() if found[0] in wanted)
    inserted: dict[int, list[str]] = {}  # line index -> new entry lines to put before it (len(lines): at the end)
    for entry in entries:
        if any(pattern == entry.pattern for pattern, _ in at.values()):
            continue
        later = next((i for i, (pattern, _) in existing if pattern > entry.pattern), None)
        if later is None:
            later = existing[-1][0] + 1 if existing else len(lines)
        inserted.setdefault(later, []).append(entry_toml(entry))
    out: list[str] = []
    for index in range(len(lines) + 1):
        out += inserted.get(index, [])
        if index == len(lines):
            break
        if index in written:
            if written[index] is not None:
                out.append(written[index])  # type: ignore[arg-type]
            continue
        out.append(lines[index])
    return "\n".join(out) + "\n", None


def _entry_lines(text: str, lines: list[str]) -> dict[int, tuple[str, KnownFailure]] | str:
    """Each entry's line index → (its pattern, its entry as read), or why the file is not one entry a line."""
    if _TABLE.search(text):
        return "it has [table] headers"
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return "it is not valid TOML"
    starts = _key_lines(text)
    found: dict[int, tuple[str, KnownFailure]] = {}
    for pattern, value in data.items():
        number = starts.get(pattern)
        if number is None:
            return f"its entry {pattern!r} does not start a line"
        line = lines[number - 1]
        try:
            alone = tomllib.loads(line)
        except tomllib.TOMLDecodeError:
            alone = None
        if alone != {pattern: value}:
            return f"its entry {pattern!r} spans several lines"
        try:
            found[number - 1] = (pattern, entries_of({pattern: value}, "")[0])
        except Exception:  # pytest.UsageError: read already, so not expected; then the file is written whole
            return f"its entry {pattern!r} cannot be read"
    return found


_TABLE = re.compile(r"^\s*\[", re.MULTILINE)
