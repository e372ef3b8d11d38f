"""The symbolication checks: the reference backend passes them, each broken backend fails exactly its own."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

import broken_backends
from pytest_backendconf.conformance._spec import section

TESTS_DIR = Path(__file__).parent
CATEGORY = "backendconf::symbolication::*"

CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
from broken_backends import {cls}

def backendconf_register_backends(register):
    register({cls}())
"""


def run_suite(pytester, cls: str | None, *options: str):
    """Run the suite against ``broken_backends.<cls>`` (the reference backend if None), in process."""
    name = "reference"
    if cls is not None:
        pytester.makeconftest(CONFTEST.format(tests=str(TESTS_DIR), cls=cls))
        name = getattr(broken_backends, cls).name
    return pytester.runpytest(f"--backend={name}", "-p", "no:cacheprovider", "-rfs", *options)


def failed_ids(result) -> set[str]:
    # The short test summary: "FAILED <id>" or "FAILED <id> - <message>".
    return {m.group(1) for m in re.finditer(r"^FAILED (backendconf::\S+?)(?: - .*)?$", result.stdout.str(), re.M)}


def assert_failed_exactly(result, patterns: list[str], count: int) -> None:
    failed = failed_ids(result)
    assert len(failed) == count, failed
    for check in failed:
        assert any(fnmatch.fnmatchcase(check, p) for p in patterns), f"{check} failed, unexpectedly"


def _count() -> int:
    spec = section("symbolication")
    return len(spec["rejections"]) + len(spec["faults"]) + len(spec["debug_info_cases"]) + len(spec["separate_cases"])


def test_the_reference_backend_passes_every_symbolication_check(pytester):
    result = run_suite(pytester, None, f"--backendconf-select={CATEGORY}")
    result.assert_outcomes(passed=_count())


REJECTIONS = "backendconf::symbolication::unsupported_node_is_symbolicated*"
FAULTS = "backendconf::symbolication::runtime_fault_is_symbolicated*"
COVERAGE = "backendconf::symbolication::debug_info_covers_every_node*"
APART = "backendconf::symbolication::debug_info_apart*"


@pytest.mark.parametrize(
    ("cls", "failing", "count", "lines"),
    [
        pytest.param(
            "AcceptsEverything",
            [REJECTIONS],
            3,
            [
                "*preprocess() accepted backendconf_probe::mystery in Mystery (*_probe_models.py), an op no "
                "backend can know, and returned * bytes; execute() then raised RuntimeError: no kernel for "
                "backendconf_probe.mystery.default. Reject such a node at preprocess with UnsupportedNodeError*"
            ],
            id="accepts-then-fails-at-execute",
        ),
        pytest.param(
            "RejectsWithTheWrongError",
            [REJECTIONS],
            3,
            [
                "*preprocess() raised NotImplementedError for backendconf_probe::mystery in Outer*",
                "A node the backend cannot compile must be rejected with UnsupportedNodeError(node, reason)*",
            ],
            id="wrong-exception-type",
        ),
        pytest.param(
            "NoSourceRejection",
            [REJECTIONS],
            3,
            [
                "*UnsupportedNodeError.node is node 'output' (output); expected node 'mystery' "
                "(backendconf_probe::mystery), the one the backend cannot compile",
                "*it has no line '  Module hierarchy:top(Outer)::forward.middle(Middle)::forward.inner(Inner)"
                "::forward.backendconf_probe::mystery'",
                "*frame 1 of 3 of the traceback should be",
                '*File "*_probe_models.py", line *, in forward',
                "*return self.middle(x) * 2",
                "*~~~~~~~~~~~~~~ <--- HERE",
            ],
            id="rejects-another-node",
        ),
        pytest.param(
            "WrongHandleOnFault",
            [FAULTS],
            4,
            [
                "*execute() reported debug handle * for the fault injected at node 'mul' of nested_nml.forward "
                "*, which is not a handle of this lowered module (its lowering numbered its nodes 0..*); expected *, "
                "the handle preprocess was given for "
                "that node (the user sees only: 'Debug info for handle(s): debug_handles:{*}, was not found.')"
            ],
            id="wrong-debug-handle",
        ),
        pytest.param(
            "ChangesProgram",
            [COVERAGE],
            4,
            [
                "*bc.debug_info() of encoder_decoder.encode * does not match the program's * nodes*",
                "*no debug info for 'clone_default*' (aten::clone)",
            ],
            id="program-changed-at-preprocess",
        ),
        pytest.param(
            "CopiesStackTracesIntoBlob",
            [APART],
            3,
            [
                '*nested_nml (float32): the handles-only archive (save(..., debug_info="separate")) still holds '
                "* piece(s) of the model's source:",
                "*source line *zoo.py:* 'return x * 5' in the archive file, entry 'blobs/forward.bin'",
            ],
            id="stack-traces-in-the-blob",
        ),
    ],
)
def test_a_broken_backend_fails_exactly_its_checks(pytester, cls, failing, count, lines):
    result = run_suite(pytester, cls, f"--backendconf-select={CATEGORY}")
    result.assert_outcomes(failed=count, passed=_count() - count)
    assert_failed_exactly(result, failing, count)
    result.stdout.fnmatch_lines(lines)


def test_expected_texts_come_from_the_source_file():
    # Line numbers are never written in suite.toml: they follow the file.
    from pytest_backendconf.conformance import _probe_models
    from pytest_backendconf.conformance.symbolication import expected_frames

    [[frame]] = expected_frames(_probe_models, [["Inner.forward", "torch.ops.backendconf_probe.mystery(x - 1)"]])
    lines = Path(_probe_models.__file__).read_text().splitlines()
    line = next(i + 1 for i, text in enumerate(lines) if "mystery(x - 1)" in text)
    assert frame == (
        f'  File "{_probe_models.__file__}", line {line}, in forward\n'
        "    return torch.ops.backendconf_probe.mystery(x - 1)\n"
        "           ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE"
    )


def test_a_backend_without_fault_injection_skips_the_runtime_checks(pytester):
    pytester.makeconftest(
        "import dataclasses\n"
        "from backendconf_reference import ReferenceBackend\n"
        "class NoFaults(ReferenceBackend):\n"
        "    name = 'no_faults'\n"
        "    capabilities = dataclasses.replace(ReferenceBackend.capabilities, fault_injection=False)\n"
        "def backendconf_register_backends(register):\n"
        "    register(NoFaults())\n"
    )
    result = pytester.runpytest(
        "--backend=no_faults", "-p", "no:cacheprovider", "-rs", f"--backendconf-select={FAULTS}"
    )
    result.assert_outcomes(skipped=len(section("symbolication")["faults"]))
    result.stdout.fnmatch_lines(["*backend 'no_faults' does not declare fault_injection*"])


def test_the_probe_op_is_registered_once_per_process():
    from pytest_backendconf.conformance import _probe_models

    _probe_models.register_probe_op()  # again: a no-op, not torch.library's "already registered"
    import torch

    assert torch.equal(torch.ops.backendconf_probe.mystery(torch.ones(2)), torch.ones(2))


def test_a_backend_that_runs_any_op_has_no_rejection_to_check(pytester):
    # A backend with a fallback to eager PyTorch knows the probe op too: skipped, not failed.
    pytester.makeconftest(
        "from backendconf_reference import ReferenceBackend\n"
        "class Eager(ReferenceBackend):\n"
        "    name = 'eager_fallback'\n"
        "    programs = []\n"
        "    def preprocess(self, program, compile_spec, debug_handles):\n"
        "        self.programs.append(program.module())\n"
        "        return str(len(self.programs) - 1).encode()\n"
        "    def compile(self, processed, method_compile_spec):\n"
        "        return {m: self.programs[int(blob)] for m, blob in processed.items()}\n"
        "    def execute(self, handle, inputs):\n"
        "        return [handle(*inputs)]\n"
        "def backendconf_register_backends(register):\n"
        "    register(Eager())\n"
    )
    result = pytester.runpytest(
        "--backend=eager_fallback", "-p", "no:cacheprovider", "-rs", f"--backendconf-select={REJECTIONS}"
    )
    result.assert_outcomes(skipped=len(section("symbolication")["rejections"]))
    result.stdout.fnmatch_lines(
        ["*backend 'eager_fallback' ran the custom op correctly (a fallback for unknown ops?)*"]
    )


def test_a_backend_that_lacks_an_op_beside_the_probe_op_gets_unsupported_not_failed(pytester):
    # Every probe model has an add (or a cond around it) beside the probe op. A backend without
    # add rejects that node first, in the probe model as in any other: "unsupported" there too.
    pytester.makeconftest(
        "import torch\n"
        "import pytest_backendconf as bc\n"
        "from backendconf_reference import ReferenceBackend\n"
        "from pytest_backendconf.debuginfo._handles import walk_nodes\n"
        "class NoAdd(ReferenceBackend):\n"
        "    name = 'no_add'\n"
        "    def preprocess(self, program, compile_spec, debug_handles):\n"
        "        for node in walk_nodes(program.graph_module):\n"
        "            if node.op == 'call_function' and node.target is torch.ops.aten.add.Tensor:\n"
        "                raise bc.UnsupportedNodeError(node, 'no adder on this device')\n"
        "        return super().preprocess(program, compile_spec, debug_handles)\n"
        "def backendconf_register_backends(register):\n"
        "    register(NoAdd())\n"
    )
    result = pytester.runpytest(
        "--backend=no_add", "-p", "no:cacheprovider", "-rs", f"--backendconf-select={REJECTIONS}"
    )
    result.assert_outcomes(skipped=len(section("symbolication")["rejections"]))
    result.stdout.fnmatch_lines(
        ["*the probe model, also uses aten::add, which backend 'no_add' rejects without the probe op too*"]
    )
