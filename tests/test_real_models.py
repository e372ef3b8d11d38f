"""Real-world models (`--backendconf-zoo`): which checks they get, the marker, torchvision's import, one real run.

The whole real-model run (seven models, minutes) is measured in
docs/benchmarks.md, not run here; this file runs the cheapest model only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from pytest_backendconf.conformance.real_models import CATEGORIES, MARKER, real_cases, torchvision_available

# The [models] extra (make installs it; tox's torch environments do not: its
# torchvision pin is for torch 2.13 and would replace another torch).
needs_torchvision = pytest.mark.skipif(
    not torchvision_available(), reason="needs torchvision: pip install 'pytest-backendconf[models]'"
)

NAMES = [
    "resnet18",
    "mobilenet_v3_small",
    "squeezenet1_1",
    "shufflenet_v2_x0_5",
    "efficientnet_b0",
    "vit_tiny",
    "text_encoder",
]


def test_every_real_model_says_what_it_is_and_where_it_comes_from():
    cases = real_cases()
    assert [c.name for c in cases] == NAMES
    for case in cases:
        assert MARKER in case.tags
        assert case.description and case.origin, case.name
    assert "torchvision.models.resnet18(weights=None)" in cases[0].origin
    assert "torch.nn.TransformerEncoder" in cases[-1].origin


def collect(pytester, *args):
    result = pytester.runpytest("--backend=reference", "--co", "-q", "-p", "no:cacheprovider", *args)
    return [line for line in result.outlines if line.startswith("backendconf::")], result


@needs_torchvision
def test_real_models_run_in_parity_and_serialization_only_and_are_marked(pytester):
    real, _ = collect(pytester, "--backendconf-zoo=real")
    assert real, "no check collected"
    assert {line.split("::")[1] for line in real} <= set(CATEGORIES)
    assert {c for c in NAMES if any(f"[{c}]" in line or f"::{c}[" in line for line in real)} == set(NAMES)
    # Under `real` only the real models; `-m real_model` selects exactly them out of `all`.
    marked, _ = collect(pytester, "--backendconf-zoo=all", "-m", MARKER)
    assert sorted(marked) == sorted(real)
    synthetic, _ = collect(pytester)
    assert not any("resnet18" in line for line in synthetic)
    assert set(synthetic) < set(collect(pytester, "--backendconf-zoo=all")[0])


def test_without_torchvision_the_zoo_option_says_what_to_install(pytester, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # what importlib sees when it is not installed
    result = pytester.runpytest("--backend=reference", "--backendconf-zoo=real")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --backendconf-zoo=real needs torchvision *: pip install 'pytest-backendconf[[]models]' *"]
    )


@pytest.mark.slow
@needs_torchvision
def test_torchvision_models_build_beside_this_torch_whatever_its_build():
    # In a fresh process: the fallback for a torchvision whose compiled operators cannot load.
    code = textwrap.dedent(
        """
        import torch
        from pytest_backendconf.conformance.real_models import import_torchvision, real_cases
        tv = import_torchvision()
        model = {c.name: c for c in real_cases()}["squeezenet1_1"].build()
        y = model(torch.zeros(1, 3, 224, 224))
        print(tv.__version__, getattr(tv, "_backendconf_without_ops", False), tuple(y.shape), torch.__version__)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "(1, 1000)" in out.stdout
    import torch

    assert out.stdout.split()[-1] == torch.__version__  # torch is never changed


@needs_torchvision
def test_the_text_encoder_passes_parity_on_the_reference_backend(pytester):
    result = pytester.runpytest(
        "--backend=reference",
        "--backendconf-zoo=real",
        "-m",
        MARKER,
        "-p",
        "no:cacheprovider",
        "--backendconf-hypothesis=ci",
        "--backendconf-select=parity::text_encoder*",
        "--backendconf-report=r.json",
    )
    result.assert_outcomes(passed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    (test,) = report["tests"]
    assert test["id"] == "backendconf::parity::text_encoder[fixed]" and test["case"] == "text_encoder"
    assert "--backendconf-zoo=real" in test["reproduce"]
