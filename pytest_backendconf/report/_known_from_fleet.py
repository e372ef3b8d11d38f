"""One known-failures file from the reports of several machines: entries scoped to where their checks fail.

``backendconf report known-failures A.json B.json … -o known.toml`` reads a
report per machine of a fleet (one backend). A check failing on every
machine that ran it gets a plain entry, one passing everywhere none, and one
whose outcome differs between machines an entry scoped with ``when`` to the
machines where it fails, by the narrowest field of the reports' machine
header that separates them (a CPU flag, then torch's CPU capability, then
the architecture); when none does, a non-strict entry (``strict = false``)
whose reason names the machines. Never imports torch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import ReportError
from ._known_edit import KnownFailuresUpdate, edited_known_failures, existing_text
from ._known_failures import (
    KnownFailure,
    KnownFailureIndex,
    failure_entry,
    load_known_failures_file,
    merge_known_failures,
    when_toml,
)
from ._known_from_report import applied_entries
from ._machine import machine_line
from ._reading import read_report
from ._record import FAILED, ReportTest

_VARIES = " (its outcome varies between machines that no machine field separates: "


@dataclasses.dataclass
class _Machine:
    """One report: its file, the machine it names, and each check's verdict before known failures."""

    path: str
    machine: dict[str, Any]
    verdicts: dict[str, ReportTest]

    @property
    def label(self) -> str:
        return f"{Path(self.path).name} ({machine_line(self.machine)})"


def known_failures_from_fleet(reports: list[str], existing: Path | None) -> KnownFailuresUpdate:
    """The known-failures file of several machines' reports (its ``said``: one line per check whose outcome
    differs); an existing ``output`` is edited line by line, as `known_failures_from_report` does."""
    machines: list[_Machine] = []
    backends: set[str] = set()
    previous: list[KnownFailure] = []
    for report in reports:
        read = read_report(report)
        backends.add(read.backend)
        # Each test's own verdict: the known failures the run applied are judged anew.
        machines.append(_Machine(report, read.machine, {t.id: t.ungated() for t in read.tests}))
        previous += [e for e in applied_entries(read) if e not in previous]
    if len(backends) > 1:
        raise ReportError(
            f"the reports are of different backends ({', '.join(sorted(backends))}); one known-failures file is "
            "one backend's: pass the reports of one backend's runs on its machines"
        )
    if existing is not None:
        previous += [e for e in load_known_failures_file(existing, "-o") if e not in previous]

    ids = sorted({i for m in machines for i in m.verdicts})
    varying: dict[str, tuple[list[_Machine], list[_Machine]]] = {}
    merged: list[ReportTest] = []  # one result per check: a failure where it fails everywhere it ran
    for test_id in ids:
        ran = [m for m in machines if test_id in m.verdicts]
        failing = [m for m in ran if m.verdicts[test_id].outcome in FAILED]
        passing = [m for m in ran if m.verdicts[test_id].outcome == "passed"]
        if failing and passing:
            varying[test_id] = (failing, passing)
            merged.append(passing[0].verdicts[test_id])  # a pass: a pattern entry covering it is split
        else:
            merged.append((failing or ran)[0].verdicts[test_id])
    # An earlier entry naming checks of these reports is judged anew here: its `when` is decided below.
    index = KnownFailureIndex(previous)
    seen = {index.entries[i].pattern for test_id in ids for i in index.matching(test_id)}
    previous = [dataclasses.replace(e, when=()) if e.pattern in seen else e for e in previous]
    removed: dict[str, str] = {}
    entries = {e.pattern: e for e in merge_known_failures(merged, previous, None, removed)}

    said = []
    for test_id, (failing, passing) in varying.items():
        written = failure_entry(failing[0].verdicts[test_id])  # where it fails: its node and figures there
        prior = index.entry_for(test_id, test_id)
        reason, link = (prior.reason, prior.link) if prior is not None else (written.reason, "")
        reason = reason.split(_VARIES)[0]  # written by an earlier run of this command: said again below
        when = separating_when([m.machine for m in failing], [m.machine for m in passing])
        names = f"fails on {', '.join(m.label for m in failing)}; passes on {', '.join(m.label for m in passing)}"
        if when is not None:
            entries[test_id] = dataclasses.replace(written, reason=reason, link=link, when=when)
            said.append(f"{test_id}: {names}: scoped to where it fails, when = {when_toml(when)}")
        else:
            entries[test_id] = dataclasses.replace(
                written, reason=f"{reason}{_VARIES}{names})", link=link, strict=False
            )
            said.append(f"{test_id}: {names}: no machine field separates them, written with strict = false")
    listed = sorted(entries.values(), key=lambda e: e.pattern)
    old = existing_text(existing) if existing is not None else None
    text, rewritten = edited_known_failures(old, listed, backends.pop() if backends else "?")
    return KnownFailuresUpdate(text, listed, previous, removed, rewritten, said)


def separating_when(failing: list[dict[str, Any]], passing: list[dict[str, Any]]) -> tuple[tuple[str, Any], ...] | None:
    """The narrowest ``when`` that holds on every failing machine and on no passing one, or None.

    Tried in turn: one CPU flag (the one fewest of the machines have), torch's
    CPU capability, the architecture, then every flag the failing machines share.
    """
    common = set.intersection(*(set(m.get("cpu_flags") or ()) for m in failing))
    every = failing + passing
    singles = [f for f in common if not any(f in (m.get("cpu_flags") or ()) for m in passing)]
    if singles:
        flag = min(singles, key=lambda f: (sum(f in (m.get("cpu_flags") or ()) for m in every), f))
        return (("cpu_flags", (flag,)),)
    for key in ("cpu_capability", "machine"):
        values = {str(m.get(key) or "").lower() for m in failing}
        value = str(failing[0].get(key) or "")
        if len(values) == 1 and value and all(str(m.get(key) or "").lower() != value.lower() for m in passing):
            return ((key, value),)
    if common and not any(common <= set(m.get("cpu_flags") or ()) for m in passing):
        return (("cpu_flags", tuple(sorted(common))),)
    return None
