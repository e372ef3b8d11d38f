"""The contract and parity checks catch what they claim to, and only that.

Each broken backend (tests/broken_backends_contract.py) is the reference
backend with one defect; a real pytest run of the suite against it must
fail exactly the checks aimed at that defect.
"""

from __future__ import annotations

import os
import re

import pytest

from pytest_backendconf.conformance._spec import section
from pytest_backendconf.conformance._zoo_loader import load_zoo

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ZOO = {case.name: case for case in load_zoo()}
CONTRACT_CASES = list(ZOO) if section("contract")["cases"] == "all" else section("contract")["cases"]
MULTI_METHOD = sorted(name for name in CONTRACT_CASES if len(ZOO[name].methods) > 1)


def run_suite(pytester, backend_class: str | None, *select: str):
    pytester.syspathinsert(TESTS_DIR)
    if backend_class:
        pytester.makeconftest(
            f"from broken_backends_contract import {backend_class}\n"
            f"def backendconf_register_backends(register):\n    register({backend_class}())\n"
        )
    args = [f"--backendconf-select={s}" for s in select]
    return pytester.runpytest(
        f"--backend={_name(backend_class)}", "-p", "no:cacheprovider", "-rfEs", "--backendconf-hypothesis=ci", *args
    )


def _name(backend_class: str | None) -> str:
    if backend_class is None:
        return "reference"
    import broken_backends_contract

    return getattr(broken_backends_contract, backend_class).name


def failed_ids(result) -> set[str]:
    # The short test summary: "FAILED <id>" or "FAILED <id> - <message>".
    return {m.group(1) for m in re.finditer(r"^FAILED (backendconf::\S+)(?: - .*)?$", result.stdout.str(), re.M)}


def contract_ids(check: str) -> set[str]:
    return {f"backendconf::contract::{check}[{case}]" for case in CONTRACT_CASES}


@pytest.mark.slow
def test_the_reference_backend_passes_every_contract_check(pytester):
    result = run_suite(pytester, None, "backendconf::contract::*")
    result.assert_outcomes(passed=2 + 5 * len(CONTRACT_CASES) + len(section("contract")["profiling_cases"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, expected, message",
    [
        (
            "FlickeringAvailability",
            {"backendconf::contract::is_available_is_a_stable_bool"},
            "is_available() changed between calls",
        ),
        ("MalformedCapabilities", {"backendconf::contract::capabilities_are_well_formed"}, "supported_ops has ['mul']"),
        (
            "SaltedBlob",
            contract_ids("preprocess_is_deterministic"),
            "preprocess() gave different bytes for the same program",
        ),
        (
            "DropsMethods",
            {f"backendconf::contract::compile_returns_a_handle_per_method[{c}]" for c in MULTI_METHOD},
            "compile() returned no handle for method(s) ['decode']",
        ),
        (
            "ReturnsTuple",
            contract_ids("execute_matches_the_output_spec"),
            "execute() returned tuple for method 'forward'; it must return a list",
        ),
    ],
)
def test_each_contract_defect_fails_exactly_its_check(pytester, backend, expected, message):
    result = run_suite(pytester, backend, "backendconf::contract::*")
    assert failed_ids(result) == expected
    assert message in result.stdout.str()
    result.stdout.fnmatch_lines(["reproduce: pytest --backend=* *--backendconf-select=backendconf::contract::*"])


@pytest.mark.slow
def test_a_program_written_to_by_preprocess_is_caught(pytester):
    result = run_suite(pytester, "MutatesParameters", "backendconf::contract::*")
    failed = failed_ids(result)
    assert failed and failed <= contract_ids("preprocess_leaves_the_program_alone")
    # Exactly the models that have a float parameter for the backend to overwrite.
    with_parameters = {
        name for name in CONTRACT_CASES if any(v.is_floating_point() for v in ZOO[name].build().state_dict().values())
    }
    assert {f.split("[")[1].rstrip("]") for f in failed} == with_parameters
    result.stdout.fnmatch_lines(["*preprocess() changed parameter * it must treat the exported program as read-only*"])


# A few models with float outputs, and one whose outputs are all integers.
PARITY_SAMPLE = ("nested_nml", "small_cnn", "tiny_attention", "integer_arithmetic")


@pytest.mark.slow
def test_parity_catches_wrong_half_precision_outputs_only(pytester):
    result = run_suite(pytester, "WrongInHalf", *(f"backendconf::parity::{c}*" for c in PARITY_SAMPLE))
    float_outputs = [c for c in PARITY_SAMPLE if c != "integer_arithmetic"]
    # Models with varying dimensions fail their dynamic-shape check in float16 too.
    dynamic = [c for c in float_outputs if ZOO[c].dims]
    assert dynamic
    assert failed_ids(result) == {f"backendconf::parity::{c}[float16]" for c in float_outputs} | {
        f"backendconf::parity::{c}[float16-dynamic]" for c in dynamic
    }
    outcomes = result.parseoutcomes()
    # float32 and bfloat16 of each, again for the dynamic checks, and the integer model.
    assert outcomes["passed"] == 2 * (len(float_outputs) + len(dynamic)) + 1
    result.stdout.fnmatch_lines(
        [
            "*the backend's outputs differ from the model in float64, cast back (and eager PyTorch in the "
            "tested dtype) for inputs drawn with seed=*",
            "*max abs error 0.5*, max rel error*",
            "*tolerance rtol=0.001, atol=1e-05 (default); closeness*",
            "*eager PyTorch in float16 against the same reference: max abs error*",
        ]
    )


def test_a_rejected_op_makes_its_models_unsupported_never_passed(pytester):
    sample = ("nested_nml", "small_cnn", "mlp", "arithmetic_scalars", "reductions", "cat_stack")
    result = run_suite(pytester, "RejectsMul", *(f"backendconf::parity::{c}[[]float32[]]" for c in sample))
    cases = {c.name: c for c in load_zoo()}
    uses_mul = [c for c in sample if "aten.mul.Tensor" in cases[c].ops]
    assert 0 < len(uses_mul) < len(sample)
    result.assert_outcomes(passed=len(sample) - len(uses_mul), skipped=len(uses_mul))
    for case in uses_mul:
        result.stdout.fnmatch_lines(
            [
                f"SKIPPED * backendconf::parity::{case}[[]float32[]]: unsupported: The node of aten::mul is not supported in this compiler (this backend has no multiplier) at *zoo.py:*"
            ]
        )


VENDOR_CASE = '''
import torch
import pytest_backendconf as bc

class Gate(torch.nn.Module):
    """A vendor's own model: a gated linear unit."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, x):
        a, b = self.proj(x).chunk(2, dim=-1)
        return a * torch.sigmoid(b)

def backendconf_register_cases(register):
    register(bc.ModelCase(name="vendor_gate", build=lambda: Gate().eval(),
                          inputs={"forward": (bc.TensorInput(shape=(2, 8)),)}, float_dtypes=("float32",)))
'''


def test_a_vendor_case_runs_through_every_per_model_check(pytester):
    pytester.makeconftest(VENDOR_CASE)
    result = pytester.runpytest(
        "--backend=reference",
        "-p",
        "no:cacheprovider",
        "--backendconf-hypothesis=ci",
        "--backendconf-select=*vendor_gate*",
        "--collect-only",
        "-q",
    )
    ids = set(re.findall(r"^(backendconf::\S+)$", result.stdout.str(), re.M))
    categories = {i.split("::")[1] for i in ids}
    assert {"contract", "parity", "serialization"} <= categories
    assert "backendconf::parity::vendor_gate[float32]" in ids
    result = pytester.runpytest(
        "--backend=reference",
        "-p",
        "no:cacheprovider",
        "--backendconf-hypothesis=ci",
        "--backendconf-select=backendconf::parity::vendor_gate*",
        "--backendconf-select=backendconf::contract::*[[]vendor_gate[]]",
    )
    result.assert_outcomes(passed=1 + 5)
