"""The suite's Hypothesis profiles (``ci``, ``dev``, ``thorough``) and its seed.

They are the suite's own settings objects, not global Hypothesis profiles,
so that a project's own profiles of the same names are left alone. Select
one with ``--backendconf-hypothesis``; the default is ``ci`` when the ``CI``
environment variable is set, else ``dev``.
"""

from __future__ import annotations

import os
import random
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

#: The session's ``(profile, seed)``, chosen once (see `hypothesis_choice`).
CHOICE_KEY = pytest.StashKey[tuple[str, int]]()
#: The pytest-xdist ``workerinput`` key that carries the controller's choice to its workers.
WORKERINPUT_KEY = "backendconf_hypothesis"


def _profile(max_examples: int, *, derandomize: bool = False) -> settings:
    # Built on Hypothesis's own defaults, not on the settings in force: Hypothesis loads its
    # built-in `ci` profile (derandomized, no example database) by itself wherever $CI is set,
    # and `dev` or `thorough` must still draw afresh and keep the database there (a nightly
    # `thorough` job on CI runs to see new inputs, and to replay the ones that failed before).
    common = settings(
        settings.get_profile("default"),
        derandomize=derandomize,
        max_examples=max_examples,
        deadline=None,  # backends may compile lazily on first call; time is not what we check
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
        # A failure is one clean block with the suite's own reproduce line: no ``@reproduce_failure``
        # blob (a vendor cannot decorate the suite's function with it), and one error, not a group.
        print_blob=False,
        report_multiple_bugs=False,
        # No explain phase: after shrinking it runs the failing check about 160 more times (a
        # backend call each, seconds on a real engine) to annotate which inputs could vary; the
        # shrunk example, the error statistics and the saved inputs already say what failed.
        phases=[phase for phase in Phase if phase is not Phase.explain],
    )
    # Derandomized runs keep no example database: the same examples every run, nothing written.
    return settings(common, database=None) if derandomize else common


PROFILES = {
    # Deterministic and small: a pull request sees the same examples every run.
    "ci": _profile(6, derandomize=True),
    "dev": _profile(12),
    "thorough": _profile(100),
}


def default_profile() -> str:
    return "ci" if os.environ.get("CI") else "dev"


def choose_seed(given: int | str | None) -> int:
    """The seed for this session: the one given with ``--hypothesis-seed``, else a fresh one."""
    if given is not None:
        return int(given)
    return random.SystemRandom().randrange(2**32)


def draws_seed(profile: str, session_seed: int, check: str) -> int:
    """The seed a check's Hypothesis draws start from.

    A derandomized profile draws from a number made of the check's name
    alone: the same inputs in every run and on every machine, and they stay
    the same when a release of this suite only reworks the check's code.
    Hypothesis's own derandomization seeds from a hash of the test
    function's source text instead, so a refactor would draw other inputs
    and flip entries of a known-failures file recorded with the old ones.
    Other profiles draw from the session's seed (``--hypothesis-seed``).
    """
    if PROFILES[profile].derandomize:
        return zlib.crc32(check.encode())
    return session_seed


def hypothesis_choice(config: pytest.Config) -> tuple[str, int]:
    """The suite's Hypothesis profile and seed, chosen once per session and kept in ``config.stash``.

    A pytest-xdist worker takes its controller's choice, so that the seed the
    controller prints in its header reproduces the workers' runs.
    """
    if CHOICE_KEY not in config.stash:
        given = getattr(config, "workerinput", {}).get(WORKERINPUT_KEY)
        if given is not None:
            choice = (str(given[0]), int(given[1]))
        else:
            profile = config.getoption("backendconf_hypothesis") or default_profile()
            choice = (profile, choose_seed(config.getoption("hypothesis_seed", None)))
        config.stash[CHOICE_KEY] = choice
    return config.stash[CHOICE_KEY]


def chosen(config: pytest.Config) -> tuple[str, int] | None:
    """The choice if one was made this session (the report records it), else None."""
    return config.stash.get(CHOICE_KEY, None)


def report_entry(config: pytest.Config) -> dict[str, Any] | None:
    """The report's ``hypothesis`` field: the profile and seed chosen this session, or None."""
    choice = chosen(config)
    if choice is None:
        return None
    profile, seed = choice
    derandomized = bool(PROFILES[profile].derandomize) if profile in PROFILES else None
    return {"profile": profile, "seed": seed, "derandomized": derandomized}
