"""Diagnostics: tools that run lowered programs to explain what a backend does.

Owns the numerics of a comparison (closeness, tolerances, worst elements), profiling by source line
and operator, the divergence locator that finds the first node whose outputs depart from eager, and
`failing_nodes`, which finds the nodes a whole-graph compiler cannot build alone.

May import: `lowering`, `archive`, `debuginfo`, `reference`, `registry` and the public surface.
"""

from ._divergence import locate_divergence, locate_in_program
from ._failing_nodes import failing_nodes
from ._numerics import StructureMismatch, Tolerance, compare_outputs, resolve_tolerance, summary_json, worst
from ._profile import Call, Profile, check_events, profile

__all__ = [
    "Call",
    "Profile",
    "StructureMismatch",
    "Tolerance",
    "check_events",
    "compare_outputs",
    "failing_nodes",
    "locate_divergence",
    "locate_in_program",
    "profile",
    "resolve_tolerance",
    "summary_json",
    "worst",
]
