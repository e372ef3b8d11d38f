"""Broken backends for the availability and serialization checks: the reference backend with one defect each.

Each docstring names the checks the defect must fail; tests/test_suite_availability.py
and tests/test_suite_serialization.py prove that exactly those fail.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os

import torch
from backendconf_reference import ReferenceBackend


class CompilerNeededOnTarget(ReferenceBackend):
    """compile() imports the host-only compiler, which a target does not have.

    Fails: availability target-compile_no-execute_yes and target-compile_yes-execute_yes;
    serialization target_round_trip[*].
    """

    name = "compiler_on_target"

    def compile(self, processed, method_compile_spec):
        importlib.import_module("backendconf_reference.compiler")  # "to validate the blob"
        return super().compile(processed, method_compile_spec)


class ReexportsOnTarget(ReferenceBackend):
    """compile() re-exports the program on the target; its runtime imports torch._dynamo, and declares it.

    The declared module is let in, so the import gives nothing away: the call does.
    Fails: serialization target_round_trip[*] (and the availability target rows).
    """

    name = "reexports_on_target"
    capabilities = dataclasses.replace(ReferenceBackend.capabilities, target_runtime_modules=("torch._dynamo",))

    def compile(self, processed, method_compile_spec):
        import torch._dynamo

        # "check the blob against a fresh trace of the program"
        torch.export.export(torch.nn.ReLU(), (torch.ones(2),))
        return super().compile(processed, method_compile_spec)


class LiesAboutAvailability(ReferenceBackend):
    """is_available() says True, but compile() needs a device that is not there.

    Fails: availability host-compile_yes-execute_yes (the honesty row), and the
    target rows that load with the backend itself.
    """

    name = "lies_about_availability"

    def compile(self, processed, method_compile_spec):
        raise RuntimeError("no NPU device found (/dev/npu0 missing)")


class PreprocessNeedsDevice(ReferenceBackend):
    """preprocess() refuses to run without the device, so lowering on a host without it fails.

    Fails: availability host-compile_no-execute_no and host-compile_yes-execute_no.
    """

    name = "preprocess_needs_device"

    def preprocess(self, program, compile_spec, debug_handles):
        if not self.is_available():
            raise RuntimeError("cannot preprocess: no NPU device to query for its tile size")
        return super().preprocess(program, compile_spec, debug_handles)


class CrashesOnBadBlob(ReferenceBackend):
    """compile() takes the process down on a blob it cannot decode, instead of raising.

    Fails: availability target-compile_no-execute_yes-blob_not_ready.
    """

    name = "crashes_on_bad_blob"

    def compile(self, processed, method_compile_spec):
        try:
            return super().compile(processed, method_compile_spec)
        except ValueError:
            os.abort()  # what a native loader does with a short read


class NondeterministicBlob(ReferenceBackend):
    """preprocess() stamps the blob with the process id: stable within a process, not across.

    Fails: serialization deterministic_lowering[*] only (a re-save copies the
    blob, so it stays identical; the contract's in-process determinism check passes).
    """

    name = "nondeterministic_blob"
    _STAMP = 8

    def preprocess(self, program, compile_spec, debug_handles):
        stamp = os.getpid().to_bytes(self._STAMP, "little")
        return stamp + super().preprocess(program, compile_spec, debug_handles)

    def compile(self, processed, method_compile_spec):
        return super().compile({m: b[self._STAMP :] for m, b in processed.items()}, method_compile_spec)


class _Freed:
    """A handle served from the cache after its constants were freed."""

    def __init__(self, handle):
        self.handle = handle


class LosesState(ReferenceBackend):
    """compile() caches decoded programs by blob, and serves a second compile of the same blob a
    copy whose constants were freed: a module loaded in the process that lowered it runs wrong.

    Its outputs are off by one (negated for bools). Fails: serialization
    round_trip[*] only (a target process compiles each blob once).
    """

    name = "loses_state"
    _seen: set = set()

    def compile(self, processed, method_compile_spec):
        handles = super().compile(processed, method_compile_spec)
        for method, blob in processed.items():
            digest = hashlib.sha256(blob).digest()
            if digest in self._seen:
                handles[method] = _Freed(handles[method])
            self._seen.add(digest)
        return handles

    def execute(self, handle, inputs):
        if not isinstance(handle, _Freed):
            return super().execute(handle, inputs)
        return [_off_by_one(out) for out in super().execute(handle.handle, inputs)]


def _off_by_one(value):
    if not isinstance(value, torch.Tensor):
        return value
    return ~value if value.dtype == torch.bool else value + 1


class ForgetsToAnswerVersions(ReferenceBackend):
    """accepts_blob_version() answers True for its own version and falls off the end (None) otherwise.

    Fails: serialization future_backend_version[*] (load raises a contract error, not a clean refusal).
    """

    name = "forgets_version_answer"

    def accepts_blob_version(self, version):
        if version == self.version:
            return True
