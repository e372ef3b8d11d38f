"""Broken backends for the stateful category: the reference backend with one defect each in how it treats state.

tests/test_suite_stateful.py proves that the category catches each one with a text naming the defect, and
that the reference backend passes the same checks. Each is a mistake a real delegate can make: the state
comes into ``execute`` as inputs and its new values must go out as the first outputs
(docs/backend-contract.md, "State").
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc

#: A blob of these backends: this prefix, the length of a JSON header, the header (the program's state
#: specs), then the reference backend's blob. ``compile`` reads the header back, so the defect works in a
#: loaded archive too, with no memory of the process that lowered it.
_MAGIC = b"BCSTATE1"


def _wrap(program, blob: bytes) -> bytes:
    specs = [{"fqn": s.fqn, "input": s.input, "output": s.output} for s in bc.state_specs(program)]
    header = json.dumps(specs).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + blob


def _unwrap(blob: bytes) -> tuple[list[dict], bytes]:
    if not blob.startswith(_MAGIC):
        return [], blob
    (size,) = struct.unpack_from("<I", blob, len(_MAGIC))
    start = len(_MAGIC) + 4
    return json.loads(blob[start : start + size]), blob[start + size :]


class _KnowsItsState(ReferenceBackend):
    """The reference backend, remembering each handle's state specs (by handle id) and its blob's digest."""

    def preprocess(self, program, compile_spec, debug_handles):
        return _wrap(program, super().preprocess(program, compile_spec, debug_handles))

    def compile(self, processed, method_compile_spec):
        specs, blobs = {}, {}
        for method, blob in processed.items():
            specs[method], blobs[method] = _unwrap(blob)
        handles = super().compile(blobs, method_compile_spec)
        if not hasattr(self, "_specs"):
            self._specs: dict[int, tuple[list[dict], str]] = {}
        for method, handle in handles.items():
            self._specs[id(handle)] = (specs[method], hashlib.sha256(blobs[method]).hexdigest())
        return handles

    def specs(self, handle) -> tuple[list[dict], str]:
        return self._specs.get(id(handle), ([], ""))


class StateNeverWrittenBack(_KnowsItsState):
    """Computes each state's new value but returns the value it was given: the state never moves on."""

    name = "state_never_written_back"

    def execute(self, handle, inputs):
        outputs = list(super().execute(handle, inputs))
        for spec in self.specs(handle)[0]:
            if spec["input"] is not None and spec["output"] is not None:
                outputs[spec["output"]] = inputs[spec["input"]]
        return outputs


#: "The device's memory": the state each program keeps between calls, by blob digest and buffer name.
_DEVICE: dict[tuple[str, str], torch.Tensor] = {}


class SharesStateBetweenInstances(_KnowsItsState):
    """Keeps the state on "the device" between calls to save copies, one copy per program rather than per
    instance: after its first call a program ignores the state it is given and uses the device's. One
    instance alone generates as eager; a second instance of the same program (another lowering, a loaded
    archive, the same module after ``reset()``) continues from the first one's state."""

    name = "shares_state_between_instances"

    def execute(self, handle, inputs):
        specs, digest = self.specs(handle)
        inputs = list(inputs)
        for spec in specs:
            kept = _DEVICE.get((digest, spec["fqn"]))
            if spec["input"] is not None and kept is not None:
                inputs[spec["input"]] = kept
        outputs = super().execute(handle, inputs)
        for spec in specs:
            if spec["output"] is not None:
                _DEVICE[(digest, spec["fqn"])] = outputs[spec["output"]]
        return outputs


def _rewrite_indices(program, debug_handles, rewrite):
    """A copy of ``program`` whose ``index_copy`` writes go where ``rewrite(graph, index, size)`` says,
    with the handles of the copy's nodes (a new node takes its ``index_copy``'s handle)."""
    work = copy.deepcopy(program)
    by_name = {node.name: handle for node, handle in debug_handles.items()}
    graph = work.graph_module.graph
    handles = {}
    for node in list(graph.nodes):
        if node.name in by_name:
            handles[node] = by_name[node.name]
        if node.op != "call_function" or node.target is not torch.ops.aten.index_copy.default:
            continue
        buffer, dim, index = node.args[0], node.args[1], node.args[2]
        size = buffer.meta["val"].shape[dim]
        with graph.inserting_before(node):
            moved = rewrite(graph, index, size)
        for new in moved:
            handles[new] = by_name[node.name]
        node.replace_input_with(index, moved[-1])
    graph.lint()
    work.graph_module.recompile()
    return work, handles


class CacheOneOff(ReferenceBackend):
    """Its ``index_copy`` kernel writes one position past the one asked for (wrapping at the end of the
    buffer): every cache entry lands in the next slot."""

    name = "cache_one_off"

    def preprocess(self, program, compile_spec, debug_handles):
        def shift(graph, index, size):
            plus = graph.call_function(torch.ops.aten.add.Scalar, (index, 1))
            return [plus, graph.call_function(torch.ops.aten.remainder.Scalar, (plus, size))]

        work, handles = _rewrite_indices(program, debug_handles, shift)
        return super().preprocess(work, compile_spec, handles)


class ClampsPastTheCache(ReferenceBackend):
    """Its ``index_copy`` kernel clamps an index past the end of the buffer to the last slot, as some
    accelerators' scatter does, instead of failing: a position past the cache gives an answer."""

    name = "clamps_past_the_cache"

    def preprocess(self, program, compile_spec, debug_handles):
        def clamp(graph, index, size):
            return [graph.call_function(torch.ops.aten.clamp.default, (index, 0, size - 1))]

        work, handles = _rewrite_indices(program, debug_handles, clamp)
        return super().preprocess(work, compile_spec, handles)


class SlowDevice(ReferenceBackend):
    """Correct, and slow: each call waits a few milliseconds, as a device round trip does. With calls
    that did not take turns, two threads would both read a state before either wrote it back."""

    name = "slow_device"

    def execute(self, handle, inputs):
        import time

        time.sleep(0.003)
        return super().execute(handle, inputs)


def backendconf_register_backends(register):
    for cls in (StateNeverWrittenBack, SharesStateBetweenInstances, CacheOneOff, ClampsPastTheCache, SlowDevice):
        register(cls())
