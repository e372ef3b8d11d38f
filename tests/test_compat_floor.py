"""The supported torch range starts at the oldest release the suite ran green under."""

from __future__ import annotations

import re

import pytest
import torch

from pytest_backendconf import _compat


@pytest.mark.parametrize("version", ["2.9.1+cu128", "2.4.1"])
def test_a_torch_below_the_floor_is_refused_with_the_fix(monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)
    expected = rf"needs torch >= 2\.10, found {re.escape(version)} .*pip install torch=="
    with pytest.raises(RuntimeError, match=expected):
        _compat.check_torch_version()


@pytest.mark.parametrize("version", ["2.10.0+cu128", "2.12.1", "2.14.1+cu130", "3.0.0"])
def test_the_supported_releases_pass(monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)
    _compat.check_torch_version()


def test_every_supported_release_ships_ops_samples():
    from pytest_backendconf.conformance.ops import discovery

    shipped = {p.name.removeprefix("torch-").removesuffix(".json") for p in discovery.DATA_DIR.glob("torch-*.json")}
    minors = {".".join(v.split(".")[:2]) for v in shipped}
    floor = f"{_compat.MINIMUM_TORCH[0]}.{_compat.MINIMUM_TORCH[1]}"
    assert floor in minors and {"2.10", "2.11", "2.12", "2.13", "2.14"} <= minors, sorted(shipped)
