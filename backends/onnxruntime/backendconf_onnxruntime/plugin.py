"""Entry point of the onnxruntime backend: registers it with pytest-backendconf.

Named in the package's ``pyproject.toml``::

    [project.entry-points.backendconf]
    onnxruntime = "backendconf_onnxruntime.plugin"
"""

import pytest_backendconf as bc

from . import OnnxRuntimeBackend


@bc.hookimpl
def backendconf_register_backends(register):
    """Provide the onnxruntime backend."""
    register(OnnxRuntimeBackend())
