"""Diagnostics: tools that run lowered programs to explain what a backend does.

Owns profiling by source line and operator, the divergence locator that finds the first node
whose outputs depart from eager, `failing_nodes` (the nodes a whole-graph compiler cannot build
alone), `judge_layers` (a quantized program's layers, each run alone against eager), and the minimiser that shrinks a failing program and writes it as a standalone script.
How far outputs are from a reference is `numerics`' (below).

May import: `target` (the minimiser runs its candidates in a child process), `lowering`, `archive`,
`debuginfo`, `reference`, `registry`, `numerics`, `quant`, `allowlist` and the public surface.
"""

from ._divergence import locate_divergence, locate_in_program
from ._failing_nodes import FailingNodes, NodeFailure, failing_nodes
from ._layers import Layer, LayerVerdict, judge_layers
from ._minify import DEFAULT_BUDGET, Candidate, Outcome, Reproduction, minify, same_failure
from ._profile import Call, Profile, check_events, profile
from ._profile_target import profile_on_target
from ._repro_script import script_stem, write_script

__all__ = [
    "DEFAULT_BUDGET",
    "Call",
    "Candidate",
    "FailingNodes",
    "NodeFailure",
    "Outcome",
    "Reproduction",
    "Profile",
    "profile_on_target",
    "check_events",
    "failing_nodes",
    "judge_layers",
    "Layer",
    "LayerVerdict",
    "locate_divergence",
    "locate_in_program",
    "minify",
    "profile",
    "same_failure",
    "script_stem",
    "write_script",
]
