"""A report's test as one typed record, the outcome sets it uses, and its one pair of serializers.

The record's journey: the suite's gating plugin builds one `ReportTest` per
phase of a conformance item (the check's `CheckOutcome` and what pytest made
of it), sends it to a pytest-xdist controller as `ReportTest.to_json` on the
phase's report, and combines the phases (`combined`); the JSON report
writes `to_json` of each, and every reader of a report — the summary,
``report gate``, the HTML page, merge, shards, the ops matrix, known
failures from a report or a fleet — reads it back with `from_json`, checked
field by field. A record keeps the test's own ``verdict`` (what it was
before known failures applied) beside its gated ``outcome``, so a gate
judges a report again from the verdict, never by undoing the gating.
Never imports torch or pytest.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, cast, get_args

from .._validation import check_choice, check_type, field
from ..checks import CHECK_OUTCOMES, CheckFailed

#: What a conformance test is in a gated run's report.
ReportOutcome = Literal["passed", "skipped", "unsupported", "known_failure", "unexpected_pass", "failed", "error"]
#: Every `ReportOutcome`, mildest first: of a test's phases, the worst decides its outcome.
OUTCOMES: tuple[str, ...] = get_args(ReportOutcome)
#: What a test was before known failures applied (a `ReportOutcome` without the two that only a
#: known-failures entry makes).
Verdict = Literal["passed", "skipped", "unsupported", "failed", "error"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
#: The outcomes of a test that did not work (what a known-failures file lists).
FAILING = ("failed", "error", "known_failure")
#: The outcomes in which a check worked (a change between these and `FAILING` is a flip).
PASSING = ("passed", "unexpected_pass")
#: The outcomes that fail a gated run (pytest's exit status 1).
BREAKING = ("failed", "error", "unexpected_pass")
#: The verdicts a known-failures entry leaves as they are.
SKIPS = ("skipped", "unsupported")
#: The verdicts of a test that did not work (listed, each is a ``known_failure``).
FAILED = ("failed", "error")


#: The verdicts each gated outcome can come from (any other outcome comes only from itself).
_GATED_FROM = {"known_failure": FAILED, "unexpected_pass": ("passed",)}


def gated_outcome(verdict: str, listed: bool, strict: bool = True) -> ReportOutcome:
    """What a test whose check ended ``verdict`` (passed, failed, error, skipped, unsupported) is in a gated run.

    Listed in the known failures, a failure is a ``known_failure`` and a pass
    an ``unexpected_pass`` (which fails the run: the entry is out of date),
    unless the entry is non-strict (``strict = false``: its outcome varies by
    its reason's account), when a pass is a pass; a skip is a skip either way.
    """
    check_choice(verdict, VERDICTS, "a test's verdict")
    if not listed or verdict in SKIPS:
        return verdict  # type: ignore[return-value]
    if verdict in FAILED:
        return "known_failure"
    return "unexpected_pass" if strict else "passed"


@dataclasses.dataclass(frozen=True)
class ReportTest:
    """One conformance test as a report holds it (all its phases combined).

    :param outcome: what it is in the gated run (`ReportOutcome`).
    :param verdict: what it was before known failures applied (`Verdict`).
    :param known_failure: the known-failures entry that listed it (`KnownFailure.as_json`), or None.
    :param details: what the check returned, numerics included (the report keeps those apart).
    :param reproduction: a failure's minimal reproduction (``script``, ``inputs``, ``nodes``, ``ops``, …).
    :param check_outcome: the check's own `CheckOutcome.outcome`; None where no check ran (a setup error).
    :param rerun: the command that reruns the failed comparison on the inputs the check saved.
    """

    __test__ = False  # not a pytest test class

    id: str
    category: str
    outcome: ReportOutcome
    verdict: Verdict
    case: str | None = None
    stage: str = ""
    reproduce: str = ""
    duration: float = 0.0
    error: dict[str, str] | None = None
    reason: str | None = None
    known_failure: dict[str, Any] | None = None
    details: dict[str, Any] | None = None
    reproduction: dict[str, Any] | None = None
    check_outcome: str | None = None
    rerun: str | None = None

    def __post_init__(self) -> None:
        check_choice(self.outcome, OUTCOMES, f"{self.id}: outcome")
        check_choice(self.verdict, VERDICTS, f"{self.id}: verdict")
        # Only a known-failures entry makes an outcome other than the verdict; a gate starts from the verdict,
        # so a report whose two disagree any other way was edited, and is not judged.
        if self.verdict not in _GATED_FROM.get(self.outcome, (self.outcome,)):
            raise ValueError(
                f"{self.id}: outcome {self.outcome} cannot come from verdict {self.verdict} (a listed failure is a "
                "known_failure, a listed pass an unexpected_pass or, non-strict, a pass; nothing else changes)"
            )
        if self.check_outcome is not None:
            check_choice(self.check_outcome, CHECK_OUTCOMES, f"{self.id}: check_outcome")

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING

    @property
    def breaking(self) -> bool:
        return self.outcome in BREAKING

    @property
    def not_needed(self) -> bool:
        """A check with nothing to check (a delegation run of a model lowered whole): shown skipped, not scored."""
        return self.outcome == "skipped" and self.check_outcome == "not_needed"

    def rerun_command(self) -> str | None:
        """A failure's rerun command: the saved comparison's where the check saved its inputs, else
        `reproduce` (the check again, drawing the same inputs); None for a test that did not fail."""
        if not self.failing:
            return None
        return self.rerun or self.reproduce

    def first_line(self) -> str:
        """The failure's first line, whole, as a known-failures reason (`_failure_facts.reason_of`)."""
        from ._failure_facts import reason_of

        return reason_of(self.error, self.outcome, CheckFailed.__name__)

    def ungated(self) -> ReportTest:
        """The test as a run without known failures would have reported it."""
        return dataclasses.replace(self, outcome=self.verdict, known_failure=None)

    def to_json(self) -> dict[str, Any]:
        """The report's ``tests[]`` entry (docs/ci-gating.md): numerics apart from the other details."""
        rest = {k: v for k, v in (self.details or {}).items() if k != "numerics"}
        return {
            "id": self.id,
            "category": self.category,
            "case": self.case,
            "stage": self.stage,
            "outcome": self.outcome,
            "verdict": self.verdict,
            "duration": round(self.duration, 6),
            "error": self.error,
            "reason": self.reason,
            "known_failure": self.known_failure,
            "reproduce": self.reproduce,
            "rerun": self.rerun_command(),
            **({"details": rest} if rest else {}),
            "numerics": (self.details or {}).get("numerics"),
            "reproduction": self.reproduction,
            "check_outcome": self.check_outcome,
        }

    @classmethod
    def from_json(cls, given: object, where: str = "test") -> ReportTest:
        """The record `to_json` wrote, every field checked; a `ValueError` names the field (``where.key``).

        A report before schema 1.8 has no ``verdict``: it is the gated outcome
        undone, the one place that still knows how (a known failure failed in
        its check, or outside it when no check ran; an unexpected pass passed).
        """
        data: dict[str, Any] = check_type(given, "object", where)
        test_id = field(data, "id", "string", where)
        outcome = check_choice(data.get("outcome"), OUTCOMES, f"{where}.outcome ({test_id})")
        check_outcome = data.get("check_outcome")
        if check_outcome is not None:
            check_choice(check_outcome, CHECK_OUTCOMES, f"{where}.check_outcome")
        verdict = data.get("verdict")
        if verdict is None:
            verdict = _verdict_before_1_8(outcome, check_outcome)
        check_choice(verdict, VERDICTS, f"{where}.verdict")
        error = field(data, "error", "object", where, optional=True)
        if error is not None:
            for key in ("type", "message"):
                field(error, key, "string", f"{where}.error")
            field(error, "module", "string", f"{where}.error", optional=True)
        known = field(data, "known_failure", "object", where, optional=True)
        if known is not None:
            for key in ("pattern", "reason", "link"):
                field(known, key, "string", f"{where}.known_failure", optional=True)
        details = dict(field(data, "details", "object", where, optional=True) or {})
        numerics = field(data, "numerics", "object", where, optional=True)
        if numerics is not None:
            details["numerics"] = numerics  # the record holds them together, as the check returned them
        duration = field(data, "duration", "seconds", where, optional=True)
        reproduce = field(data, "reproduce", "string", where, optional=True) or ""
        # `to_json` writes a failure's reproduce command as its rerun when the check saved no comparison.
        rerun = field(data, "rerun", "string", where, optional=True)
        try:
            return cls(
                id=test_id,
                category=field(data, "category", "string", where),
                outcome=outcome,
                verdict=verdict,
                case=field(data, "case", "string", where, optional=True),
                stage=field(data, "stage", "string", where, optional=True) or "",
                reproduce=reproduce,
                duration=float(duration or 0.0),
                error=error,
                reason=field(data, "reason", "string", where, optional=True),
                known_failure=known,
                details=details or None,
                reproduction=field(data, "reproduction", "object", where, optional=True),
                check_outcome=check_outcome,
                rerun=None if rerun == reproduce else rerun,
            )
        except ValueError as exc:  # the record's own consistency (its outcome and verdict)
            raise ValueError(f"{where}: {exc}") from None


def _verdict_before_1_8(outcome: str, check_outcome: str | None) -> Verdict:
    if outcome == "known_failure":
        return "error" if check_outcome is None else "failed"
    if outcome == "unexpected_pass":
        return "passed"
    return cast(Verdict, outcome)  # any other outcome is its own verdict; the caller checks it is one


def combined(earlier: ReportTest | None, phase: ReportTest) -> ReportTest:
    """A test's record with one more phase (setup, call, teardown) added: the worst phase decides the
    outcome, verdict, error and reason; what a phase recorded (details, reproduction, the entry, the
    check's own outcome and rerun command) is kept from the last phase that recorded it; durations add up."""
    if earlier is None:
        return phase
    worst = phase if OUTCOMES.index(phase.outcome) > OUTCOMES.index(earlier.outcome) else earlier
    return dataclasses.replace(
        earlier,
        outcome=worst.outcome,
        verdict=worst.verdict,
        error=worst.error,
        reason=worst.reason,
        duration=earlier.duration + phase.duration,
        details=phase.details if phase.details is not None else earlier.details,
        reproduction=phase.reproduction if phase.reproduction is not None else earlier.reproduction,
        known_failure=phase.known_failure if phase.known_failure is not None else earlier.known_failure,
        check_outcome=phase.check_outcome if phase.check_outcome is not None else earlier.check_outcome,
        rerun=phase.rerun or earlier.rerun,
    )


def from_entries(given: object, where: str = "tests") -> list[ReportTest]:
    """The records of a report's ``tests`` list; an id listed twice is a `ValueError` too."""
    tests: list[object] = check_type(given, "list", where)
    records, seen = [], set()
    for i, entry in enumerate(tests):
        record = ReportTest.from_json(entry, f"{where}[{i}]")
        if record.id in seen:
            raise ValueError(f"{where}[{i}]: check {record.id!r} is listed twice")
        seen.add(record.id)
        records.append(record)
    return records
