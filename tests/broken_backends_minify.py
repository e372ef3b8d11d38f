"""Backends that fail on one operator, for the minimal reproductions (tests/test_minify.py).

Each is the reference backend with one defect that shows only in a program
containing a given operator, so the smallest program that still fails is
that operator alone: one crashes its process on ``aten.gelu``, one hangs on
``aten.tanh``, one rejects ``aten.sigmoid`` with an error it does not
declare (not ``UnsupportedNodeError``). The float16 defect is
``broken_backends_ops.WrongHalfSub`` (``aten.sub`` is off in float16 only).
"""

from __future__ import annotations

import os
import sys
import time

import torch
from backendconf_reference import ReferenceBackend


def _has(program, op) -> bool:
    return any(node.target is op for node in program.graph_module.graph.nodes)


class AbortsOnGelu(ReferenceBackend):
    """Aborts its process (SIGABRT, as a failed assertion in a C++ compiler would) on a program with gelu."""

    name = "aborts_on_gelu"

    def preprocess(self, program, compile_spec, debug_handles):
        if _has(program, torch.ops.aten.gelu.default):
            os.abort()
        return super().preprocess(program, compile_spec, debug_handles)


class HangsOnTanh(ReferenceBackend):
    """Never returns from preprocess() on a program with tanh."""

    name = "hangs_on_tanh"

    def preprocess(self, program, compile_spec, debug_handles):
        if _has(program, torch.ops.aten.tanh.default):
            print("hangs_on_tanh: preprocess() of a program with tanh never returns", file=sys.stderr, flush=True)
            while True:
                time.sleep(60)
        return super().preprocess(program, compile_spec, debug_handles)


class RaisesOnSigmoid(ReferenceBackend):
    """Rejects sigmoid with a NotImplementedError: an error it did not declare (not UnsupportedNodeError)."""

    name = "raises_on_sigmoid"

    def preprocess(self, program, compile_spec, debug_handles):
        if _has(program, torch.ops.aten.sigmoid.default):
            raise NotImplementedError("no kernel for aten.sigmoid.default in this compiler")
        return super().preprocess(program, compile_spec, debug_handles)


def backendconf_register_backends(register):
    for cls in (AbortsOnGelu, HangsOnTanh, RaisesOnSigmoid):
        register(cls())
