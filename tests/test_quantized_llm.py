"""The quantized category's LLM schemes: torchao programs judged against eager's quantized model.

Eager PyTorch running torchao's ops node by node passes; a backend with
int4 nibbles swapped, scales of groups of 64 where they are 32, the zero
point ignored, or per-tensor activation scales fails, naming the layer and
the group (or the token) and the error in steps. The backends are in
broken_backends_llm.py.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("torchao", reason="the LLM schemes need the [quant] extra (torchao)")

from pytest_backendconf.quant import LLM_SCHEMES, WeightParts, judge_weights, llm_config

import broken_backends_llm  # noqa: F401  (torchao registers its operators once, before pytester runs)

TESTS = os.path.dirname(os.path.abspath(__file__))
INT4 = "backendconf::quantized::llm_mlp[int4-weight-only-g32]"
LINEARS_INT4 = "backendconf::quantized::llm_linears[int4-weight-only-g32]"
ASYMMETRIC = "backendconf::quantized::llm_mlp[int4-weight-only-asym-g32]"
DYNAMIC = "backendconf::quantized::llm_mlp[8da4w-g32]"
SELECTED = (INT4, LINEARS_INT4, ASYMMETRIC, DYNAMIC)


def run(pytester, backend: str, *select: str) -> tuple[dict, pytest.RunResult]:
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    report = pytester.path / f"report-{backend}.json"
    args = ["-p", "broken_backends_llm", f"--backend={backend}", "-p", "no:cacheprovider", "-p", "no:randomly"]
    args += ["--backendconf-in-process", "--backendconf-minify=off", f"--backendconf-report={report}"]
    result = pytester.runpytest(*args, *(f"--backendconf-select={s}" for s in select))
    return {t["id"]: t for t in json.loads(report.read_text())["tests"]}, result


def test_eager_torchao_ops_pass(pytester):
    tests, result = run(pytester, "eager", *SELECTED)
    assert set(tests) == set(SELECTED), result.stdout.str()[-2000:]
    assert {t["outcome"] for t in tests.values()} == {"passed"}, result.stdout.str()[-3000:]
    assert tests[INT4]["details"]["quantized"]["lowered"] == "lowered whole"


@pytest.mark.parametrize(
    ("backend", "check", "texts"),
    [
        (
            "swapped_nibbles",
            INT4,
            [
                "layer 'gate': its weights",
                "first at row 0, group 0 (columns 0-31)",
                "steps of its scale",
                "int4 nibbles unpacked in the wrong order",
            ],
        ),
        (
            "group_of_64",
            LINEARS_INT4,
            [
                "layer 'wide': its weights",
                "group 3 (columns 96-127)",
                "the scales are applied to groups of 64 columns; the groups are 32 wide",
            ],
        ),
        (
            "ignored_zero_point",
            ASYMMETRIC,
            ["layer 'gate': its weights", ", group ", "the zero point is ignored"],
        ),
        (
            "per_tensor_activations",
            DYNAMIC,
            [
                "output 0, token ",
                "steps",
                "layer 'gate' alone, fed eager's input (its weights, read back through unit inputs, are right): token ",
            ],
        ),
    ],
)
def test_each_llm_quantization_defect_is_caught_naming_the_layer_and_group(pytester, backend, check, texts):
    tests, result = run(pytester, backend, check)
    found = tests[check]
    assert found["outcome"] == "failed", result.stdout.str()[-3000:]
    message = found["error"]["message"]
    for text in texts:
        assert text in message, message
    assert "differ from eager PyTorch running the model quantized with" in message


def _parts(group: int, zero: bool) -> tuple[WeightParts, torch.Tensor]:
    generator = torch.Generator().manual_seed(group)
    q = torch.randint(-8, 8, (4, 128), generator=generator, dtype=torch.int8)
    scale = torch.rand(4, 128 // group, generator=generator) / 50 + 0.01
    zp = torch.randint(-3, 4, (4, 128 // group), generator=generator, dtype=torch.int8) if zero else None
    parts = WeightParts(q, scale, zp, group, 4)
    return parts, parts.dequantized().float()


def test_a_group_boundary_off_by_one_and_a_wrong_scale_are_named():
    parts, want = _parts(32, zero=False)
    early = parts.dequantized(lambda k: torch.clamp((k + 1) // 32, 0, 3)).float()
    verdict = judge_weights("l", early, want, parts)
    assert (
        verdict is not None
        and "every group boundary is one column early: column 31 takes group 1's scale" in verdict.text()
    )
    first, last = verdict.columns
    assert (first, last) == (verdict.group * 32, verdict.group * 32 + 31) and verdict.groups == 16
    doubled = want * 2
    verdict = judge_weights("l", doubled, want, parts)
    assert verdict is not None and "times eager's: a wrong scale" in verdict.text()
    assert judge_weights("l", want.clone(), want, parts) is None  # right weights: no verdict


def test_every_llm_scheme_builds_its_torchao_config():
    for scheme in LLM_SCHEMES:
        assert type(llm_config(scheme)).__name__ == LLM_SCHEMES[scheme].config
    with pytest.raises(ValueError, match="unknown LLM quantization scheme 'int3': choose one of int8-weight-only"):
        llm_config("int3")
