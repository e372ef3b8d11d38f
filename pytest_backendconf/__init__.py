"""pytest-backendconf: prove that a PyTorch delegate backend honours the contract.

A backend is registered from its own package through an entry point::

    # pyproject.toml of the vendor's package
    [project.entry-points.backendconf]
    mybackend = "mybackend.plugin"

    # mybackend/plugin.py
    import pytest_backendconf as bc

    @bc.hookimpl
    def backendconf_register_backends(register):
        register(MyBackend())

and checked with ``pytest --backend=mybackend``. The same hook works in a
``conftest.py`` or a module given with ``pytest -p``.

Names that need torch (`to_backend`, `save`, `load`, …) are loaded on first
use, so that importing this package (as pytest does for every run) stays
cheap. A backend's own code may use the helpers of `pytest_backendconf.vendor`
(`check_compile_spec_keys`, `check_functional_signature`, `AvailabilityProbe`),
the argument checks and the cached availability probe every backend repeats.
"""

from __future__ import annotations

import importlib
from typing import Any

from .registry import register_backend
from .backend import Backend, TorchScriptBackend
from .capabilities import Capabilities
from .errors import (
    ArchiveError,
    BackendConfError,
    BackendContractError,
    BackendError,
    BackendRuntimeError,
    BackendUnavailableError,
    BackendUnavailableWarning,
    CompilerError,
    CompilerFailure,
    InputSpecError,
    LoweringError,
    OperatorNotRegisteredError,
    OperatorRefusedError,
    OutputSpecError,
    RegistryError,
    StaleKnownFailureWarning,
    UnsupportedNodeError,
)
from .hookspecs import hookimpl
from ._moved import install as _install_moved

__version__ = "0.1.0"

_install_moved()  # the old import paths of moved names still work, with a DeprecationWarning (CHANGELOG.md)

# name -> module that defines it; imported on first attribute access.
_LAZY = {
    "to_backend": ".lowering",
    "LoweredModule": ".lowering",
    "WrapperModule": ".lowering",
    "debug_info": ".lowering",
    "delegation": ".lowering",
    "Delegation": ".archive",
    "DebugInfo": ".debuginfo",
    "Frame": ".debuginfo",
    "DebugHandles": ".debuginfo",
    "DebugHandleRecorder": ".debuginfo",
    "save": ".lowering",
    "bundles": ".lowering",
    "Bundle": ".archive",
    "load": ".lowering",
    "symbolicate": ".archive",
    "profile": ".diagnostics",
    "Profile": ".diagnostics",
    "read_archive": ".archive",
    "Limits": ".archive",
    "run_on_target": ".target",
    "locate_divergence": ".diagnostics",
    "failing_nodes": ".diagnostics",
    "FailingNodes": ".diagnostics",
    "NodeFailure": ".diagnostics",
    "minify": ".diagnostics",
    "ModelCase": ".cases",
    "TensorInput": ".cases",
    "AvailabilityProbe": ".vendor",
    "check_compile_spec_keys": ".vendor",
    "check_functional_signature": ".vendor",
}

__all__ = [
    "ArchiveError",
    "Backend",
    "BackendConfError",
    "BackendContractError",
    "BackendError",
    "BackendRuntimeError",
    "BackendUnavailableError",
    "BackendUnavailableWarning",
    "Capabilities",
    "CompilerError",
    "CompilerFailure",
    "InputSpecError",
    "LoweringError",
    "OperatorNotRegisteredError",
    "OperatorRefusedError",
    "OutputSpecError",
    "RegistryError",
    "StaleKnownFailureWarning",
    "TorchScriptBackend",
    "UnsupportedNodeError",
    "hookimpl",
    "register_backend",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_backendconf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
