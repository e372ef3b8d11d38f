"""Lowering: `to_backend`, the modules that run lowered methods, and saving and loading them.

Owns the checks of `to_backend`'s arguments, `LoweredModule` and `WrapperModule`, the checks
between a call and the backend's ``execute``, partial delegation (partitions and the CPU fallback),
`save`/`load`, which turn a module into archive records and back, and the preprocess cache
(`PreprocessCache`, ``--backendconf-cache``) that lets a rerun skip ``preprocess`` of unchanged programs.

May import: `archive`, `debuginfo`, `reference`, `registry` and the public surface.
"""

from ._args import availability, normalize, resolve_backend
from ._cache import DEFAULT_MAX_MIB as DEFAULT_CACHE_MIB
from ._cache import PreprocessCache, active_cache, program_digest, use_preprocess_cache
from ._identity import BackendIdentity, backend_identity
from ._bundling import DEFAULT_TOLERANCES, bundles
from ._lowered_module import LoweredModule, WrapperModule, debug_info, delegation, reset, state
from ._state import state_specs
from ._lowering import export_method, lower_programs, run_preprocess, to_backend
from ._partition import op_overload
from ._program_io import user_inputs, user_outputs
from ._saving import instantiate, load, save, to_bytes, to_bytes_separate

__all__ = [
    "DEFAULT_CACHE_MIB",
    "BackendIdentity",
    "PreprocessCache",
    "active_cache",
    "backend_identity",
    "program_digest",
    "use_preprocess_cache",
    "DEFAULT_TOLERANCES",
    "LoweredModule",
    "WrapperModule",
    "availability",
    "bundles",
    "debug_info",
    "delegation",
    "export_method",
    "instantiate",
    "load",
    "lower_programs",
    "normalize",
    "op_overload",
    "reset",
    "resolve_backend",
    "run_preprocess",
    "save",
    "state",
    "state_specs",
    "to_backend",
    "to_bytes",
    "to_bytes_separate",
    "user_inputs",
    "user_outputs",
]
