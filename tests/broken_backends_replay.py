"""Broken backends for ``backendconf replay``: the reference backend with one defect each.

tests/test_replay.py proves that the in-process suite passes them and replay catches them.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch
from backendconf_reference import ReferenceBackend

#: The blobs this process lowered: a device never lowers, it only loads.
_LOWERED_HERE: set[str] = set()


class DriftsOnDevice(ReferenceBackend):
    """Right in the process that lowered the model (the host's simulator), 1% off once compiled in another (the board).

    Passes: parity, in process. Fails: every bundle of ``backendconf replay``.
    """

    name = "drifts_on_device"

    def __init__(self) -> None:
        #: The handles compiled from blobs lowered elsewhere, by id (the reference's handles have __slots__).
        self._on_device: dict[int, object] = {}

    def preprocess(self, program, compile_spec, debug_handles):
        blob = super().preprocess(program, compile_spec, debug_handles)
        _LOWERED_HERE.add(hashlib.sha256(blob).hexdigest())
        return blob

    def compile(self, processed, method_compile_spec):
        handles = super().compile(processed, method_compile_spec)
        for method, handle in handles.items():
            if hashlib.sha256(processed[method]).hexdigest() not in _LOWERED_HERE:
                self._on_device[id(handle)] = handle  # "the board's kernels"
        return handles

    def execute(self, handle, inputs):
        outputs = super().execute(handle, inputs)
        if self._on_device.get(id(handle)) is not handle:
            return outputs
        return [o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outputs]


class Float32Only(ReferenceBackend):
    """Declares float32 alone (the reference runs every dtype): a float64 bundle is not in its contract."""

    name = "float32_only"
    capabilities = dataclasses.replace(ReferenceBackend.capabilities, dtypes=frozenset({torch.float32}))


def backendconf_register_backends(register):
    """A plugin module: ``backendconf replay -p tests/broken_backends_replay.py`` registers both."""
    register(DriftsOnDevice())
    register(Float32Only())
