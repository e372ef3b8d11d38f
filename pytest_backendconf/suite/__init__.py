"""The pytest side of the conformance suite: items, the shared context, gating, Hypothesis, xdist.

Owns turning the categories' checks into pytest items, the per-session `SuiteContext`, the backend
host that runs checks in a child process, CI gating (known failures, reports), the Hypothesis
profiles and the xdist grouping. The categories themselves are ``pytest_backendconf.conformance``.

May import: `report`, `target`, `diagnostics` and every layer below them.
"""

from ._context import FIXED, INPUT_MODES, SuiteContext, artifacts_root, build_context
from ._gating import GatingPlugin
from ._golden import GOLDEN_KEY, GoldenRecorder, golden_dir
from ._hypothesis import PROFILES, draws_seed, hypothesis_choice
from ._outcome import run_check
from ._suite import SuitePlugin, suite_only
from ._xdist import ModelGrouping

__all__ = [
    "FIXED",
    "GOLDEN_KEY",
    "GatingPlugin",
    "GoldenRecorder",
    "INPUT_MODES",
    "ModelGrouping",
    "PROFILES",
    "SuiteContext",
    "artifacts_root",
    "SuitePlugin",
    "build_context",
    "draws_seed",
    "golden_dir",
    "hypothesis_choice",
    "run_check",
    "suite_only",
]
