"""The suite's Hypothesis profiles (``ci``, ``dev``, ``thorough``) and its seed.

They are the suite's own settings objects, not global Hypothesis profiles,
so that a project's own profiles of the same names are left alone. Select
one with ``--backendconf-hypothesis``; the default is ``ci`` when the ``CI``
environment variable is set, else ``dev``.
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,  # backends may compile lazily on first call; time is not what we check
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    print_blob=True,
)

PROFILES = {
    # Deterministic and small: a pull request sees the same examples every run.
    "ci": settings(max_examples=6, derandomize=True, database=None, **_COMMON),
    "dev": settings(max_examples=12, **_COMMON),
    "thorough": settings(max_examples=100, **_COMMON),
}


def default_profile() -> str:
    return "ci" if os.environ.get("CI") else "dev"


def choose_seed(given: int | str | None) -> int:
    """The seed for this session: the one given with ``--hypothesis-seed``, else a fresh one."""
    if given is not None:
        return int(given)
    return random.SystemRandom().randrange(2**32)
