"""Broken backends for the contract and parity checks: the reference backend with one defect each."""

from __future__ import annotations

import itertools

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc


class FlickeringAvailability(ReferenceBackend):
    """is_available() alternates between True and False."""

    name = "flickering"

    def __init__(self) -> None:
        self._answers = itertools.cycle([True, False])

    def is_available(self) -> bool:
        return next(self._answers)


class MalformedCapabilities(ReferenceBackend):
    """Declares op names that are not overload names."""

    name = "malformed_caps"
    capabilities = bc.Capabilities(supported_ops={"mul", "aten.add.Tensor"})


class SaltedBlob(ReferenceBackend):
    """preprocess() prefixes a counter byte, so the same program gives other bytes."""

    name = "salted_blob"
    _counter = itertools.count()

    def preprocess(self, program, compile_spec, debug_handles):
        return bytes([next(self._counter) % 256]) + super().preprocess(program, compile_spec, debug_handles)

    def compile(self, processed, method_compile_spec):
        return super().compile({m: blob[1:] for m, blob in processed.items()}, method_compile_spec)


class MutatesParameters(ReferenceBackend):
    """preprocess() overwrites the program's first float parameter in place.

    The write is idempotent, so preprocess stays deterministic: only the
    check that the program is left alone can see it.
    """

    name = "mutates_parameters"

    def preprocess(self, program, compile_spec, debug_handles):
        with torch.no_grad():
            for value in program.state_dict.values():
                if value.is_floating_point():
                    value.fill_(0.5)
                    break
        return super().preprocess(program, compile_spec, debug_handles)


class DropsMethods(ReferenceBackend):
    """compile() returns a handle for the first method only."""

    name = "drops_methods"

    def compile(self, processed, method_compile_spec):
        handles = super().compile(processed, method_compile_spec)
        return dict(list(handles.items())[:1])


class ReturnsTuple(ReferenceBackend):
    """execute() returns a tuple, not a list."""

    name = "returns_tuple"

    def execute(self, handle, inputs):
        return tuple(super().execute(handle, inputs))


class WrongInHalf(ReferenceBackend):
    """float16 outputs are off by a visible amount; every other dtype is right."""

    name = "wrong_in_half"

    def execute(self, handle, inputs):
        outputs = super().execute(handle, inputs)
        return [o + 0.5 if isinstance(o, torch.Tensor) and o.dtype == torch.float16 else o for o in outputs]


class RejectsMul(ReferenceBackend):
    """Rejects aten.mul.Tensor at preprocess: models using it are unsupported, never passes."""

    name = "rejects_mul"
    capabilities = bc.Capabilities(
        supported_ops=ReferenceBackend.capabilities.supported_ops - {"aten.mul.Tensor"},
        dtypes=ReferenceBackend.capabilities.dtypes,
        host_only_modules=ReferenceBackend.capabilities.host_only_modules,
        thread_safe=True,
        fault_injection=True,
    )

    def preprocess(self, program, compile_spec, debug_handles):
        from pytest_backendconf.debuginfo._handles import walk_nodes

        for node in walk_nodes(program.graph_module):
            if node.op == "call_function" and node.target is torch.ops.aten.mul.Tensor:
                raise bc.UnsupportedNodeError(node, "this backend has no multiplier")
        return super().preprocess(program, compile_spec, debug_handles)
