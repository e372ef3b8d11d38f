"""Entry point of the reference backend: registers it with pytest-backendconf.

Named in the package's ``pyproject.toml``::

    [project.entry-points.backendconf]
    reference = "backendconf_reference.plugin"
"""

import pytest_backendconf as bc

from . import ReferenceBackend


@bc.hookimpl
def backendconf_register_backends(register):
    """Provide the reference backend."""
    register(ReferenceBackend())
