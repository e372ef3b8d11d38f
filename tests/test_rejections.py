"""``UnsupportedNodeError`` naming several nodes at once (``rejections=[(node, reason), ...]``).

A backend that knows every node it cannot compile names them all in one
call: the lowering gives each its own debug info (handle, source line), the
text leads with the first node exactly as the one-node error does, and a bad
``rejections`` list gets an error that says how to write it.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc
from pytest_backendconf.errors import Rejection

HERE = __file__


class _SinCos(torch.nn.Module):
    def forward(self, x):
        h = x.sin() * 2
        return h.cos() + 1


class _NoTrig(ReferenceBackend):
    """The reference backend without sin and cos, naming every such node in one error."""

    name = "no_trig"

    def preprocess(self, program, compile_spec, debug_handles):
        bad = [
            (node, f"no {node.target.__name__.split('.')[0]} unit")
            for node in program.graph.nodes
            if node.op == "call_function" and str(node.target) in ("aten.sin.default", "aten.cos.default")
        ]
        if bad:
            raise bc.UnsupportedNodeError(rejections=bad)
        return super().preprocess(program, compile_spec, debug_handles)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(open(HERE).read().splitlines(), 1) if line.strip() == text)


def test_every_rejected_node_gets_its_source_line_and_handle():
    with pytest.raises(bc.UnsupportedNodeError) as info:
        bc.to_backend(_SinCos(), _NoTrig(), {"forward": {}}, example_inputs=(torch.randn(3),))
    exc = info.value
    assert [r.node.name for r in exc.rejections] == ["sin", "cos"]
    assert [r.reason for r in exc.rejections] == ["no sin unit", "no cos unit"]
    handles = [r.debug_handle for r in exc.rejections]
    assert all(isinstance(h, int) for h in handles) and handles[0] != handles[1]
    # The first node's fields are the error's own, as for a one-node rejection.
    assert (exc.node, exc.reason, exc.debug_info) == (
        exc.rejections[0].node,
        "no sin unit",
        exc.rejections[0].debug_info,
    )
    text = str(exc)
    assert text.startswith(
        "The node of aten::sin is not supported in this compiler. Source code:\n"
        f'  File "{HERE}", line {_line("h = x.sin() * 2")}, in forward\n'
        "    h = x.sin() * 2\n"
        "        ~~~~~~~ <--- HERE\n"
        "Reason: no sin unit\n"
    )
    second = text.split("The backend rejected 1 more node:\n", 1)[1]
    assert second.startswith("The node of aten::cos is not supported in this compiler. Source code:\n")
    assert f"line {_line('return h.cos() + 1')}, in forward" in second and "Reason: no cos unit" in second
    assert str(exc.rejections[1]) == second


def test_one_node_rejections_read_as_before():
    node_error = bc.UnsupportedNodeError("x", "why")
    listed = bc.UnsupportedNodeError(rejections=[("x", "why")])
    assert str(node_error) == str(listed)
    assert node_error.rejections[0].node == "x" and node_error.reason == "why"
    # Assigning the reason (as the CPU fallback does) changes the first rejection's.
    node_error.reason = "the CPU fallback cannot run it either: why"
    assert node_error.rejections[0].reason == node_error.reason


def test_a_rejection_list_survives_pickling():
    exc = bc.UnsupportedNodeError(rejections=[("a", "r1"), ("b", "r2")])
    exc.rejections[1].debug_info = None
    copy = pickle.loads(pickle.dumps(exc))
    assert [(r.node, r.reason) for r in copy.rejections] == [("a", "r1"), ("b", "r2")]
    assert isinstance(copy.rejections[0], Rejection)


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({}, TypeError, r"takes the rejected node: UnsupportedNodeError\(node, reason\), or rejections="),
        ({"rejections": []}, ValueError, r"rejections=\[\]\) names no node"),
        ({"rejections": "sin"}, TypeError, r"takes a list of \(node, reason\) pairs, got str 'sin'"),
        ({"rejections": [("a", 3)]}, TypeError, r"entry 0 is \('a', 3\); each entry is a \(node, reason\) pair"),
        ({"rejections": [("a",)]}, TypeError, r"entry 0 is \('a',\)"),
        ({"rejections": [("a", "x"), ("a", "y")]}, ValueError, r"names node 'a' twice; give each rejected node once"),
        ({"node": "a", "reason": "b", "rejections": [("a", "b")]}, TypeError, r"not both"),
    ],
)
def test_a_bad_rejection_list_says_how_to_write_it(kwargs, error, text):
    with pytest.raises(error, match=text):
        bc.UnsupportedNodeError(**kwargs)
