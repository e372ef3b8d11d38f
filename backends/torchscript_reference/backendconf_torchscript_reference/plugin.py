"""Entry point of the TorchScript reference backend: one `TorchScriptBackend` record.

All a vendor's existing C++ backend needs is the same few lines with its own
name and library path (docs/writing-a-backend.md, "An existing TorchScript
backend").
"""

import pytest_backendconf as bc

from ._build import BACKEND_NAME, library_path


@bc.hookimpl
def backendconf_register_backends(register):
    """Provide the TorchScript reference backend (its library is built on first use)."""
    register(bc.TorchScriptBackend(name=BACKEND_NAME, library=library_path()))
