"""Whole-graph compilers: one build for the whole program, whose error names no node.

``FusedBuild`` stands for an engine like TVM: its build of a graph with a
``tanh`` fails with a message that names no node. Its ``preprocess`` asks
`bc.failing_nodes` which node it is and raises `UnsupportedNodeError` on it,
as docs/writing-a-backend.md ("A compiler that builds the whole graph")
shows, so that every check lowering a model with a ``tanh`` is *unsupported*
and names the node and the user's source line. ``FusedBuildNoProbe`` is the
same compiler without the probe: those checks fail with the node-less error.
``FusedBuildPerNode`` has no kernel for ``tanh`` nor ``softplus``, says so
only when it builds one node alone, and rejects every failing node with its
own error text (`FailingNodes.rejections`), as the docs' recipe does.
``FusedKernelFault`` runs the reference interpreter but reports a fault in a
fused kernel covering every node from the first to the last compute node, as
a handle range (``BackendError(..., debug_handles=[...])``).
"""

from __future__ import annotations

import dataclasses
import json
import time

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc


class BuildError(RuntimeError):
    """The engine's own build error: a message, no node."""


def _build(program):
    # The engine's "fused build": it has no tanh kernel and says so without naming a node.
    if any(n.target is torch.ops.aten.tanh.default for n in program.graph_module.graph.nodes):
        raise BuildError("fused build failed: no schedule for the fused kernel")


#: What the engine says about an op it cannot build, when it builds that op alone.
_ALONE = {
    torch.ops.aten.tanh.default: "no schedule for tanh on this target",
    torch.ops.aten.softplus.default: "softplus lowers to log1p(exp(x)), and exp has no float kernel here",
}


def _build_per_node(program):
    compute = [n for n in program.graph_module.graph.nodes if n.op == "call_function"]
    missing = [n for n in compute if n.target in _ALONE]
    if missing and len(compute) == 1:
        raise BuildError(_ALONE[missing[0].target])
    if missing:
        raise BuildError(f"fused build failed: {len(missing)} kernels have no schedule")


class FusedBuildNoProbe(ReferenceBackend):
    name = "fused_build_no_probe"
    capabilities = dataclasses.replace(
        ReferenceBackend.capabilities,
        supported_ops=frozenset(ReferenceBackend.capabilities.supported_ops) - {"aten.tanh.default"},
    )

    def preprocess(self, program, compile_spec, debug_handles):
        _build(program)
        return super().preprocess(program, compile_spec, debug_handles)


class FusedBuild(FusedBuildNoProbe):
    name = "fused_build"

    def preprocess(self, program, compile_spec, debug_handles):
        try:
            _build(program)
        except BuildError as exc:
            bad = bc.failing_nodes(program, self, compile_spec)
            if bad:
                raise bc.UnsupportedNodeError(bad[0], str(exc)) from exc
            raise
        return super().preprocess(program, compile_spec, debug_handles)


class FusedBuildPerNode(ReferenceBackend):
    name = "fused_build_per_node"
    capabilities = dataclasses.replace(
        ReferenceBackend.capabilities,
        supported_ops=frozenset(ReferenceBackend.capabilities.supported_ops)
        - {"aten.tanh.default", "aten.softplus.default"},
    )

    def preprocess(self, program, compile_spec, debug_handles):
        try:
            _build_per_node(program)
        except BuildError as exc:
            bad = bc.failing_nodes(program, self, compile_spec)
            if bad:
                raise bc.UnsupportedNodeError(rejections=bad.rejections()) from exc
            raise
        return super().preprocess(program, compile_spec, debug_handles)


class FusedKernelFault(ReferenceBackend):
    """Builds one kernel of the whole graph, and that kernel fails: a handle range names its nodes."""

    name = "fused_kernel_fault"

    def preprocess(self, program, compile_spec, debug_handles):
        covered = [debug_handles[n] for n in program.graph_module.graph.nodes if n.op == "call_function"]
        header = json.dumps(covered).encode()
        return len(header).to_bytes(4, "little") + header + super().preprocess(program, compile_spec, debug_handles)

    def compile(self, processed, method_compile_spec):
        return {
            method: json.loads(blob[4 : 4 + int.from_bytes(blob[:4], "little")]) for method, blob in processed.items()
        }

    def execute(self, handle, inputs):
        raise bc.BackendError("fused kernel 0 failed: out of shared memory", debug_handles=handle)

    def execute_profiled(self, handle, inputs):
        # One event for the fused kernel, under all the nodes it covers.
        start = time.perf_counter_ns()
        outputs = [torch.zeros(())]
        return outputs, [(handle, start, time.perf_counter_ns())]


@bc.hookimpl
def backendconf_register_backends(register):
    register(FusedBuildNoProbe())
    register(FusedBuild())
    register(FusedBuildPerNode())
    register(FusedKernelFault())
