"""The explicit operator allowlist, read from ``operators.txt`` beside this module.

The file is data a person reviews line by line (its header gives the rules); this
module only parses it. `ALLOWED` is the set of overload names a file may name in a
`CLOSED_NAMESPACES` namespace; `absent_in` says which of them a torch release lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

_FILE = Path(__file__).with_name("operators.txt")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
_RELEASE = re.compile(r"[0-9]+\.[0-9]+")


def _parse(text: str) -> tuple[frozenset[str], dict[str, frozenset[str]], frozenset[str], frozenset[str], tuple]:
    allowed: set[str] = set()
    absent: dict[str, set[str]] = {}
    closed: set[str] = set()
    table_only: set[str] = set()
    releases: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        head, rest = line[0], line[1:]
        if head == "@releases":
            releases += rest
        elif head == "@closed":
            closed.update(rest)
        elif head == "@table-only":
            table_only.update(rest)
        elif _NAME.fullmatch(head) and (not rest or (rest[0] == "@absent" and len(rest) > 1)):
            if head in allowed:
                raise ValueError(f"{_FILE}:{number}: {head} is listed twice")
            allowed.add(head)
            for release in rest[1:]:
                absent.setdefault(release, set()).add(head)
        else:
            raise ValueError(f"{_FILE}:{number}: cannot read {raw.strip()!r}")
    for release in [*releases, *absent]:
        if not _RELEASE.fullmatch(release):
            raise ValueError(f"{_FILE}: {release!r} is not a torch release such as 2.13")
    return (
        frozenset(allowed),
        {r: frozenset(n) for r, n in absent.items()},
        frozenset(closed),
        frozenset(table_only),
        tuple(releases),
    )


#: The overload names ("aten.add.Tensor") a file may name in a closed namespace.
#: ABSENT: release ("2.13") -> the names of ALLOWED it does not register.
#: CLOSED_NAMESPACES: torch's own namespaces (and its ecosystem's): nothing else in them resolves.
#: TABLE_ONLY: names the reference op table runs with a kernel of its own, never by name.
#: RECORDED_RELEASES: the releases whose absences the file records.
ALLOWED, ABSENT, CLOSED_NAMESPACES, TABLE_ONLY, RECORDED_RELEASES = _parse(_FILE.read_text(encoding="utf-8"))


def absent_in(release: str) -> frozenset[str] | None:
    """The names of `ALLOWED` torch ``release`` ("2.13") lacks; None when that release is not recorded."""
    if release not in RECORDED_RELEASES:
        return None
    return ABSENT.get(release, frozenset())
