"""Entry point of the iree backend: registers it with pytest-backendconf.

Named in the package's ``pyproject.toml``::

    [project.entry-points.backendconf]
    iree = "backendconf_iree.plugin"
"""

import pytest_backendconf as bc

from . import IreeBackend


@bc.hookimpl
def backendconf_register_backends(register):
    """Provide the iree backend."""
    register(IreeBackend())
