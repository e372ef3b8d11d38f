"""Issue 4's round trip, with the reference backend: N/M/L and the small CNN,
in-process and on the target, re-save byte-identical, everything preserved."""

from __future__ import annotations

import pytest
import torch

import lowering_models as models
import pytest_backendconf as bc
from pytest_backendconf.target._target import run_on_target

CASES = {
    "nml": (models.N, (torch.randn(2, 3),)),
    "cnn": (lambda: models.SmallCNN().eval(), (torch.randn(2, 3, 8, 8),)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request, tmp_path_factory):
    build, inputs = CASES[request.param]
    model = build()
    lowered = bc.to_backend(model, "reference", {"forward": {}}, example_inputs=inputs)
    lowered.threshold = 0.25
    lowered.labels = ["a", "b"]
    lowered.scale = torch.arange(3.0)
    path = tmp_path_factory.mktemp(request.param) / "model.bcpt"
    bc.save(lowered, path)
    return model, lowered, inputs, path


def test_round_trip_in_process_keeps_everything(saved, tmp_path):
    model, lowered, inputs, path = saved
    again = bc.load(path)
    torch.testing.assert_close(again(*inputs), model(*inputs))
    torch.testing.assert_close(again(*inputs), lowered(*inputs))
    assert again.lowered.methods["forward"].compile_spec == lowered.lowered.methods["forward"].compile_spec
    assert bc.debug_info(again) == bc.debug_info(lowered)
    assert again.threshold == 0.25 and again.labels == ["a", "b"]
    assert torch.equal(again.scale, torch.arange(3.0))
    resaved = tmp_path / "again.bcpt"
    bc.save(again, resaved)
    assert resaved.read_bytes() == path.read_bytes()


def test_round_trip_on_the_target_matches_eager(saved):
    model, _, inputs, path = saved
    outcome = run_on_target(str(path), {"forward": [inputs]})
    assert outcome["ok"], outcome
    assert "backendconf_reference.compiler" in outcome["blocked"]
    torch.testing.assert_close(outcome["outputs"]["forward"][0], model(*inputs))
