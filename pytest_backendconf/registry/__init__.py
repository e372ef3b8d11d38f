"""The backend registry: a pluggy plugin manager, discovery of installed backends, validation.

May import: the public surface only.
"""

from ._registry import (
    BackendRegistry,
    RegisteredBackend,
    Source,
    active_registry,
    check_backend,
    defines_hooks,
    lookup_backend,
    register_backend,
    set_active_registry,
    source_of_module,
)

__all__ = [
    "BackendRegistry",
    "RegisteredBackend",
    "Source",
    "active_registry",
    "check_backend",
    "defines_hooks",
    "lookup_backend",
    "register_backend",
    "set_active_registry",
    "source_of_module",
]
