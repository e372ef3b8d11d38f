"""The quantized category: PT2E int8 programs judged against eager PyTorch running the same Q/DQ program.

Eager PyTorch running the Q/DQ program node by node passes, and so does a
backend that breaks rounding ties another way; a backend that truncates,
drops a zero point or scales the wrong per-channel axis fails, naming the
node. Without torchao the category is skipped with a notice naming the
extra, and the rest of the suite runs. The backends are in
broken_backends_quantized.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys

import pytest
import torch

pytest.importorskip("torchao", reason="the quantized category needs the [quant] extra (torchao)")

from pytest_backendconf.quant import (
    EXTRA_NOTICE,
    SCHEMES,
    QuantizedRule,
    judge_quantized,
    reference_quantizer,
    torchao_missing,
)

# torchao registers operators when first imported: import it here, once, before the in-process
# pytester runs, which remove the modules a run imported (a second import would register them again).
assert torchao_missing() is None
reference_quantizer(SCHEMES[0])
import broken_backends_quantized  # noqa: E402, F401

TESTS = os.path.dirname(os.path.abspath(__file__))
#: One check per scheme, on models with a convolution, a per-channel linear layer and a dynamic MLP.
SELECTED = (
    "backendconf::quantized::small_cnn[int8-static-per-tensor]",
    "backendconf::quantized::linear[int8-static-per-channel]",
    "backendconf::quantized::mlp[int8-dynamic]",
)


def run(pytester, backend: str, *select: str, extra=()) -> tuple[dict, pytest.RunResult]:
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    report = pytester.path / f"report-{backend}.json"
    args = ["-p", "broken_backends_quantized", f"--backend={backend}", "-p", "no:cacheprovider"]
    args += ["-p", "no:randomly", "--backendconf-in-process", "--backendconf-minify=off"]
    args += [f"--backendconf-report={report}", *extra, *(f"--backendconf-select={s}" for s in select)]
    result = pytester.runpytest(*args)
    tests = {t["id"]: t for t in json.loads(report.read_text())["tests"]}
    return tests, result


@pytest.mark.parametrize("backend", ["eager_qdq", "other_tie_rule"])
def test_eager_qdq_and_another_tie_rule_pass(pytester, backend):
    tests, result = run(pytester, backend, *SELECTED)
    assert set(tests) == set(SELECTED), result.stdout.str()[-2000:]
    assert {t["outcome"] for t in tests.values()} == {"passed"}, result.stdout.str()[-3000:]
    for test in tests.values():
        found = test["details"]["quantized"]
        assert found["lowered"] == "lowered whole" and found["outputs"]
        assert all(o["passed"] and o["sqnr_reference"] > 20 for o in found["outputs"])


@pytest.mark.parametrize(
    ("backend", "check", "node", "numbers"),
    [
        # Truncation puts most elements a step low: the share of elements off fails.
        ("truncating_quantize", SELECTED[0], "'quantize_per_tensor", "of elements off by >= 1 step"),
        # Without the zero point every activation is off by it: many steps.
        ("dropped_zero_point", SELECTED[0], "'dequantize_per_tensor", "max "),
        # Per-channel weight scales along the input axis: the linear layer's weights are wrong.
        ("wrong_channel_axis", SELECTED[1], "'dequantize_per_channel", "max "),
        # Run-time parameters that saturate negative activations: off in steps and far below in SQNR.
        ("unsigned_dynamic_range", SELECTED[2], "'choose_qparams", "quantized at run time)"),
    ],
)
def test_broken_quantized_kernels_fail_naming_the_node(pytester, backend, check, node, numbers):
    tests, result = run(pytester, backend, check)
    test = tests[check]
    assert test["outcome"] == "failed", result.stdout.str()[-3000:]
    text = test["error"]["message"]
    first, second = text.splitlines()[:2]
    model, _, scheme = check.removeprefix("backendconf::quantized::").partition("[")
    assert first.startswith(f"{model} [{scheme}: the backend's quantized outputs differ from eager PyTorch")
    assert "by more than rounding explains (at most 2 steps, at most 10% of elements (rounded up) off" in first
    assert second.startswith("  output 0: max ") and numbers in second and "SQNR against the float model" in second
    float_output = check.endswith("[int8-dynamic]")  # small_cnn's and linear's outputs come from a dequantize
    assert (
        "or, for an output no dequantize produces (a float output, as run-time quantization gives), an SQNR "
        "against the float model at most 3 dB below the reference's)" in first
    ) is float_output
    assert f"Diverges first at node {node}" in text, text
    # A static program is judged again layer by layer: the first layer off alone is named too.
    layer_line = "The first layer off alone, run on eager's integers: layer ending at node 'quantize_per_tensor"
    assert (layer_line in text) is not float_output, text


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["int8-static-per-tensor", "int8-static-per-channel"])
def test_resnet18s_rounding_carried_through_its_layers_passes_layer_by_layer(pytester, scheme):
    """The reference backend's integer kernels on a real network: outputs off by more than the rule, every layer not."""
    if importlib.util.find_spec("torchvision") is None:  # importing it here could fail: the suite knows how
        pytest.skip("the real-world models need the [models] extra (torchvision)")
    check = f"backendconf::quantized::resnet18[{scheme}]"
    tests, result = run(pytester, "reference", check, extra=["--backendconf-zoo=real"])
    assert tests[check]["outcome"] == "passed", result.stdout.str()[-3000:]
    carried = tests[check]["details"]["quantized"]["carried_through_layers"]
    assert carried, "the outputs were within the rule: this test no longer shows the layer verdict"
    rule = QuantizedRule()
    for draw in carried:
        assert draw["judged"] and draw["failing"] is None and draw["layers"] >= 40
        assert any(o["share_off"] > rule.max_share for o in draw["outputs"])  # the outputs alone would fail
        assert draw["max_steps"] <= 1 and draw["max_share_off"] < rule.max_share / 2


def test_a_backend_without_a_quantizer_for_a_scheme_is_unsupported_there(pytester):
    pytester.syspathinsert(TESTS)
    pytester.makeconftest(
        "from broken_backends_quantized import EagerQDQ\n"
        "from pytest_backendconf.quant import reference_quantizer\n"
        "class PerTensorOnly(EagerQDQ):\n"
        "    name = 'per_tensor_only'\n"
        "    def quantizer(self, scheme):\n"
        "        return reference_quantizer(scheme) if scheme == 'int8-static-per-tensor' else None\n"
        "def backendconf_register_backends(register):\n"
        "    register(PerTensorOnly())\n"
    )
    result = pytester.runpytest(
        "--backend=per_tensor_only",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--backendconf-in-process",
        "-rs",
        *(f"--backendconf-select=backendconf::quantized::linear[{s}]" for s in SCHEMES),
    )
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*linear[[]int8-dynamic[]]: unsupported: backend 'per_tensor_only' has no quantizer for scheme 'int8-dynamic'*"
        ]
    )


def _run_without(pytester, monkeypatch, package: str, *args: str) -> pytest.RunResult:
    """An in-process run of the reference backend in which importing ``package`` (or below it) raises ImportError."""
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)
    pytester.makeini("[pytest]\n")
    return pytester.runpytest("--backend=reference", "-p", "no:cacheprovider", "--backendconf-in-process", *args)


def test_without_torchao_the_category_is_skipped_with_a_notice_and_the_rest_runs(pytester, monkeypatch):
    # As if torchao were not installed: importing it (or its PT2E package) raises ImportError.
    result = _run_without(
        pytester,
        monkeypatch,
        "torchao",
        "-m",
        "quantized or parity",
        "--backendconf-select=backendconf::parity::linear[[]float32]",
        "--backendconf-select=backendconf::quantized::*",
    )
    result.stdout.fnmatch_lines([f"backendconf: {EXTRA_NOTICE}"])
    assert sum(EXTRA_NOTICE in line for line in result.outlines) == 1
    result.assert_outcomes(passed=1)


def test_a_torchao_that_does_not_import_fails_the_checks_naming_it_and_the_fix(pytester, monkeypatch):
    # torchao is found (the category exists, decided without importing it), but its PT2E package
    # does not import: the quantized checks fail with the import error and the install command.
    result = _run_without(
        pytester,
        monkeypatch,
        "torchao.quantization",
        "--backendconf-minify=off",
        "--backendconf-select=backendconf::quantized::linear[[]int8-static-per-tensor]",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*torchao is installed but its PT2E API does not import (ModuleNotFoundError: *); install the release "
            "the [[]quant] extra pins: pip install 'pytest-backendconf[[]quant]'*"
        ]
    )
    assert EXTRA_NOTICE not in result.stdout.str()


def test_the_category_is_collected_without_importing_torchao(pytester):
    # Collection in every pytest process, xdist worker and backend host: torchao's import (about 2 s
    # of CPU) waits for the first check that quantizes.
    pytester.makeconftest(
        "import sys\ndef pytest_collection_finish(session):\n    print('torchao imported:', 'torchao' in sys.modules)\n"
    )
    result = pytester.runpytest_subprocess("--backend=reference", "-p", "no:cacheprovider", "--co", "-q")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["torchao imported: False"])
    result.stdout.fnmatch_lines(["backendconf::quantized::*"])


def test_an_unknown_scheme_is_refused_naming_the_schemes():
    with pytest.raises(ValueError, match="unknown quantization scheme 'int4'.*int8-static-per-tensor, "):
        reference_quantizer("int4")


def test_the_rule_allows_rare_neighbouring_steps_but_not_a_shifted_share():
    step = 0.5
    reference = torch.arange(400, dtype=torch.float32) * step
    other_ties = reference.clone()
    other_ties[::50] += step  # 2% of elements on the neighbouring step: a tie broken the other way
    truncated = reference - step * (torch.arange(400) % 2 == 0)  # half of them a step low
    steps = [(step, "the scale of 'dq'")]
    rule = QuantizedRule(max_steps=2.0, max_share=0.05)
    ok = judge_quantized([other_ties], [reference], [reference], steps, rule)[0]
    assert ok.passed and ok.max_steps == 1 and ok.share_off == pytest.approx(0.02)
    bad = judge_quantized([truncated], [reference], [reference], steps, rule)[0]
    assert not bad.passed and bad.share_off == pytest.approx(0.5)
    far = judge_quantized([reference + 3 * step], [reference], [reference], steps, rule)[0]
    assert not far.passed and far.max_steps == pytest.approx(3)
    assert "max 3 steps" in far.text() and "the scale of 'dq'" in far.text()


def test_the_reference_backend_lowers_quantized_programs_whole_with_every_qdq_opcode(tmp_path):
    from backendconf_reference import ReferenceBackend

    from pytest_backendconf.conformance import quantized
    from pytest_backendconf.conformance._zoo_loader import load_zoo
    from pytest_backendconf.debuginfo import DebugHandleRecorder
    from pytest_backendconf.reference import bytecode, ops
    from pytest_backendconf.registry._registry import RegisteredBackend, Source
    from pytest_backendconf.suite._context import SuiteContext

    zoo = {case.name: case for case in load_zoo()}
    backend = ReferenceBackend()
    ctx = SuiteContext(RegisteredBackend(backend, Source("a test")), [zoo["small_cnn"]], tmp_dir=lambda _: tmp_path)
    used = set()
    for scheme in SCHEMES:
        program = quantized.quantized_programs(ctx, "small_cnn", scheme)["forward"]
        blob = backend.preprocess(program, {}, DebugHandleRecorder().assign(program.graph_module))
        used |= {i.opcode for block in bytecode.decode(blob).blocks for i in block.instructions}
        assert quantized.check_quantized(ctx, case_name="small_cnn", scheme=scheme)["quantized"]["lowered"] == (
            "lowered whole"
        )
    # PT2E freezes quantized weights: quantize_per_channel runs in the ops category's checks only.
    qdq = {
        op.opcode
        for op in ops.OPS
        if op.name.startswith("quantized_decomposed.")
        and op.name != "quantized_decomposed.quantize_per_channel.default"
    }
    assert qdq and qdq <= used, sorted(op.name for op in ops.OPS if op.opcode in qdq - used)


def test_the_share_off_is_rounded_up_to_whole_elements_one_of_twelve_passes_two_do_not():
    step = 0.25
    reference = torch.arange(12, dtype=torch.float32) * step
    one, two = reference.clone(), reference.clone()
    one[3] += step
    two[3:5] += step
    steps = [(step, "the scale of 'dq'")]
    rule = QuantizedRule(max_steps=2.0, max_share=0.05)
    assert (rule.allowed_off(12), rule.allowed_off(24), rule.allowed_off(400), rule.allowed_off(401)) == (1, 2, 20, 21)
    ok = judge_quantized([one], [reference], [reference], steps, rule)[0]
    assert ok.passed and ok.share_off == pytest.approx(1 / 12)
    assert not judge_quantized([two], [reference], [reference], steps, rule)[0].passed


def test_an_output_no_dequantize_produces_passes_off_the_steps_when_its_sqnr_is_as_good():
    generator = torch.Generator().manual_seed(0)
    truth = torch.rand(400, generator=generator) * 2 - 1
    noise = torch.rand(400, generator=generator) * 2 - 1
    step = 2 / 255
    reference = truth + noise * step  # the reference's own quantization noise
    other = truth - noise * step  # another choice of parameters: as noisy, elsewhere (many a step off)
    worse = truth + 3 * noise * step  # 9.5 dB noisier
    rule = QuantizedRule(max_steps=2.0, max_share=0.05, sqnr_margin_db=3.0)
    static = judge_quantized([other], [reference], [truth], [(step, "s")], rule)[0]
    assert not static.passed and static.share_off > 0.05  # a dequantize's output: in steps only
    implied = judge_quantized([other], [reference], [truth], [(None, "s", False)], rule)[0]
    assert implied.passed and implied.float_output and not implied.runtime  # no dequantize produces it
    assert (
        dataclasses.replace(implied, sqnr_backend=implied.sqnr_reference - 4)
        .text()
        .endswith("(4.0 dB below, a float output)")
    )
    runtime = judge_quantized([other], [reference], [truth], [(None, "s", True)], rule)[0]
    assert runtime.passed and runtime.runtime and runtime.float_output
    assert runtime.sqnr_backend == pytest.approx(runtime.sqnr_reference, abs=0.5)
    bad = judge_quantized([worse], [reference], [truth], [(None, "s", True)], rule)[0]
    assert not bad.passed and bad.sqnr_reference - bad.sqnr_backend == pytest.approx(9.5, abs=0.5)
    assert bad.text().startswith("output 0: max ") and bad.text().endswith(" dB below, quantized at run time)")
    # Within rounding of the reference: passes whatever the SQNR says.
    close = judge_quantized([reference + step / 4], [reference], [truth], [(None, "s", True)], rule)[0]
    assert close.passed


def test_only_outputs_downstream_of_choose_qparams_are_runtime_quantized(tmp_path):
    from pytest_backendconf.conformance import quantized
    from pytest_backendconf.conformance._zoo_loader import load_zoo
    from pytest_backendconf.registry._registry import RegisteredBackend, Source
    from pytest_backendconf.suite._context import SuiteContext
    from pytest_backendconf.quant import output_steps
    from backendconf_reference import ReferenceBackend

    zoo = {case.name: case for case in load_zoo()}
    registered = RegisteredBackend(ReferenceBackend(), Source("a test"))
    ctx = SuiteContext(registered, [zoo["multiple_inputs"]], tmp_dir=lambda _: tmp_path)
    dynamic = output_steps(quantized.quantized_programs(ctx, "multiple_inputs", "int8-dynamic")["forward"])
    static = output_steps(quantized.quantized_programs(ctx, "multiple_inputs", "int8-static-per-tensor")["forward"])
    # multiple_inputs' first output has no linear layer upstream: float in the dynamic scheme too.
    assert [r for _, _, r in dynamic] == [False, True]
    assert [r for _, _, r in static] == [False, False]


def test_whole_steps_on_a_float32_grid_count_as_whole_steps():
    # An integer-kernel backend on the residual block: two steps from eager on one element.
    # Dequantized float32 values near 1 with a step of 0.0078 are up to 2e-5 steps off their grid.
    step = 0.007794
    q = torch.arange(-128, 128, dtype=torch.float64)
    reference = (q * step).float()
    two_off = reference.clone()
    two_off[-1] = float(torch.tensor(125.0 * step, dtype=torch.float32))  # 127 -> 125: two steps
    rule = QuantizedRule(max_steps=2.0, max_share=0.05, sqnr_margin_db=3.0)
    judged = judge_quantized([two_off], [reference], [reference], [(step, "dq")], rule)[0]
    assert judged.max_steps == pytest.approx(2, abs=1e-3) and judged.passed
    three_off = reference.clone()
    three_off[-1] = float(torch.tensor(124.0 * step, dtype=torch.float32))
    assert not judge_quantized([three_off], [reference], [reference], [(step, "dq")], rule)[0].passed
