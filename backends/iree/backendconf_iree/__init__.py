"""An IREE backend for pytest-backendconf: torch.export programs compiled by IREE for the CPU.

``preprocess`` imports each method's program with IREE's own FX importer
(what iree-base-compiler ships) and compiles it with ``iree-compile`` to a
VM module (``.vmfb``) for the ``llvm-cpu`` target on the generic x86-64 CPU
(``compiler``, host only). ``compile`` loads the module with
``iree.runtime`` on the ``local-sync`` driver and ``execute`` calls it
(``runtime``, target side). Check it with::

    pytest --backend=iree --backendconf-known-failures=backends/iree/known-failures.toml

A compiler error on an op IREE has no lowering for is ``UnsupportedNodeError``
at the node; any other (a verifier or linker error, a crash) at a node the
diagnostics name is ``CompilerError`` there: IREE broke on something it
claims, a failure of the check (README.md, "Compile errors").

This module stays importable without IREE (``is_available`` then says why):
it imports ``compiler`` only inside ``preprocess`` and ``runtime`` only
where a method is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest_backendconf as bc
from pytest_backendconf.vendor import EngineBackend

__version__ = "0.1.0"
__all__ = ["IreeBackend"]

#: The recipe that installs IREE beside the torch you have (neither wheel names torch).
INSTALL_HINT = "pip install iree-base-compiler==3.13.0 iree-base-runtime==3.13.0"


class IreeBackend(EngineBackend):
    """The delegate-backend protocol (docs/writing-a-backend.md) over IREE's compiler and runtime."""

    name = "iree"
    version = __version__
    runtime_module = "backendconf_iree.runtime"
    capabilities = bc.Capabilities(
        # None: what IREE lowers moves with its version; the suite finds out
        # by trying, and preprocess rejects at the FX node the compiler names.
        supported_ops=None,
        dtypes=None,
        # None: IREE computes each dtype in itself; where it is less accurate
        # than eager (float16/bfloat16 reductions accumulated in the low
        # precision) that is IREE's defect, listed in known-failures.toml,
        # not a tolerance to declare.
        tolerances=None,
        # batch_ops: every lowering is an iree-compile run (0.5 to 1.5 s however
        # small the program): the ops checks share their lowerings; outcomes stay per check.
        batch_ops=True,
        # The importer's symbolic shapes keep a dynamic dimension dynamic in the module.
        dynamic_shapes=True,
        host_only_modules=("backendconf_iree.compiler", "iree.compiler"),
        # One VM context per method, calls taking turns on its lock.
        thread_safe=True,
        fault_injection=True,
    )

    def preprocess(self, program: Any, compile_spec: dict, debug_handles: Mapping[Any, int]) -> bytes:
        """Compile ``program`` to a ``.vmfb`` blob (host only; see ``compiler``)."""
        from .compiler import compile_program  # host only: never imported on the target

        return compile_program(program, compile_spec, debug_handles)

    def accepts_blob_version(self, version: str) -> bool:
        """Blobs of the same major release, up to this minor (a newer minor may write what this cannot run)."""
        from pytest_backendconf.backend import same_major_not_newer

        return same_major_not_newer(version, self.version)

    @staticmethod
    def _probe() -> str:
        """Available when IREE's runtime imports and offers the local-sync driver."""
        try:
            from .runtime import config

            config()
        except Exception as exc:  # ImportError, or a native library or driver that does not load
            return f"IREE's runtime cannot be used ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        return ""
