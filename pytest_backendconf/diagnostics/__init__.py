"""Diagnostics: tools that run lowered programs to explain what a backend does.

Owns the numerics of a comparison (closeness, tolerances, worst elements), profiling by source line
and operator, and the divergence locator that finds the first node whose outputs depart from eager.

May import: `lowering`, `archive`, `debuginfo`, `reference`, `registry` and the public surface.
"""

from ._divergence import locate_divergence, locate_in_program
from ._numerics import (
    Closeness,
    EagerError,
    StructureMismatch,
    Tolerance,
    compare_outputs,
    compare_tensor,
    resolve_tolerance,
    summary_json,
    worst,
)
from ._profile import Call, Profile, check_events, profile

__all__ = [
    "Call",
    "Closeness",
    "EagerError",
    "Profile",
    "StructureMismatch",
    "Tolerance",
    "check_events",
    "compare_outputs",
    "compare_tensor",
    "locate_divergence",
    "locate_in_program",
    "profile",
    "resolve_tolerance",
    "summary_json",
    "worst",
]
