"""The pytest side of the conformance suite: items, the shared context, gating, Hypothesis, xdist.

Owns turning the categories' checks into pytest items, the run's `SuiteOptions` and the per-session
`SuiteContext` built from them, the backend host that runs checks in a child process, CI gating
(known failures, reports), the Hypothesis profiles, the xdist grouping and the shards of a run
across machines. The categories themselves
are ``pytest_backendconf.conformance``.

May import: `report`, `target`, `diagnostics` and every layer below them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._context import FIXED, INPUT_MODES, SuiteContext, build_context
from ._options import SuiteOptions, artifacts_root, options_from_json, options_to_json, suite_options
from ._failure_text import notes_before_hypothesis
from ._golden import GOLDEN_KEY, GoldenRecorder, golden_dir
from ._preprocess_cache import CACHE_KEY, CacheChoice, cache_choice, install_cache
from ._hypothesis import PROFILES, draws_seed, hypothesis_choice
from ._outcome import run_check

if TYPE_CHECKING:
    from ._gating import GatingPlugin
    from ._suite import SuitePlugin, suite_only
    from ._xdist import ModelGrouping
    from ._shards import SHARD_KEY, ShardPlugin, shard_choice, shard_group

# The pytest plugins load on first use: they import the categories (``conformance``), and the
# categories import the names above, so an eager import here would be a cycle.
_LAZY = {
    "GatingPlugin": "._gating",
    "ModelGrouping": "._xdist",
    "SHARD_KEY": "._shards",
    "ShardPlugin": "._shards",
    "shard_choice": "._shards",
    "shard_group": "._shards",
    "SuitePlugin": "._suite",
    "suite_only": "._suite",
}

__all__ = [
    "CACHE_KEY",
    "CacheChoice",
    "cache_choice",
    "install_cache",
    "FIXED",
    "GOLDEN_KEY",
    "GatingPlugin",
    "GoldenRecorder",
    "INPUT_MODES",
    "ModelGrouping",
    "PROFILES",
    "SHARD_KEY",
    "ShardPlugin",
    "SuiteContext",
    "SuiteOptions",
    "SuitePlugin",
    "artifacts_root",
    "build_context",
    "draws_seed",
    "golden_dir",
    "hypothesis_choice",
    "notes_before_hypothesis",
    "options_from_json",
    "options_to_json",
    "run_check",
    "shard_choice",
    "shard_group",
    "suite_only",
    "suite_options",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
