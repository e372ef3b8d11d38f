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
``ClaimedTanhCrash`` claims every op the reference backend runs, tanh
included, and its compiler crashes on tanh with a wrapped, several-line error
whose diagnostic sits below the wrapper (as IREE's ``iree-compile`` does): the
recipe's `FailingNodes.raise_verdict` makes it a `CompilerError`, so every
check of a model with a tanh *fails*, naming the node, and a known-failures
reason is the diagnostic line. ``ConstantMulCrash``, ``UnboundedDynamic`` and
``NoCond`` are the three programs `failing_nodes` once got wrong: a bug that
needs a constant operand, an engine that needs every size bounded (and whose
tanh breaks on dynamic sizes only), and an engine without ``torch.cond``.
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
            bc.failing_nodes(program, self, compile_spec).raise_verdict(exc)
        return super().preprocess(program, compile_spec, debug_handles)


#: What the crashing compiler writes: a wrapper line first, its diagnostic three lines below.
CRASH_TEXT = (
    "Error invoking compiler tool fuse-compile\n"
    "Error code: 1\n"
    "Diagnostics:\n"
    "<stdin>:5:10: error: 'math.tanh' op failed to legalize: no lowering for f32 on this target\n"
    "Invoked with:\n fuse-compile --target=cpu -"
)


class CompilerToolError(RuntimeError):
    """The engine's compiler tool failed: a wrapper message with the diagnostic inside."""


class ClaimedTanhCrash(ReferenceBackend):
    """Claims tanh (the reference backend's supported_ops) and its compiler crashes on it."""

    name = "claimed_tanh_crash"

    def preprocess(self, program, compile_spec, debug_handles):
        try:
            if any(n.target is torch.ops.aten.tanh.default for n in program.graph_module.graph.nodes):
                raise CompilerToolError(CRASH_TEXT)
        except CompilerToolError as exc:
            bc.failing_nodes(program, self, compile_spec).raise_verdict(exc)
        return super().preprocess(program, compile_spec, debug_handles)


def _has_constant_operand(program, target):
    constants = {s.arg.name for s in program.graph_signature.input_specs if s.kind.name != "USER_INPUT"}
    return any(
        n.target is target and any(a.op == "placeholder" and a.name in constants for a in n.all_input_nodes)
        for n in program.graph_module.graph.nodes
    )


class ConstantMulCrash(ReferenceBackend):
    """Folds a multiplication by a constant wrongly: the build fails only where mul has a weight operand."""

    name = "constant_mul_crash"

    def preprocess(self, program, compile_spec, debug_handles):
        if _has_constant_operand(program, torch.ops.aten.mul.Tensor):
            exc = BuildError("constant folding failed: fused build aborted")
            bc.failing_nodes(program, self, compile_spec).raise_verdict(exc)
        return super().preprocess(program, compile_spec, debug_handles)


def _unbounded(program):
    """The symbolic sizes of the program's inputs that its range constraints do not bound."""
    sizes = [
        size
        for n in program.graph_module.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
        for size in n.meta["val"].shape
        if not isinstance(size, int)
    ]
    return [s for s in sizes if s.node.expr not in program.range_constraints]


class UnboundedDynamic(ReferenceBackend):
    """Needs every dynamic size bounded (as IREE does), and its tanh breaks on dynamic sizes only."""

    name = "unbounded_dynamic"

    def preprocess(self, program, compile_spec, debug_handles):
        unbounded = _unbounded(program)
        if unbounded:
            raise BuildError(f"size {unbounded[0]} has no range: cannot allocate")
        dynamic_tanh = [
            n
            for n in program.graph_module.graph.nodes
            if n.target is torch.ops.aten.tanh.default and not all(isinstance(d, int) for d in n.meta["val"].shape)
        ]
        if dynamic_tanh:
            exc = BuildError("error: 'math.tanh' op has no dynamic-shape lowering")
            bc.failing_nodes(program, self, compile_spec).raise_verdict(exc)
        return super().preprocess(program, compile_spec, debug_handles)


class NoCond(ReferenceBackend):
    """Has no lowering for torch.cond, and says so without naming the node."""

    name = "no_cond"

    def preprocess(self, program, compile_spec, debug_handles):
        if any(n.target is torch.ops.higher_order.cond for n in program.graph_module.graph.nodes):
            exc = BuildError("fused build failed: a region has no lowering")
            bc.failing_nodes(program, self, compile_spec).raise_verdict(exc)
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
    register(ClaimedTanhCrash())
    register(ConstantMulCrash())
    register(UnboundedDynamic())
    register(NoCond())
