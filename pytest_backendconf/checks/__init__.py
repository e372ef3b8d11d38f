"""The check vocabulary: what a conformance check is, what it can decide, and how that decision travels.

Owns the `Check` record and its `Batching`, the `CheckContext` a check runs in, the categories and the stable id
(`ROOT_ID`, `id_matches`), the exceptions a check raises (`CheckFailed`,
`Unsupported`, `NotNeeded`) and its verdict, `CheckOutcome`, with its one
pair of serializers (`outcome_to_json`, `outcome_from_json`). The categories
(``conformance``), the pytest side (``suite``), the backend host and the
report all speak it; it sits below them all.

May import: the standard library only. Never torch, never pytest (the
device side and ``backendconf report`` read outcomes without either);
a name of another room for annotations only, under ``TYPE_CHECKING``.
"""

from ._context import CheckContext, ContextT
from ._check import CATEGORIES, LOWERING_STAGES, ROOT_ID, Batching, Check, CheckFailed, Unsupported, fail, id_matches
from ._outcome import (
    CHECK_OUTCOMES,
    COMPILE_VERDICTS,
    NOT_RUN_AGAIN,
    CheckOutcome,
    NotNeeded,
    Outcome,
    outcome_from_json,
    outcome_to_json,
    reason_text,
)

__all__ = [
    "CATEGORIES",
    "CHECK_OUTCOMES",
    "COMPILE_VERDICTS",
    "LOWERING_STAGES",
    "NOT_RUN_AGAIN",
    "ROOT_ID",
    "Batching",
    "Check",
    "CheckContext",
    "CheckFailed",
    "CheckOutcome",
    "ContextT",
    "NotNeeded",
    "Outcome",
    "Unsupported",
    "fail",
    "id_matches",
    "outcome_from_json",
    "outcome_to_json",
    "reason_text",
]
