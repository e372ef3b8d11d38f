"""Backends whose ops checks share lowerings (``Capabilities(batch_ops=True)``), each with defects that
a batch must attribute to their own checks only.

``TroubledBatches`` is the reference backend declaring no ``supported_ops``
(it is asked op by op) with three defects, each on one operator of a
program, batched or not: it rejects ``aten.mul`` at preprocess (the rejection
names the node), raises a plain ``RuntimeError`` from ``execute`` for any
program holding ``aten.neg`` (no node named: the batch must be split), and
computes ``aten.sub`` 0.4% off in float16 (``WrongHalfSub``'s kernel: a
failed comparison inside a passing batch). ``CrashingCos`` takes its process
down (``os.abort``) executing any program with ``aten.cos``: the crash must be
blamed on the cos checks alone, never on their batch mates.

``BulkRejects`` rejects ``aten.mul`` and ``aten.div`` naming every such
node in one ``UnsupportedNodeError(rejections=...)``, as a backend should.
``WrongRejectionList`` does so with a wrong list: it rejects ``aten.mul`` and
``aten.div`` but names only the mul nodes (a partial list: the div is named
when the batch is lowered again), and names the ``aten.abs`` node too, which
it compiles when it is alone (a node named wrongly): the abs checks must
still pass, and the run must say the list was wrong.
"""

from __future__ import annotations

import dataclasses
import os

from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc
from broken_backends_ops import WrongHalfSub


def _has(program, overload):
    return any(node.op == "call_function" and str(node.target) == overload for node in program.graph.nodes)


class TroubledBatches(WrongHalfSub):
    name = "troubled_batches"
    capabilities = dataclasses.replace(ReferenceBackend.capabilities, supported_ops=None, batch_ops=True)

    def preprocess(self, program, compile_spec, debug_handles):
        for node in program.graph.nodes:
            if node.op == "call_function" and str(node.target) == "aten.mul.Tensor":
                raise bc.UnsupportedNodeError(node, "this compiler has no multiplier")
        blob = super().preprocess(program, compile_spec, debug_handles)
        return (b"N" if _has(program, "aten.neg.default") else b"-") + blob

    def compile(self, processed, method_compile_spec):
        flags = {m: blob[:1] == b"N" for m, blob in processed.items()}
        handles = super().compile({m: blob[1:] for m, blob in processed.items()}, method_compile_spec)
        return {m: (handles[m], flags[m]) for m in handles}

    def execute(self, handle, inputs):
        program, negates = handle
        if negates:
            raise RuntimeError("the negation unit is out of order")
        return super().execute(program, inputs)


class CrashingCos(ReferenceBackend):
    name = "crashing_cos"
    capabilities = dataclasses.replace(ReferenceBackend.capabilities, batch_ops=True)

    def preprocess(self, program, compile_spec, debug_handles):
        blob = super().preprocess(program, compile_spec, debug_handles)
        return (b"C" if _has(program, "aten.cos.default") else b"-") + blob

    def compile(self, processed, method_compile_spec):
        flags = {m: blob[:1] == b"C" for m, blob in processed.items()}
        handles = super().compile({m: blob[1:] for m, blob in processed.items()}, method_compile_spec)
        return {m: (handles[m], flags[m]) for m in handles}

    def execute(self, handle, inputs):
        program, crashes = handle
        if crashes:
            os.abort()
        return super().execute(program, inputs)


class BulkRejects(ReferenceBackend):
    name = "bulk_rejects"
    capabilities = dataclasses.replace(ReferenceBackend.capabilities, supported_ops=None, batch_ops=True)
    #: The ops it rejects, each with its reason.
    refuses = {"aten.mul.Tensor": "this compiler has no multiplier", "aten.div.Tensor": "this compiler has no divider"}

    def rejections(self, program):
        calls = [node for node in program.graph.nodes if node.op == "call_function"]
        return [(node, self.refuses[str(node.target)]) for node in calls if str(node.target) in self.refuses]

    def preprocess(self, program, compile_spec, debug_handles):
        named = self.rejections(program)
        if named:
            raise bc.UnsupportedNodeError(rejections=named)
        return super().preprocess(program, compile_spec, debug_handles)


class WrongRejectionList(BulkRejects):
    name = "wrong_rejection_list"

    def rejections(self, program):
        named = super().rejections(program)
        muls = [(node, why) for node, why in named if str(node.target) == "aten.mul.Tensor"]
        if not muls:
            return named  # alone, or once the muls are gone: the divs, rightly
        # Partial (no div) and wrong: abs is named though it compiles alone.
        wrong = [
            (n, "this compiler has no abs unit") for n in program.graph.nodes if str(n.target) == "aten.abs.default"
        ]
        return muls + wrong


@bc.hookimpl
def backendconf_register_backends(register):
    register(TroubledBatches())
    register(CrashingCos())
    register(BulkRejects())
    register(WrongRejectionList())
