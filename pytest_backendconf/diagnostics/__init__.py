"""Diagnostics: tools that run lowered programs to explain what a backend does.

Owns the numerics of a comparison (closeness, tolerances, worst elements), profiling by source line
and operator, the divergence locator that finds the first node whose outputs depart from eager, and
`failing_nodes`, which finds the nodes a whole-graph compiler cannot build alone;
the minimiser that shrinks a failing program to a small one and writes it as a standalone script.

May import: `target` (the minimiser runs its candidates in a child process), `lowering`, `archive`,
`debuginfo`, `reference`, `registry` and the public surface.
"""

from ._divergence import locate_divergence, locate_in_program
from ._failing_nodes import failing_nodes
from ._minify import DEFAULT_BUDGET, Candidate, Outcome, Reproduction, minify, same_failure
from ..numerics import (
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
from ._repro_script import script_stem, write_script

__all__ = [
    "DEFAULT_BUDGET",
    "Call",
    "Candidate",
    "Outcome",
    "Reproduction",
    "Closeness",
    "EagerError",
    "Profile",
    "StructureMismatch",
    "Tolerance",
    "check_events",
    "compare_outputs",
    "failing_nodes",
    "compare_tensor",
    "locate_divergence",
    "locate_in_program",
    "minify",
    "profile",
    "resolve_tolerance",
    "same_failure",
    "script_stem",
    "summary_json",
    "worst",
    "write_script",
]
