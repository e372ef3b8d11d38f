"""The delegation category: partial delegation when a backend cannot lower a model whole.

The reference backend lowers everything, so the category is "not needed"
there; a backend without aten.sub runs the models with sub partially
delegated; and each deliberately broken backend fails the check that
catches its defect.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


def run(pytester, backend: str, *select: str, report: bool = False) -> tuple[dict[str, str], pytest.RunResult]:
    pytester.syspathinsert(TESTS)
    pytester.makeconftest(
        textwrap.dedent("""
        from partition_models import (
            ClaimsTooMuch, DeclaresSubtraction, DropsOutputWithoutSub, RejectsSub, SwapsInputsWithoutSub,
        )

        def backendconf_register_backends(register):
            for cls in (ClaimsTooMuch, DeclaresSubtraction, DropsOutputWithoutSub, RejectsSub, SwapsInputsWithoutSub):
                register(cls())
    """)
    )
    extra = ["--backendconf-report=report.json"] if report else []
    result = pytester.runpytest(
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        "-m",
        "delegation",
        *extra,
        *[f"--backendconf-select=backendconf::delegation::{pattern}" for pattern in select],
    )
    outcomes = {}
    for r in result.reprec.getreports("pytest_runtest_logreport"):
        if r.when == "call" or r.outcome != "passed":
            outcomes[r.nodeid.rsplit("::", 1)[-1]] = r.outcome
    return outcomes, result


def test_the_reference_backend_needs_no_partial_delegation(pytester):
    outcomes, result = run(pytester, "reference", "nested_nml*", "arithmetic_tensors?float32?", "target*")
    assert set(outcomes.values()) == {"skipped"} and len(outcomes) == 3 + 1 + 3
    result.stdout.fnmatch_lines(["delegation     not needed: the backend lowers all 4 model runs whole"])


def test_a_backend_without_sub_runs_the_models_with_sub_partially(pytester):
    outcomes, result = run(
        pytester, "rejects_sub", "nested_nml?float32?", "small_cnn?float32?", "target?nested_nml?", report=True
    )
    assert outcomes == {
        "nested_nml[float32]": "passed",
        "small_cnn[float32]": "skipped",
        "target[nested_nml]": "passed",
    }
    result.stdout.fnmatch_lines(
        [
            "delegation     2/2 passed (100.0%); 1 not needed (lowered whole); 2 of 3 nodes delegated (66.7%) in 1 "
            "model run; 0 unsupported, 0 known failures, 0 failed — score = passed / all 2 that needed partial delegation"
        ]
    )
    report = json.loads((pytester.path / "report.json").read_text())
    (test,) = [t for t in report["tests"] if t["id"].endswith("nested_nml[float32]")]
    assert test["details"] == {"delegation": {"delegated": 2, "total": 3, "partitions": 2}}


@pytest.mark.parametrize(
    "backend, case, message",
    [
        # Declares aten.sub in supported_ops, then rejects it.
        (
            "declares_sub",
            "nested_nml?float32?",
            "*backend 'declares_sub' declares aten.sub.Tensor in Capabilities.supported_ops, but preprocess rejected node 'sub'*",
        ),
        # Its supported_nodes() claims sub, which preprocess rejects: a partition that claims too much.
        (
            "claims_too_much",
            "nested_nml?float32?",
            "*supported_nodes() of backend 'claims_too_much' lists node 'sub' (aten.sub.Tensor), but preprocess rejected it*",
        ),
        # A fallback boundary that loses a value.
        (
            "drops_output_no_sub",
            "nested_output?float32?",
            "*partition 'forward.partition0': execute() of backend 'drops_output_no_sub' must return a list of 4 outputs*",
        ),
        # Partition inputs in the wrong order: same shapes, other values.
        (
            "swaps_inputs_no_sub",
            "arithmetic_tensors?float32?",
            "*arithmetic_tensors.forward in float32, partially delegated (*): the backend's outputs differ "
            "from eager PyTorch for example seed *",
        ),
    ],
)
def test_each_broken_backend_is_caught(pytester, backend, case, message):
    outcomes, result = run(pytester, backend, case)
    assert list(outcomes.values()) == ["failed"]
    result.stdout.fnmatch_lines([message])
