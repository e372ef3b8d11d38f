"""The hooks through which a package, a plugin or a ``conftest.py`` adds backends and models.

Implement them with :data:`pytest_backendconf.hookimpl` (or, in a
``conftest.py`` or ``-p`` plugin, as plain functions with these names).
They belong to the ``"backendconf"`` plugin manager, not to pytest's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

if TYPE_CHECKING:
    from .cases import ModelCase

PROJECT_NAME = "backendconf"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def backendconf_register_backends(register: Callable[[object], None]) -> None:
    """Register the backends this plugin provides.

    Call ``register(backend)`` once per backend object. The object needs a
    ``name`` matching ``[a-z][a-z0-9_]*`` and the four methods of
    docs/backend-contract.md (``is_available``, ``preprocess``, ``compile``, ``execute``); it is
    checked on registration, and a malformed one is an error that names the
    object and what it lacks.

    :param register: Call it with each backend object. Registering one name
        from two plugins is an error naming both.

    Called once per registry; the same object may be asked again by a fresh
    registry (for example in the target-side subprocess), so keep it cheap:
    create the backend object, do not probe the device here.
    """


@hookspec
def backendconf_register_cases(register: Callable[["ModelCase"], None]) -> None:
    """Add models to the conformance suite: the regression side, for a vendor's own models.

    Call ``register(case)`` with a :class:`pytest_backendconf.ModelCase` per
    model. Registered cases run through every parity, serialization and
    availability check exactly like the built-in model zoo, for every backend
    selected with ``--backend``.

    :param register: Call it with each case; case names must be unique
        across the zoo and all plugins.
    """
