"""Entry point of the openvino backend: registers it with pytest-backendconf.

Named in the package's ``pyproject.toml``::

    [project.entry-points.backendconf]
    openvino = "backendconf_openvino.plugin"
"""

import pytest_backendconf as bc

from . import OpenVinoBackend


@bc.hookimpl
def backendconf_register_backends(register):
    """Provide the openvino backend."""
    register(OpenVinoBackend())
