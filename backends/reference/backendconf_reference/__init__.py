"""The reference backend of pytest-backendconf: a bytecode compiler and interpreter.

It is a complete delegate backend for ``torch.export`` programs, written to
be read and copied: ``compiler`` (host only) turns a program into a compact
blob (``bytecode``), and ``interpreter`` runs it, calling the kernels of the
op table (``ops``). Those modules live in ``pytest_backendconf.reference``,
because partial delegation runs every node a backend does not take on the
same interpreter; this package is the backend around them. It passes the whole conformance suite::

    pytest --backend=reference

This module stays importable on a target without the compiler: it imports
``compiler`` only inside ``preprocess``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import pytest_backendconf as bc

# The compiler, blob format, op table and interpreter are the core package's
# (shared with partial delegation's CPU fallback); this package is the backend.
from pytest_backendconf.reference import bytecode, ops
from pytest_backendconf.reference.interpreter import LoadedProgram, load
from pytest_backendconf.blobs import compile_each

__version__ = "0.5.0"
__all__ = ["ReferenceBackend", "LoadedProgram", "bytecode", "ops"]


class ReferenceBackend:
    """The reference implementation of the delegate-backend protocol (docs/backend-contract.md#the-four-hooks)."""

    name = "reference"
    version = __version__
    capabilities = bc.Capabilities(
        supported_ops=ops.SUPPORTED_OPS,
        dtypes=ops.SUPPORTED_DTYPES,
        # Kernels are the eager ones, so the suite's default tolerances hold.
        tolerances=None,
        host_only_modules=("backendconf_reference.compiler",),
        thread_safe=True,
        fault_injection=True,
    )

    def is_available(self) -> bool:
        """Always true: the interpreter needs nothing but torch on the CPU."""
        return True

    def unavailable_reason(self) -> str:
        """Why ``is_available()`` is false; empty, since it never is."""
        return ""

    def preprocess(
        self,
        program: torch.export.ExportedProgram,
        compile_spec: dict,
        debug_handles: Mapping[Any, int],
    ) -> bytes:
        """Compile ``program`` to a blob (host only; see ``compiler``)."""
        from .compiler import compile_program  # host only: never imported on the target

        return compile_program(program, compile_spec, debug_handles)

    def compile(self, processed: dict[str, bytes], method_compile_spec: dict[str, dict]) -> dict[str, LoadedProgram]:
        """Decode each method's blob; a bad blob raises ``ValueError`` naming the method.

        The compile spec is already baked into the blob by ``preprocess``, so
        this is a pure load and works on a target without the compiler.
        """
        return compile_each(processed, load)

    def execute_profiled(self, handle: LoadedProgram, inputs: list) -> tuple[list, list]:
        """``execute``, timing each instruction: ``(outputs, [(debug_handle, start_ns, end_ns), ...])``."""
        if not isinstance(handle, LoadedProgram):
            raise TypeError(
                f"execute_profiled() expects a handle returned by ReferenceBackend.compile, got {type(handle).__name__}"
            )
        return handle.run_profiled(inputs)

    def accepts_blob_version(self, version: str) -> bool:
        """Blobs of the same major release, up to this minor (a newer minor may write what this cannot run)."""
        from pytest_backendconf.backend import same_major_not_newer

        return same_major_not_newer(version, self.version)

    def execute(self, handle: LoadedProgram, inputs: list) -> list:
        """Run a compiled method on its flat user inputs; return the flat outputs."""
        if not isinstance(handle, LoadedProgram):
            raise TypeError(
                f"execute() expects a handle returned by ReferenceBackend.compile, got {type(handle).__name__}"
            )
        return handle.run(inputs)

    def __repr__(self) -> str:
        return f"<ReferenceBackend {self.version}>"
