"""Whole-graph compilers: `bc.failing_nodes` finds the node a node-less build error is about."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import pytest_backendconf as bc
from broken_backends_wholegraph import FusedBuild, FusedBuildNoProbe


class TwoTanh(torch.nn.Module):
    def forward(self, x):
        y = torch.tanh(x + 1)
        return torch.tanh(y) * 2


def _program():
    return torch.export.export(TwoTanh(), (torch.randn(3),))


def test_failing_nodes_are_the_programs_own_nodes_in_order():
    program = _program()
    bad = bc.failing_nodes(program, FusedBuild())
    assert [n.name for n in bad] == ["tanh", "tanh_1"]
    assert all(n.graph is program.graph_module.graph for n in bad)
    # by registered name too, and nothing fails for a backend that builds everything
    assert bc.failing_nodes(program, "reference") == []


def test_failing_nodes_names_the_input_it_needs():
    with pytest.raises(TypeError, match="ExportedProgram given to preprocess"):
        bc.failing_nodes(TwoTanh(), FusedBuild())


def test_a_fused_compiler_using_failing_nodes_rejects_the_right_node():
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(TwoTanh(), FusedBuild(), {"forward": {}}, example_inputs=(torch.randn(3),))
    text = str(caught.value)
    assert "aten::tanh" in text and "y = torch.tanh(x + 1)" in text
    assert "fused build failed" in text  # the engine's own words, as the reason
    with pytest.raises(bc.LoweringError, match="BuildError: fused build failed"):
        bc.to_backend(TwoTanh(), FusedBuildNoProbe(), {"forward": {}}, example_inputs=(torch.randn(3),))


def _run(pytester, backend):
    pytester.syspathinsert(pathlib.Path(__file__).parent)
    pytester.makeini("[pytest]\n")
    report = pytester.path / f"{backend}.json"
    pytester.runpytest(
        "-p",
        "broken_backends_wholegraph",
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        "--backendconf-select=backendconf::parity::smooth_activations*",
        f"--backendconf-report={report}",
    )
    return [t for t in json.loads(report.read_text())["tests"] if t["id"].startswith("backendconf::parity::")]


def test_every_check_of_a_node_the_fused_build_fails_is_unsupported_naming_node_and_line(pytester):
    tests = _run(pytester, "fused_build")
    assert tests and {t["outcome"] for t in tests} == {"unsupported"}, [(t["id"], t["outcome"]) for t in tests]
    zoo = pathlib.Path(__file__).parent.parent / "conformance" / "zoo.py"
    line = 1 + zoo.read_text().splitlines().index(
        "        return F.gelu(x) + F.silu(x) + torch.sigmoid(x) * torch.tanh(x) - F.elu(x) + F.softplus(x)"
    )
    for t in tests:
        assert "aten::tanh is not supported" in t["reason"] and f"zoo.py:{line}" in t["reason"], t["reason"]
    # Without the probe, the same checks fail with the engine's node-less error.
    without = _run(pytester, "fused_build_no_probe")
    assert {t["outcome"] for t in without} == {"failed"} and len(without) == len(tests)
    assert all("fused build failed" in json.dumps(t) for t in without)
