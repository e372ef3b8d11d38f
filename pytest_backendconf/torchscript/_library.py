"""Loading a TorchScript backend's shared library, once per process, and asking it about itself."""

from __future__ import annotations

import os
import threading

import torch

from .. import _compat
from ..backend import TorchScriptBackend
from ..errors import BackendConfError

_LOADED: set[str] = set()
_LOCK = threading.Lock()


def loaded_libraries() -> frozenset[str]:
    """The libraries this process loaded through `load_library` (absolute paths)."""
    return frozenset(_LOADED)


def load_library(backend: TorchScriptBackend) -> None:
    """Load ``backend.library`` with ``torch.ops.load_library`` (once) and check that it registers ``backend.name``."""
    path = backend.library_path()
    if path is not None:
        path = os.path.abspath(path)
        with _LOCK:
            if path not in _LOADED:
                if not os.path.isfile(path):
                    raise BackendConfError(
                        f"TorchScript backend {backend.name!r}: its library {path} does not exist; build it, or "
                        "give the right path in its TorchScriptBackend(library=...)"
                    )
                try:
                    torch.ops.load_library(path)
                except OSError as exc:
                    raise BackendConfError(
                        f"TorchScript backend {backend.name!r}: loading its library {path} failed: {exc}. It must "
                        f"be built against this torch ({torch.__version__})."
                    ) from None
                _LOADED.add(path)
    if not _registered(backend.name):
        where = f"its library {path}" if path else "this process (library=None)"
        raise BackendConfError(
            f"TorchScript backend {backend.name!r} is not registered with torch by {where}: its C++ must "
            f'register torch::jit::backend<T>("{backend.name}") and '
            f'backend_preprocess_register("{backend.name}", preprocess)'
        )


def _registered(name: str) -> bool:
    try:
        _compat.torchscript_backend_class(name)
    except RuntimeError:
        return False
    return True


def backend_is_available(name: str) -> object:
    """What the C++ backend's ``is_available()`` returns, asked of a fresh instance (its library loaded)."""
    cls = _compat.torchscript_backend_class(name)
    return cls().is_available()
