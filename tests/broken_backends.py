"""Deliberately broken backends: each is the reference backend with one defect.

They prove that the checks catch what they claim to: a lowering or suite
check that passes against one of these would be a check that cannot fail.
"""

from __future__ import annotations

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc


class Unavailable(ReferenceBackend):
    """Not available anywhere; counts compile and execute calls (there must be none)."""

    name = "unavailable"

    def __init__(self) -> None:
        self.compiled = 0
        self.executed = 0

    def is_available(self) -> bool:
        return False

    def unavailable_reason(self) -> str:
        return "no device in this test"

    def compile(self, processed, method_compile_spec):
        self.compiled += 1
        return super().compile(processed, method_compile_spec)

    def execute(self, handle, inputs):
        self.executed += 1
        return super().execute(handle, inputs)


class CompileFailsWhileAvailable(ReferenceBackend):
    """Says it is available, then cannot compile: a contract violation (§3.4)."""

    name = "compile_fails"

    def compile(self, processed, method_compile_spec):
        raise RuntimeError("device driver refused the blob")


class MissingHandle(ReferenceBackend):
    """compile() forgets every method but the first."""

    name = "missing_handle"

    def compile(self, processed, method_compile_spec):
        handles = super().compile(processed, method_compile_spec)
        return dict(list(handles.items())[:1])


class WrongOutputDtype(ReferenceBackend):
    """Returns float64 where the program says float32."""

    name = "wrong_dtype"

    def execute(self, handle, inputs):
        return [out.double() if isinstance(out, torch.Tensor) else out for out in super().execute(handle, inputs)]


class WrongOutputCount(ReferenceBackend):
    """Drops the last output."""

    name = "wrong_count"

    def execute(self, handle, inputs):
        return super().execute(handle, inputs)[:-1]


class UnknownHandle(ReferenceBackend):
    """Reports failures with a debug handle the recorder never issued."""

    name = "unknown_handle"

    def execute(self, handle, inputs):
        raise bc.BackendError("kernel trap", debug_handle=-1)


class PreprocessReturnsStr(ReferenceBackend):
    """preprocess() returns text, not bytes."""

    name = "preprocess_str"

    def preprocess(self, program, compile_spec, debug_handles):
        return super().preprocess(program, compile_spec, debug_handles).hex()
