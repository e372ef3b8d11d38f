"""PyTorch's own demo backend through the suite's TorchScript form, registered as a vendor would.

``libbackend_with_compiler.so`` ships in every torch wheel's ``torch/lib/``
and registers ``backend_with_compiler_demo``: the seeds' compiler. It
compiles ``aten::add`` and ``aten::sub`` (their alpha a constant) of two
float inputs, computes the first element only, and rejects every other node
with "The node of X is not supported in this compiler. Source code: ...".
The seeds' own models are exactly that, so its outcome table is pinned here:
what passes, what is unsupported and with which text, and that nothing fails.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

DEMO = os.path.join(os.path.dirname(torch.__file__), "lib", "libbackend_with_compiler.so")
NAME = "backend_with_compiler_demo"
SEEDS = ("seed_basic_module", "seed_nested_nml", "seed_two_methods")

pytestmark = pytest.mark.skipif(not os.path.exists(DEMO), reason=f"this torch build ships no {DEMO}")

CONFTEST = f"""
    import torch
    import pytest_backendconf as bc

    def backendconf_register_backends(register):
        # Its execute reads float data only: float32 is the one dtype it declares.
        register(bc.TorchScriptBackend(
            name={NAME!r}, library={DEMO!r}, capabilities=bc.Capabilities(dtypes={{torch.float32}}),
        ))
"""

#: The seeds' models, the probes, and one model of each kind the demo rejects.
SELECTION = [
    "contract::library_registers_backend",
    "*seed_*",
    "availability::*",
    "symbolication::*",
    "reliability::memory",
    "contract::lowers?mlp?",
    "parity::mlp?float32?",
    "parity::pools?float32?",
    "parity::arithmetic_tensors?float32?",
    "serialization::target?mlp?",
    "reliability::repeated_calls?tiny_attention?",
]

#: Every check that passes. The demo has no real defect the selection reaches: its first-element-only
#: arithmetic and its ignored alpha and scalar operands show on no seed model (one-element inputs,
#: alpha 1), and would fail parity on any model that had them (docs/writing-a-backend.md).
PASSED = {
    "contract::library_registers_backend",
    "availability::host_is_available",
    "symbolication::rejection_text",
    "symbolication::runtime_error_lite",
    "symbolication::runtime_error_without_debug_info",
    "reliability::memory",
    "serialization::wrapper_attributes_and_bundled_inputs[seed_basic_module]",
    *(f"contract::lowers[{seed}]" for seed in SEEDS),
    *(f"parity::{seed}[float32]" for seed in SEEDS),
    *(f"serialization::{check}[{seed}]" for seed in SEEDS for check in ("jit_save_load", "lite_round_trip", "target")),
    *(
        f"reliability::{check}[seed_two_methods]"
        for check in ("repeated_calls", "inputs_unchanged", "deterministic_preprocess")
    ),
}
#: Unsupported, with the demo's own text.
UNSUPPORTED = {
    "contract::lowers[mlp]": "The node of prim::GetAttr is not supported in this compiler.",
    "parity::mlp[float32]": "The node of prim::GetAttr is not supported in this compiler.",
    "parity::pools[float32]": "The node of prim::ListConstruct is not supported in this compiler.",
    "parity::arithmetic_tensors[float32]": "The node of aten::mul is not supported in this compiler.",
    "serialization::target[mlp]": "The node of prim::GetAttr is not supported in this compiler.",
    "reliability::repeated_calls[tiny_attention]": "The node of prim::GetAttr is not supported in this compiler.",
}
#: Not applicable, with the reason.
SKIPPED = {
    "availability::unavailable_rows": "is available here",
    "reliability::threads[seed_two_methods]": "does not declare thread_safe",
}


@pytest.mark.slow
def test_pytorchs_demo_backend_passes_the_seeds_models_and_fails_nothing(pytester):
    pytester.makeconftest(textwrap.dedent(CONFTEST))
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        f"--backend={NAME}",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::DeprecationWarning",
        f"--backendconf-report={report}",
        *[f"--backendconf-select={pattern}" for pattern in SELECTION],
    )
    tests = {t["id"].removeprefix("backendconf::"): t for t in json.loads(report.read_text())["tests"]}
    table = {name: t["outcome"] for name, t in tests.items()}
    failed = {
        name: tests[name]["error"]
        for name, outcome in table.items()
        if outcome not in ("passed", "unsupported", "skipped")
    }
    assert failed == {}, result.stdout.str()[-4000:]
    assert {name for name, outcome in table.items() if outcome == "passed"} == PASSED
    assert {name: tests[name]["reason"] for name in table if table[name] == "unsupported"} == UNSUPPORTED
    assert {name for name, outcome in table.items() if outcome == "skipped"} == set(SKIPPED)
    for name, reason in SKIPPED.items():
        assert reason in (tests[name]["reason"] or ""), tests[name]
    assert result.ret == 0


def run_demo(pytester, *patterns: str) -> dict[str, dict]:
    pytester.makeconftest(textwrap.dedent(CONFTEST))
    report = pytester.path / "report.json"
    pytester.runpytest(
        f"--backend={NAME}",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::DeprecationWarning",
        "--backendconf-in-process",  # the spec changed below is this process's
        f"--backendconf-report={report}",
        *[f"--backendconf-select={pattern}" for pattern in patterns],
    )
    return {t["id"].removeprefix("backendconf::"): t for t in json.loads(report.read_text())["tests"]}


def test_where_no_probe_variant_lowers_the_checks_are_unsupported_with_the_backends_text(pytester, monkeypatch):
    # Only the probe with a parameter, which the demo refuses at lowering (prim::GetAttr): the checks
    # that run it say so as unsupported, never as a failure with the lowering's traceback.
    from pytest_backendconf.conformance import section

    spec = section("torchscript")
    monkeypatch.setitem(spec, "runtime_error", [v for v in spec["runtime_error"] if v["model"] == "TsScale"])
    tests = run_demo(
        pytester,
        "symbolication::runtime_error_lite",
        "symbolication::runtime_error_without_debug_info",
        "reliability::memory",
    )
    assert {name: (t["outcome"], t["reason"]) for name, t in tests.items()} == {
        name: (
            "unsupported",
            "the backend rejects every variant of the probe: "
            "TsScale: The node of prim::GetAttr is not supported in this compiler.",
        )
        for name in (
            "symbolication::runtime_error_lite",
            "symbolication::runtime_error_without_debug_info",
            "reliability::memory",
        )
    }


def test_the_rejection_probe_is_made_of_operators_the_backend_accepts(pytester, monkeypatch):
    # relu first (the demo rejects it: the mystery op would never be reached), then x - h, which it
    # compiles: the probe it gets is x - h and the mystery op, and the text names the mystery op's line.
    from pytest_backendconf.conformance import section

    spec = section("torchscript")
    tests = run_demo(pytester, "symbolication::rejection_text")
    assert tests["symbolication::rejection_text"]["outcome"] == "passed", tests
    # With relu the only variant, the demo's text rightly names relu: the check cannot pass.
    monkeypatch.setitem(spec["rejection"], "variants", ["TsMysteryAfterRelu"])
    tests = run_demo(pytester, "symbolication::rejection_text")
    error = tests["symbolication::rejection_text"]["error"]["message"]
    assert "does not say 'The node of backendconf_probe::mystery" in error and "aten::relu" in error
