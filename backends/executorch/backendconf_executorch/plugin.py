"""Entry point of the executorch backend: registers it with pytest-backendconf.

Named in the package's ``pyproject.toml``::

    [project.entry-points.backendconf]
    executorch = "backendconf_executorch.plugin"
"""

import pytest_backendconf as bc

from . import ExecuTorchBackend


@bc.hookimpl
def backendconf_register_backends(register):
    """Provide the executorch backend."""
    register(ExecuTorchBackend())
