"""The TorchScript reference backend: a C++ backend for ``torch._C._jit_to_backend``.

Its source is ``csrc/reference_backend.cpp``; `library_path` builds it with
``torch.utils.cpp_extension`` on first use (about 30 s, in a child process so
that the caller never loads it) and caches the shared library (see `_build`).
"""

from ._build import BACKEND_NAME, CACHE_ENV, broken_library_path, cache_dir, cache_root, library_path

__all__ = ["BACKEND_NAME", "CACHE_ENV", "broken_library_path", "cache_dir", "cache_root", "library_path"]
