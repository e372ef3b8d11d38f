"""The TorchScript reference backend: a C++ backend for ``torch._C._jit_to_backend``.

Its source is ``csrc/reference_backend.cpp``; `library_path` builds it with
``torch.utils.cpp_extension`` on first use (about 30 s, in a child process so
that the caller never loads it) and caches the shared library (see `_build`).

Stateful programs (buffers a method writes, docs/backend-contract.md, "State") are not part of the
TorchScript form: ``torch._C._jit_to_backend`` hands ``preprocess`` a scripted module, not an exported
program, so there is no functionalized state for the lowering to pass through ``execute``, and this
compiler reads a module's buffers as constants when it compiles. A stateful model is lowered with
``bc.to_backend`` to an exported-program backend (the reference backend runs it).
"""

from ._build import BACKEND_NAME, CACHE_ENV, broken_library_path, cache_dir, cache_root, library_path

__all__ = ["BACKEND_NAME", "CACHE_ENV", "broken_library_path", "cache_dir", "cache_root", "library_path"]
