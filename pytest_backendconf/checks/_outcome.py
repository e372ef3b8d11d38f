"""A check's verdict as one typed record, and the one pair of functions that turn it into JSON and back.

`run_check` (``suite``) builds a `CheckOutcome` where the check runs; the
backend host sends it to the pytest process with `outcome_to_json`, the item
keeps it in its stash, a pytest-xdist worker sends it to the controller on
its test report, and the report and gating read its ``outcome`` field. No
verdict travels as a prefix of a message: "unsupported: …" and "not
needed: …" are only how the terminal shows one (`reason_text`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping, get_args

from .._validation import check_choice, check_type, field

#: What a check can decide where it runs (before known failures are applied; those are the report's).
Outcome = Literal["passed", "failed", "unsupported", "not_needed", "skipped"]
#: Every `Outcome`, in the order of its ``Literal``.
CHECK_OUTCOMES: tuple[str, ...] = get_args(Outcome)
#: A compile error's verdicts, kept as a check's ``details.compile_error`` and counted by the report
#: (``errors.compile_errors``): the backend does not claim the node (`UnsupportedNodeError`), it claims it
#: and its compiler failed (`CompilerError`), or preprocess failed naming no node and the harness cannot tell.
COMPILE_VERDICTS = ("unsupported", "compiler_failure", "undecided")
#: The error type of a check failed at once, not run again, because its model hung or crashed in an
#: earlier check (the backend host says so; the summary counts them).
NOT_RUN_AGAIN = "BackendHostModelHung"
#: How the terminal and the report's ``reason`` show the outcomes that are skips with a meaning of their own.
_SHOWN = {"unsupported": "unsupported: ", "not_needed": "not needed: "}


class NotNeeded(Exception):
    """Nothing to check: a delegation run of a model the backend lowers whole. Counted apart from the score."""


@dataclasses.dataclass(frozen=True)
class CheckOutcome:
    """What one check decided, from where it ran to every report.

    :param outcome: the verdict (`Outcome`).
    :param message: what happened, in words: the failure's text, the rejection, the reason of a skip.
    :param details: JSON data the check returned or attached to its failure (numerics, node counts).
    :param error: ``{"type", "module", "message"}`` of the exception a failed check raised.
    :param seconds: how long the check ran where it ran (None: not measured, e.g. decided by a batch).
    :param ended: how the backend host ended when it died in the check (``returncode``, ``timed_out``,
        ``killed_because``), for the minimal reproduction.
    :param stderr: what the backend host wrote to stderr during the check.
    :param warnings: the warnings the check raised in the host (``category``, ``module``, ``message``,
        ``filename``, ``lineno``), raised again in the pytest process.
    :param rerun: the command that reruns this one comparison on the inputs a failed check saved
        (``python -m pytest_backendconf.rerun FILE …``); None: it saved none.
    :param exception: in the process that ran the check, the exception it raised (a debugger stops
        there); never serialized.
    """

    outcome: Outcome
    message: str = ""
    details: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    seconds: float | None = None
    ended: dict[str, Any] | None = None
    stderr: str = ""
    warnings: tuple[dict[str, Any], ...] = ()
    rerun: str | None = None
    exception: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.outcome not in CHECK_OUTCOMES:
            raise ValueError(f"a check's outcome is one of {', '.join(CHECK_OUTCOMES)}; got {self.outcome!r}")

    @classmethod
    def failure(cls, message: str, error_type: str, module: str, error_message: str, **kwargs: Any) -> "CheckOutcome":
        """A failed outcome whose error record is not an exception of this process (the host died, …)."""
        return cls("failed", message, error={"type": error_type, "module": module, "message": error_message}, **kwargs)


def reason_text(outcome: CheckOutcome) -> str:
    """How a skip is shown to a person: ``unsupported: <message>``, ``not needed: <message>``, or the message."""
    return _SHOWN.get(outcome.outcome, "") + outcome.message


_FIELDS = ("outcome", "message", "details", "error", "seconds", "ended", "stderr", "warnings", "rerun")


def outcome_to_json(outcome: CheckOutcome) -> dict[str, Any]:
    """The record as JSON data (the host protocol, an xdist report's attribute); defaults are left out."""
    data: dict[str, Any] = {"outcome": outcome.outcome}
    for name in _FIELDS[1:]:
        value = getattr(outcome, name)
        if value not in (None, "", ()):
            data[name] = list(value) if name == "warnings" else value
    return data


#: Each field's kind (`_validation.KINDS`), as `outcome_from_json` checks it.
_KINDS = {
    "message": "string",
    "details": "object",
    "error": "object",
    "seconds": "number",
    "ended": "object",
    "stderr": "string",
    "warnings": "list",
    "rerun": "string",
}


def outcome_from_json(data: Mapping[str, Any]) -> CheckOutcome:
    """The record `outcome_to_json` wrote; a field of the wrong type is a `ValueError` naming it."""
    try:
        check_type(data, "object", "a check outcome")
        outcome = check_choice(data.get("outcome"), CHECK_OUTCOMES, "a check outcome's outcome")
        values = {name: field(data, name, kind, "check outcome", optional=True) for name, kind in _KINDS.items()}
    except ValueError as exc:
        raise ValueError(f"{exc} (the backend host's record of a check)") from None
    values = {name: value for name, value in values.items() if value is not None}
    if "warnings" in values:
        values["warnings"] = tuple(values["warnings"])
    return CheckOutcome(outcome, **values)
