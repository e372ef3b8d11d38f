"""A compile error's three verdicts, and `failing_nodes` on the programs it once got wrong.

Real exported programs, real backends (tests/broken_backends_wholegraph.py): a
compiler that crashes on a node it claims fails the check with a
`CompilerError` naming the node; one that does not claim the node leaves it
unsupported; one whose error names no node leaves the harness unable to tell,
and the text says so. `failing_nodes` finds the node that fails only with a
constant operand, only with dynamic sizes (the program's ranges kept), and a
``torch.cond``.
"""

from __future__ import annotations

import json
import pathlib
import pickle

import pytest
import torch

import pytest_backendconf as bc
from broken_backends_wholegraph import (
    CRASH_TEXT,
    BuildError,
    ClaimedTanhCrash,
    ConstantMulCrash,
    FusedBuild,
    FusedBuildNoProbe,
    NoCond,
    UnboundedDynamic,
)
from pytest_backendconf._diagnostic import diagnostic_line

DIAGNOSTIC = "'math.tanh' op failed to legalize: no lowering for f32 on this target"


class TanhModel(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x) + 1
        return torch.tanh(y) * 2


def test_a_claimed_node_whose_compiler_crashes_is_a_compiler_error_naming_node_and_diagnostic():
    with pytest.raises(bc.CompilerError) as caught:
        bc.to_backend(TanhModel(), ClaimedTanhCrash(), {"forward": {}}, example_inputs=(torch.randn(3),))
    error = caught.value
    assert error.node.name == "tanh" and error.reason == DIAGNOSTIC
    text = str(error)
    assert text.startswith("The node of aten::tanh failed in this compiler, which claims it. Source code:")
    assert f"Diagnostic: {DIAGNOSTIC}" in text and "return torch.tanh(y) * 2" in text
    assert isinstance(error.failures[0], bc.CompilerFailure) and error.debug_info is not None
    # It crosses processes as the backend host sends it (nodes that pickle: here their names).
    copy = pickle.loads(pickle.dumps(bc.CompilerError(failures=[("a", "d1"), ("b", "d2")])))
    assert [(f.node, f.reason) for f in copy.failures] == [("a", "d1"), ("b", "d2")]
    assert isinstance(copy.failures[1], bc.CompilerFailure)


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({}, TypeError, r"CompilerError\(node, diagnostic\), or failures="),
        ({"failures": []}, ValueError, r"failures=\[\]\) names no node; raise it only for nodes the backend claims"),
        ({"failures": [("a", "x"), ("a", "y")]}, ValueError, r"names node 'a' twice; give each failing node once"),
        ({"node": "a", "reason": "b", "failures": [("a", "b")]}, TypeError, r"not both"),
    ],
)
def test_a_bad_failure_list_says_how_to_write_it(kwargs, error, text):
    with pytest.raises(error, match=text):
        bc.CompilerError(**kwargs)


def test_a_node_the_backend_does_not_claim_stays_unsupported_and_a_nodeless_error_says_it_cannot_tell():
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(TanhModel(), FusedBuild(), {"forward": {}}, example_inputs=(torch.randn(3),))
    assert caught.value.node.name == "tanh"
    with pytest.raises(bc.LoweringError) as undecided:
        bc.to_backend(TanhModel(), FusedBuildNoProbe(), {"forward": {}}, example_inputs=(torch.randn(3),))
    assert not isinstance(undecided.value, bc.CompilerError)
    assert "The harness cannot tell whether the backend claims this program" in str(undecided.value)


def test_failing_nodes_gives_each_failure_its_op_exception_and_diagnostic_line():
    program = torch.export.export(TanhModel(), (torch.randn(3),))
    found = bc.failing_nodes(program, ClaimedTanhCrash())
    assert [n.name for n in found] == ["tanh"]
    failure = found.failures[found[0]]
    assert isinstance(failure, bc.NodeFailure)
    assert failure.op == "aten.tanh.default" and failure.diagnostic == DIAGNOSTIC
    assert failure.reproduced == "alone" and str(failure.exception) == CRASH_TEXT
    assert found.claimed() == [found[0]]  # the reference backend's supported_ops claim tanh
    assert isinstance(found.verdict(), bc.CompilerError)
    # Claims given by the caller decide: an op outside them is a rejection.
    assert isinstance(found.verdict(claims={"aten.relu.default"}), bc.UnsupportedNodeError)
    assert isinstance(found.verdict(claims=lambda node: False), bc.UnsupportedNodeError)
    with pytest.raises(TypeError, match=r"claims='aten.tanh.default' is one string; pass a collection"):
        found.verdict(claims="aten.tanh.default")


def test_the_diagnostic_line_skips_the_wrapper():
    wrapped = (
        "LoweringError: preprocess() of backend 'iree' failed: CompilerToolError: Error invoking tool\n" + CRASH_TEXT
    )
    assert diagnostic_line(wrapped) == DIAGNOSTIC
    assert diagnostic_line("ld.lld: error: undefined symbol: log10f\n>>> referenced by x") == "undefined symbol: log10f"
    assert diagnostic_line("BuildError: no schedule for tanh\nsecond") == "BuildError: no schedule for tanh"
    assert diagnostic_line("") == ""


class RejectsWhenAlone(FusedBuildNoProbe):
    """A whole build fails naming no node; a one-node build of tanh names it (``UnsupportedNodeError``)."""

    name = "rejects_when_alone"

    def preprocess(self, program, compile_spec, debug_handles):
        calls = [n for n in program.graph_module.graph.nodes if n.op == "call_function"]
        if len(calls) == 1 and calls[0].target is torch.ops.aten.tanh.default:
            raise bc.UnsupportedNodeError(calls[0], "no tanh kernel on this target")
        try:
            return super().preprocess(program, compile_spec, debug_handles)
        except BuildError as exc:
            bc.failing_nodes(program, self, compile_spec).raise_verdict(exc)


def test_a_rejection_the_one_node_build_raised_keeps_its_own_reason():
    # The rejection reads as the node's own build says it, not as that error's whole text (the piece's
    # source line, wrapped in a second "The node of ... is not supported"): a batch of operator checks
    # and the check run alone then give the same reason.
    program = torch.export.export(TanhModel(), (torch.randn(3),))
    found = bc.failing_nodes(program, RejectsWhenAlone())
    assert found.errors[found[0]] == "no tanh kernel on this target"
    assert found.failures[found[0]].diagnostic == "no tanh kernel on this target"
    with pytest.raises(bc.UnsupportedNodeError) as caught:
        bc.to_backend(TanhModel(), RejectsWhenAlone(), {"forward": {}}, example_inputs=(torch.randn(3),))
    assert caught.value.reason == "no tanh kernel on this target"
    assert str(caught.value).count("is not supported in this compiler") == 1


class ScaledByWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.relu(x * self.w) + x


def test_failing_nodes_keeps_weights_constant_and_says_the_failure_needs_them():
    program = torch.export.export(ScaledByWeight(), (torch.randn(4),))
    found = bc.failing_nodes(program, ConstantMulCrash())
    assert [n.target for n in found] == [torch.ops.aten.mul.Tensor]
    assert found.failures[found[0]].reproduced == "only_with_constants"
    with pytest.raises(bc.CompilerError, match=r"only with its weights as constants"):
        bc.to_backend(ScaledByWeight(), ConstantMulCrash(), {"forward": {}}, example_inputs=(torch.randn(4),))
    # A correct backend: nothing fails alone, and the model lowers.
    assert bc.failing_nodes(program, "reference") == []


class ParameterAndBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("shift", torch.randn(4))
        self.register_buffer("scratch", torch.randn(4), persistent=False)

    def forward(self, x):
        return torch.tanh(x * self.w + self.shift) - self.scratch


class WeightsByKind(FusedBuild):
    """Builds as `FusedBuild`, and, as ExecuTorch's XNNPACK passes do, reads each weight by its kind."""

    name = "weights_by_kind"

    def preprocess(self, program, compile_spec, debug_handles):
        signature = program.graph_signature
        for spec in signature.input_specs:
            if spec.kind.name == "PARAMETER":
                assert isinstance(program.state_dict[spec.target], torch.nn.Parameter)
            elif spec.kind.name == "BUFFER":
                where = program.state_dict if spec.persistent else program.constants
                assert isinstance(where[spec.target], torch.Tensor)
        seen.append(sorted((s.kind.name, s.target, s.persistent) for s in signature.input_specs if s.target))
        return super().preprocess(program, compile_spec, debug_handles)


seen: list = []


def test_failing_nodes_keeps_each_weights_kind_and_name():
    # A parameter made a lifted constant in the one-node program failed in ExecuTorch's passes
    # ("`weight0` is not a buffer") and put the blame on a node that builds in the program.
    program = torch.export.export(ParameterAndBuffers(), (torch.randn(4),))
    seen.clear()
    found = bc.failing_nodes(program, WeightsByKind())
    assert [n.target for n in found] == [torch.ops.aten.tanh.default]
    kinds = {entry for piece in seen for entry in piece}
    assert kinds == {("PARAMETER", "w", None), ("BUFFER", "shift", True), ("BUFFER", "scratch", False)}


class DynamicTanh(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(torch.relu(x) + 1) - x


def _dynamic_program():
    batch = torch.export.Dim("batch", min=2, max=64)
    return torch.export.export(DynamicTanh(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))


def test_failing_nodes_keeps_the_range_constraints_and_finds_the_node_that_fails_only_dynamic():
    program = _dynamic_program()
    found = bc.failing_nodes(program, UnboundedDynamic())
    # With the ranges lost, every node's piece would fail ("size s0 has no range").
    assert [n.target for n in found] == [torch.ops.aten.tanh.default]
    assert found.failures[found[0]].reproduced == "only_with_dynamic_shapes"
    assert found.failures[found[0]].diagnostic == "'math.tanh' op has no dynamic-shape lowering"
    # The same model exported static lowers whole.
    bc.to_backend(DynamicTanh(), UnboundedDynamic(), {"forward": {}}, example_inputs=(torch.randn(4, 3),))


class Branchy(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda v: v.sin(), lambda v: v.cos(), (x,)) + 1


def test_failing_nodes_reports_a_cond_as_a_node():
    program = torch.export.export(Branchy(), (torch.randn(3),))
    found = bc.failing_nodes(program, NoCond())
    assert [n.target for n in found] == [torch.ops.higher_order.cond]
    assert found.failures[found[0]].op == "higher_order.cond"
    assert bc.failing_nodes(program, "reference") == []


def _run(pytester, backend, *extra):
    pytester.syspathinsert(pathlib.Path(__file__).parent)
    pytester.makeini("[pytest]\n")
    report = pytester.path / f"{backend}.json"
    result = pytester.runpytest(
        "-p",
        "broken_backends_wholegraph",
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        "--backendconf-select=backendconf::parity::smooth_activations[float32]",
        f"--backendconf-report={report}",
        *extra,
    )
    return result, json.loads(report.read_text())


def test_in_a_suite_run_a_compiler_crash_is_a_failure_counted_apart_with_its_diagnostic_as_reason(pytester):
    result, document = _run(pytester, "claimed_tanh_crash")
    tests = [t for t in document["tests"] if t["id"].startswith("backendconf::parity::")]
    assert [t["outcome"] for t in tests] == ["failed"], tests
    assert tests[0]["error"]["type"] == "CompilerError"
    assert tests[0]["details"]["compile_error"] == "compiler_failure"
    assert document["errors"]["compile_errors"] == {"unsupported": 0, "compiler_failure": 1, "undecided": 0}
    result.stdout.fnmatch_lines(["*compile errors: 0 not claimed*1 compiler failure on claimed nodes*0 undecided*"])
    # The known-failures file it writes gives the diagnostic line as the reason.
    known = pytester.path / "known.toml"
    _run(pytester, "claimed_tanh_crash", f"--backendconf-write-known-failures={known}")
    assert (
        "CompilerError: The node of aten::tanh failed in this compiler, which claims it: "
        f"{DIAGNOSTIC}" in known.read_text()
    )


def test_in_a_suite_run_each_verdict_is_counted(pytester):
    _, unsupported = _run(pytester, "fused_build")
    assert unsupported["errors"]["compile_errors"] == {"unsupported": 1, "compiler_failure": 0, "undecided": 0}
    _, undecided = _run(pytester, "fused_build_no_probe")
    assert undecided["errors"]["compile_errors"] == {"unsupported": 0, "compiler_failure": 0, "undecided": 1}
    _, clean = _run(pytester, "reference")
    assert clean["errors"]["compile_errors"] == {"unsupported": 0, "compiler_failure": 0, "undecided": 0}


def test_a_known_failure_reason_is_the_diagnostic_line_not_the_wrapper():
    from pytest_backendconf.report import ReportTest

    wrapped = "preprocess() of backend 'fuse' failed for method 'forward': CompilerToolError: " + CRASH_TEXT
    test = ReportTest(
        id="backendconf::parity::x[float32]",
        category="parity",
        outcome="failed",
        verdict="failed",
        error={"type": "LoweringError", "module": "pytest_backendconf.errors", "message": wrapped},
    )
    assert test.first_line() == f"LoweringError: {DIAGNOSTIC}"
    # A failure without a diagnostic keeps its first line; the suite's own verdict always does.
    plain = {"type": "ValueError", "module": "builtins", "message": "bad blob\nmore"}
    assert ReportTest(**{**test.__dict__, "error": plain}).first_line() == "ValueError: bad blob"
    verdict = {"type": "CheckFailed", "module": "x", "message": "outputs differ\n<stdin>:1:1: error: x"}
    assert ReportTest(**{**test.__dict__, "error": verdict}).first_line() == "outputs differ"


class Scaled(torch.nn.Module):
    def forward(self, x, scale: float):
        return torch.tanh(x) * scale


def test_the_suites_minimal_reproduction_gives_minify_the_tensors_only():
    from pytest_backendconf.suite._minify import tensor_inputs

    program = torch.export.export(Scaled(), (torch.randn(3), 2.0))
    flat = [torch.randn(3), 2.0]
    with pytest.raises(TypeError, match="input 1 is a float"):  # what the suite used to pass
        bc.minify(program, "reference", flat, lambda outcome: False)
    given = tensor_inputs(program, flat)
    assert len(given) == 1 and given[0] is flat[0]


def test_execute_gets_a_python_number_input_as_the_exported_value():
    from backendconf_reference import ReferenceBackend

    seen = []

    class Spy(ReferenceBackend):
        name = "spy_inputs"

        def execute(self, handle, inputs):
            seen.append(list(inputs[1:]))
            return super().execute(handle, inputs)

    lowered = bc.to_backend(Scaled(), Spy(), {"forward": {}}, example_inputs=(torch.randn(3), 2.0))
    lowered(torch.randn(3), 2.0)
    assert seen == [[2.0]] and type(seen[0][0]) is float
    with pytest.raises(bc.InputSpecError, match="lowered with scale=2.0"):
        lowered(torch.randn(3), 5.0)
