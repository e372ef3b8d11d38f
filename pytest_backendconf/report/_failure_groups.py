"""One root cause, one group: failures whose messages share a template, counted together.

A template is the exception type and the message's first line with the
parts that vary between checks of one defect masked: numbers, quoted
names, op overloads, paths and ids. Forty ops checks failing with
"aten.sub.Tensor in float16 …: max abs error 0.031" become one line with
its count and the first few ids, printed before pytest's own list. Dtypes
are kept as written (a backend wrong in float16 only, or returning float32
for float16, is told by them), and a count stays a count: ``4/6 nodes``
reads ``<n>/<n> nodes``, not as a path.
Failures whose minimal reproductions are the same program (the same
operator sequence) are named together too: one defect, seen by several
checks or models.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from ._record import ReportTest
from ._words import counted

#: How many ids each group shows.
FIRST_IDS = 3
#: The group of the checks listed as known failures that passed (a strict entry out of date).
UNEXPECTED_PASS = "unexpected pass: a listed known failure passes now"
_MASKS = [
    (re.compile(r"backendconf::\S+"), "<id>"),
    # A path starts a word: the "/6" of "4/6 nodes" is a fraction's, not a folder's.
    (re.compile(r"(?<![\w)\]])(?:/[\w.+-]+)+/?|\b[\w.-]+\.py\b"), "<path>"),
    (re.compile(r"'[^'\s]*'|\"[^\"\s]*\""), "<name>"),
    (re.compile(r"\b[a-z_][a-z0-9_]*(?:::|\.)[a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?\b"), "<op>"),
    # Not the digits of a word: float16, int8 and conv2d stay as they are.
    (re.compile(r"(?<![A-Za-z_\d])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|\binf\b|\bnan\b"), "<n>"),
]


def template(kind: str, message: str) -> str:
    """``CheckFailed: <op> in float16 (sample <n> …`` for a failure's type and message."""
    first = (message.strip().splitlines() or [""])[0]
    for pattern, mask in _MASKS:
        first = pattern.sub(mask, first)
    return f"{kind}: {first}" if first else kind


@dataclasses.dataclass
class FailureGroup:
    template: str
    ids: list[str]


def group_failures(failures: Iterable[ReportTest]) -> list[FailureGroup]:
    """Groups of failed tests by their error's template, largest first (ties: first seen)."""
    groups: dict[str, FailureGroup] = {}
    for failure in failures:
        error = failure.error or {}
        if not error and failure.outcome == "unexpected_pass":
            key = UNEXPECTED_PASS  # no error to template: the check passed
        else:
            key = template(str(error.get("type", "failure")), str(error.get("message", "")))
        groups.setdefault(key, FailureGroup(key, [])).ids.append(failure.id)
    return sorted(groups.values(), key=lambda g: -len(g.ids))


def summary_lines(groups: list[FailureGroup]) -> list[str]:
    """The terminal lines: each group once, with its count and its first few ids."""
    lines = []
    for group in groups:
        shown = ", ".join(group.ids[:FIRST_IDS]) + (", …" if len(group.ids) > FIRST_IDS else "")
        lines.append(f"{len(group.ids)} × {group.template}")
        lines.append(f"    {shown}")
    return lines


def same_program_groups(failures: Iterable[ReportTest]) -> list[FailureGroup]:
    """Failures whose minimal reproductions have the same operator sequence, two or more to a group.

    The group's ``template`` is the sequence (``aten::gelu``), largest group first.
    """
    groups: dict[tuple[str, ...], FailureGroup] = {}
    for failure in failures:
        reproduction = failure.reproduction or {}
        ops = reproduction.get("ops")
        if not reproduction.get("script") or not isinstance(ops, list) or not ops:
            continue
        key = tuple(str(op) for op in ops)
        groups.setdefault(key, FailureGroup(" → ".join(key), [])).ids.append(failure.id)
    return sorted((g for g in groups.values() if len(g.ids) > 1), key=lambda g: -len(g.ids))


def same_program_lines(groups: list[FailureGroup]) -> list[str]:
    """``3 failures minimise to the same program (aten::gelu):`` and their first few ids."""
    lines = []
    for group in groups:
        shown = ", ".join(group.ids[:FIRST_IDS]) + (", …" if len(group.ids) > FIRST_IDS else "")
        lines.append(f"{counted(len(group.ids), 'failure')} minimise to the same program ({group.template}):")
        lines.append(f"    {shown}")
    return lines
