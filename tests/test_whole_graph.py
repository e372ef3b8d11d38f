"""Whole-graph compilers: `bc.failing_nodes` finds the node a node-less build error is about, and its own error."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch

import pytest_backendconf as bc
from broken_backends_wholegraph import FusedBuild, FusedBuildNoProbe, FusedBuildPerNode, FusedKernelFault

FUSED_KERNEL_FAULT = FusedKernelFault()


def backendconf_register_backends(register):
    register(FUSED_KERNEL_FAULT)


@pytest.fixture
def registry():
    """This module's backend, as a conftest's would be, for load() to find."""
    import sys

    from pytest_backendconf.registry import BackendRegistry, Source, active_registry, set_active_registry

    registry = BackendRegistry()
    registry.add_plugin(sys.modules[__name__], Source(f"test module {__name__}"))
    previous = active_registry()
    set_active_registry(registry)
    yield registry
    set_active_registry(previous)


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


class TanhSoftplus(torch.nn.Module):
    def forward(self, x):
        y = torch.tanh(x) * 2
        return torch.nn.functional.softplus(y) + 1


TANH_ALONE = "BuildError: no schedule for tanh on this target"
SOFTPLUS_ALONE = "BuildError: softplus lowers to log1p(exp(x)), and exp has no float kernel here"


def test_failing_nodes_keeps_each_nodes_own_build_error_and_stays_a_list_of_nodes():
    program = torch.export.export(TanhSoftplus(), (torch.randn(3),))
    bad = bc.failing_nodes(program, FusedBuildPerNode())
    assert isinstance(bad, bc.FailingNodes) and isinstance(bad, list)
    assert [n.name for n in bad] == ["tanh", "softplus"] and bad == [bad[0], bad[1]]
    assert bad.errors == {bad[0]: TANH_ALONE, bad[1]: SOFTPLUS_ALONE}  # each node's own words, not the whole build's
    assert bad.rejections() == [(bad[0], TANH_ALONE), (bad[1], SOFTPLUS_ALONE)]
    # Today's callers keep working: the program's own nodes, for UnsupportedNodeError(nodes[0], why).
    assert all(n.graph is program.graph_module.graph for n in bad)
    assert bc.UnsupportedNodeError(bad[0], "why").node is bad[0]
    nothing = bc.failing_nodes(program, "reference")
    assert nothing == [] and nothing.errors == {} and nothing.rejections() == []


def test_a_fused_compiler_rejects_every_failing_node_with_its_own_error():
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(TanhSoftplus(), FusedBuildPerNode(), {"forward": {}}, example_inputs=(torch.randn(3),))
    error = caught.value
    assert [(r.node.name, r.reason) for r in error.rejections] == [("tanh", TANH_ALONE), ("softplus", SOFTPLUS_ALONE)]
    text = str(error)
    assert "y = torch.tanh(x) * 2" in text and "softplus(y) + 1" in text
    assert "fused build failed" not in text  # the whole build's node-less words are not the reason


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


def test_in_a_suite_run_each_unsupported_check_gives_the_nodes_own_build_error(pytester):
    tests = _run(pytester, "fused_build_per_node")
    assert tests and {t["outcome"] for t in tests} == {"unsupported"}, [(t["id"], t["outcome"]) for t in tests]
    for t in tests:  # the model's first failing node in program order is its tanh
        assert f"aten::tanh is not supported in this compiler ({TANH_ALONE})" in t["reason"], t["reason"]


def test_the_documented_from_node_recipe_maps_a_decomposed_node_back():
    # The recipe of docs/writing-a-backend.md, "A compiler that builds the whole graph", verbatim.
    text = (pathlib.Path(__file__).parent.parent / "docs" / "writing-a-backend.md").read_text()
    recipe = next(block for block in text.split("```python\n")[1:] if "def original_node" in block).split("```")[0]
    namespace: dict = {}
    exec(recipe, namespace)

    class Silu(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x).sum()

    program = torch.export.export(Silu(), (torch.randn(3),))
    decomposed = program.run_decompositions()
    sigmoid = next(n for n in decomposed.graph.nodes if n.target is torch.ops.aten.sigmoid.default)
    assert namespace["original_node"](program, sigmoid).name == "silu"


# --- a fused kernel's handle range ---------------------------------------------------------------


class Block(torch.nn.Module):
    def forward(self, x):
        y = x * 3
        return torch.relu(y - 1)


class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x + 1)


def _fused_fault():
    lowered = bc.to_backend(Fused(), FUSED_KERNEL_FAULT, {"forward": {}}, example_inputs=(torch.randn(4),))
    with pytest.raises(bc.BackendRuntimeError) as caught:
        lowered(torch.randn(4))
    return lowered, caught.value


def test_a_handle_range_names_every_node_of_the_kernel_with_its_line():
    _, error = _fused_fault()
    text = str(error)
    assert text.startswith("fused kernel 0 failed: out of shared memory\nIn a fused kernel covering 4 nodes")
    for source in ("return self.block(x + 1)", "y = x * 3", "return torch.relu(y - 1)"):
        assert source in text, text
    for node in ("'add'", "'mul'", "'sub'", "'relu'"):
        assert f"node {node}" in text
    assert len(error.debug_handles) == 4 and error.debug_handle == error.debug_handles[0]
    # Compact: the call of the block, which its three nodes share, is printed once after add's own line.
    assert text.count("return self.block(x + 1)") == 2 and text.count("(the outer frame of node above)") == 2


def test_a_handle_range_symbolicates_the_same_from_the_debug_sidecar(tmp_path, registry):
    import subprocess
    import sys

    lowered, error = _fused_fault()
    path = tmp_path / "fused.bcpt"
    bc.save(lowered, path, debug_info="separate")
    sidecar = str(path) + ".debug"
    offline = bc.symbolicate(sidecar, list(error.debug_handles), fused=True)
    assert str(error) == f"{error.message}\n{offline}"
    # Loaded without its .debug file, the error says which command prints that text.
    moved = tmp_path / "elsewhere.debug"
    pathlib.Path(sidecar).rename(moved)
    with pytest.raises(bc.BackendRuntimeError) as caught:
        bc.load(path)(torch.randn(4))
    hint = str(caught.value).split("symbolicate with: ", 1)[1].rstrip(")")
    assert hint.startswith("backendconf symbolicate ") and hint.endswith(" --fused")
    pathlib.Path(moved).rename(sidecar)
    args = hint.split()[1:]
    # Stored source paths are relative to sys.path; the CLI resolves them as this process does.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    printed = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", *args], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert printed.rstrip("\n") == offline
    # A log line carrying the range is followed by the same text.
    log = tmp_path / "run.log"
    log.write_text(f"E kernel failed (debug_handles=[{', '.join(map(str, error.debug_handles))}])\n")
    rewritten = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "symbolicate", sidecar, "--log", str(log)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert offline in rewritten


def test_backend_error_takes_one_handle_or_a_range_not_both():
    assert bc.BackendError("x", debug_handles=[3, 4]).debug_handles == (3, 4)
    assert bc.BackendError("x", 7).debug_handles == (7,) and bc.BackendError("x").debug_handles == ()
    with pytest.raises(TypeError, match="not both"):
        bc.BackendError("x", 3, debug_handles=[3, 4])
    with pytest.raises(TypeError, match="list of ints"):
        bc.BackendError("x", debug_handles="3,4")
    with pytest.raises(ValueError, match="names no node"):
        bc.BackendError("x", debug_handles=[])


def test_a_profiled_kernel_event_is_shared_among_its_nodes():
    from pytest_backendconf.diagnostics import check_events

    events = check_events([([5, 6, 7], 100, 130), (8, 130, 131)], "b", "forward")
    assert events == ((5, 100, 110), (6, 110, 120), (7, 120, 130), (8, 130, 131))
    with pytest.raises(bc.BackendContractError, match="fused kernel covering several nodes"):
        check_events([(["5"], 100, 130)], "b", "forward")
