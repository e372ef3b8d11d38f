"""Shards of one run: what a shard's report records, the durations an earlier report gives, the joined report.

A ``--backendconf-shard=K/N`` run records in its report's ``run.shard`` which
shard it was, the checks it was given, and the size and digest of the whole
collection it was cut from (`shard_entry`). ``backendconf report merge
--output`` joins the N reports into the one an unsharded run would have
written (`join_shards`): it refuses reports of different backends or torch
builds, of different collections, and a check that two shards ran, and it
names the checks no shard ran. Never imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping

from .._validation import KINDS, check_type, field
from ..checks import CATEGORIES
from ..errors import ReportError
from ._counts import category_counts
from ._reading import Report, read_report
from ._report import REPORT_SCHEMA_VERSION, error_counts, score_line

#: A number of seconds as a report writes one: finite, >= 0 (JSON's parser admits NaN and Infinity).
_seconds = KINDS["seconds"][0]


def suite_digest(ids: Iterable[str]) -> str:
    """A digest of a collection's check ids, whatever their order: shards of one run carry the same one."""
    return "sha256:" + hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def shard_entry(
    index: int, count: int, checks: Iterable[str], suite: Iterable[str], balanced_by: str
) -> dict[str, Any]:
    """The report's ``run.shard``: this shard, its checks, and the collection they were cut from.

    Each shard lists only its own ids, so N reports hold the collection's ids
    once between them; the collection's size and digest let the merge tell
    whether a whole shard's report is missing, and how many checks it held.
    """
    suite = list(suite)
    return {
        "index": index,
        "count": count,
        "balanced_by": balanced_by,
        "suite_checks": len(suite),
        "suite_digest": suite_digest(suite),
        "checks": sorted(checks),
    }


def read_durations(path: str | Path) -> dict[str, float]:
    """``{check id: seconds}`` of a ``--backendconf-report`` file; a `ReportError` names the file and the fix."""
    return {test.id: test.duration for test in read_report(path).tests}


def median_duration(durations: Mapping[str, float]) -> float:
    """What a check the earlier report does not list is taken to cost (1 s when it lists none)."""
    return statistics.median(durations.values()) if durations else 1.0


# --- joining the shards of one run ---------------------------------------------------------


@dataclasses.dataclass
class Joined:
    """The report an unsharded run would have written, and what the shards did not run."""

    document: dict[str, Any]
    #: The checks a present shard was given but did not report (an interrupted shard, -x, a crash).
    not_run: list[str]
    #: The shards of the run with no report among those joined (1-based), and how many checks they held.
    missing_shards: list[int]
    missing_checks: int

    @property
    def complete(self) -> bool:
        return not self.not_run and not self.missing_shards and not self.missing_checks


@dataclasses.dataclass(frozen=True)
class _Shard:
    name: str
    index: int
    count: int
    suite_checks: int
    suite_digest: str
    checks: list[str]


def _shard_of(report: Report) -> _Shard:
    shard = report.section("run").get("shard")
    name = report.path
    if shard is None:
        raise ReportError(
            f"report {name!r} is not a shard's report (its run.shard is empty): --output joins the reports of "
            "--backendconf-shard=K/N runs; merge whole runs without --output to compare them side by side"
        )
    try:
        checks = field(shard, "checks", "list", "run.shard")
        for i, check in enumerate(checks):
            check_type(check, "string", f"run.shard.checks[{i}]")
        index, count = field(shard, "index", "integer", "run.shard"), field(shard, "count", "integer", "run.shard")
        suite_checks = field(shard, "suite_checks", "count", "run.shard")
        digest = field(shard, "suite_digest", "string", "run.shard")
    except ValueError as exc:
        raise ReportError(f"report {name!r}: {exc}; pass the file --backendconf-report wrote") from None
    if not 1 <= index <= count:
        raise ReportError(f"report {name!r}: run.shard is {index}/{count}; a shard is K/N with 1 <= K <= N")
    return _Shard(name, index, count, suite_checks, digest, checks)


def join_shards(shards: list[Report]) -> Joined:
    """Join the reports (`read_report`) of the shards of one run: one backend, one torch build.

    :raises ReportError: the reports are of different backends, torch builds,
        shard counts or collections; one shard is given twice; a check was run
        by two shards.
    """
    reports = [(report, report.document, _shard_of(report)) for report in shards]
    if not reports:
        raise ReportError("no shard reports to join: pass the --backendconf-report files of the shards")
    first, _, lead = reports[0]
    for report, report_document, shard in reports[1:]:
        for what, ours, theirs in (
            ("backend", (first.backend, first.backend_version), (report.backend, report.backend_version)),
            ("torch build", first.torch, report.torch),
        ):
            if ours != theirs:
                raise ReportError(
                    f"reports {first.path!r} and {report.path!r} are of different {what}s ({_text(ours)} and "
                    f"{_text(theirs)}): join the shards of one backend under one torch; compare runs with "
                    "`backendconf report merge` without --output"
                )
        profiles = [(d.get("hypothesis") or {}).get("profile") for d in (reports[0][1], report_document)]
        if profiles[0] != profiles[1]:
            raise ReportError(
                f"reports {first.path!r} and {report.path!r} ran different Hypothesis profiles ({profiles[0]} and "
                f"{profiles[1]}): run every shard with the same --backendconf-hypothesis"
            )
        if (shard.count, shard.suite_checks, shard.suite_digest) != (lead.count, lead.suite_checks, lead.suite_digest):
            raise ReportError(
                f"reports {first.path!r} and {report.path!r} are shards of different runs ({lead.count} shards of "
                f"{lead.suite_checks} checks, {lead.suite_digest[:19]}…, and {shard.count} shards of "
                f"{shard.suite_checks} checks, {shard.suite_digest[:19]}…): join the shards of one command line, "
                "run with the same options, selection and --backendconf-durations file"
            )
    by_index: dict[int, str] = {}
    ran_in: dict[str, str] = {}
    for report, _, shard in reports:
        if shard.index in by_index:
            raise ReportError(
                f"shard {shard.index}/{shard.count} is given twice ({by_index[shard.index]!r} and {report.path!r}): "
                "pass each shard's report once"
            )
        by_index[shard.index] = report.path
        for test in report.tests:
            if test.id in ran_in:
                raise ReportError(
                    f"check {test.id!r} ran in two shards ({ran_in[test.id]!r} and {report.path!r}): the shards "
                    "were not cut from one collection (different options or plugins?); run them again with the "
                    "same command line"
                )
            ran_in[test.id] = report.path
    reports.sort(key=lambda r: r[2].index)
    assigned = [c for _, _, shard in reports for c in shard.checks]
    if len(set(assigned)) != len(assigned):
        raise ReportError("the shards' reports give one check to two shards: run them again with the same command line")
    missing_shards = sorted(set(range(1, lead.count + 1)) - set(by_index))
    if not missing_shards and (len(assigned) != lead.suite_checks or suite_digest(assigned) != lead.suite_digest):
        raise ReportError(
            f"the {lead.count} shards' check lists do not add up to the collection they name ({lead.suite_checks} "
            "checks): the reports were edited or written by different versions; run the shards again"
        )
    not_run = [c for c in assigned if c not in ran_in]
    document = _joined_document(reports)
    joined = Joined(document, not_run, missing_shards, max(0, lead.suite_checks - len(assigned)))
    broken = any(t.breaking for report, _, _ in reports for t in report.tests)
    document["run"]["exit_status"] = 0 if joined.complete and not broken else 1
    return joined


def _joined_document(reports: list[tuple[Report, dict[str, Any], _Shard]]) -> dict[str, Any]:
    from ._ops import ops_matrix

    documents = [document for _, document, _ in reports]
    first = documents[0]
    tests = [test for report, _, _ in reports for test in report.tests]
    categories = list(CATEGORIES) + sorted({c for d in documents for c in d["summary"]} - set(CATEGORIES))
    supported = ((first["backend"].get("capabilities") or {}) if isinstance(first["backend"], dict) else {}).get(
        "supported_ops"
    )
    runs = [document["run"] for document in documents]
    known = _joined_known_failures([d.get("known_failures") for d in documents])
    return {
        **first,
        "schema_version": list(REPORT_SCHEMA_VERSION),
        "run": {
            **runs[0],
            "started": min(str(r.get("started")) for r in runs),
            # The shards ran side by side: the run took as long as the longest.
            "duration": max((r["duration"] for r in runs if _seconds(r.get("duration"))), default=None),
            "shard": None,
            "shards": [
                {
                    "index": shard.index,
                    "count": shard.count,
                    "report": report.path,
                    "checks": len(shard.checks),
                    "exit_status": report.exit_status,
                    "duration": d if _seconds(d := document["run"].get("duration")) else None,
                }
                for report, document, shard in reports
            ],
        },
        "hypothesis": _joined_hypothesis([d.get("hypothesis") for d in documents]),
        "known_failures": known,
        "summary": category_counts(tests, categories),
        "errors": error_counts(tests),
        "ops": ops_matrix(tests, supported if isinstance(supported, list) else None),
        "tests": [test.to_json() for test in tests],
    }


def _joined_hypothesis(entries: list[object]) -> object:
    """The shards' profile; their seeds, in shard order, when they drew different ones (no one seed is the run's)."""
    first = entries[0]
    if not isinstance(first, dict) or all(e == first for e in entries):
        return first
    return {**first, "seed": None, "shard_seeds": [e.get("seed") if isinstance(e, dict) else None for e in entries]}


def _joined_known_failures(entries: list[object]) -> dict[str, Any] | None:
    """The known-failures file the shards applied; an entry is stale when it matched a check in none of them."""
    given = [e for e in entries if isinstance(e, dict)]
    if not given:
        return None
    stale = set.intersection(*(set(e.get("stale") or []) for e in given))
    return {**given[0], "stale": sorted(stale)}


def _text(value: object) -> str:
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value if v is not None)
    return str(value)


def joined_score_lines(document: Mapping[str, Any]) -> list[str]:
    """The score line of each category the joined report holds checks of."""
    return [score_line(c, counts) for c, counts in document["summary"].items() if counts["total"]]
