"""Numerics: how far a backend's outputs are from a reference, in numbers a vendor can act on.

Owns tolerances (and where each came from), the closeness of one output
(max abs and rel error, ULPs, the worst element), structure mismatches and
the report's numerics summary, and index outputs whose ties PyTorch leaves
open (sort, topk, max with indices, argmax …), judged valid or not rather
than equal. Everything that compares outputs — the
suite's checks, the divergence locator, replay on a target, rerun — judges
through here.

May import: the public surface only.
"""

from ._numerics import (
    Closeness,
    EagerError,
    StructureMismatch,
    Tolerance,
    compare_outputs,
    compare_tensor,
    resolve_tolerance,
    summary_json,
    ulp_distance,
    worst,
)
from ._ties import (
    IndexCall,
    InvalidIndices,
    TieOpen,
    settle_program_ties,
    settle_ties,
    tie_open_call,
    tie_open_outputs,
)

__all__ = [
    "Closeness",
    "EagerError",
    "IndexCall",
    "InvalidIndices",
    "StructureMismatch",
    "TieOpen",
    "Tolerance",
    "compare_outputs",
    "compare_tensor",
    "resolve_tolerance",
    "settle_program_ties",
    "settle_ties",
    "summary_json",
    "tie_open_call",
    "tie_open_outputs",
    "ulp_distance",
    "worst",
]
