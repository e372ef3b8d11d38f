"""The ops samples cache is input from outside: it cannot loosen a check, remove checks unseen, or crash a run.

A samples cache (``$BACKENDCONF_CACHE/ops/<torch build>/``) holds the single-op samples of a torch
without shipped ones, and every sample of ``--backendconf-ops=all``; docs/vendor-ci.md recommends
keeping it in a CI cache, so it may come from elsewhere. How strict a check is comes from the shipped
tables, a cache that lacks what the shipped samples have is not used, a damaged one is said and
discovered again, and the report records the sample set (count, digest, source) a gate compares.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import types
from pathlib import Path

import pytest

from pytest_backendconf.cli._main import main
from pytest_backendconf.conformance.ops import _category, discovery

from report_records import document_of

TESTS = Path(__file__).parent
VERSION = discovery.release()
SUB = "aten.sub.Tensor"


def _shipped() -> discovery.OpsData:
    data = discovery.load(discovery.DATA_DIR, VERSION)
    if data is None:
        pytest.skip(f"no shipped ops samples for torch {VERSION}")
    return data


def _planted(cache: Path, samples: list, tolerance: float = 1e6, mode: str = "all") -> None:
    """A cache file as an attacker writes it: the given samples, and every OpInfo tolerance loosened."""
    data = _shipped()
    entries = {s.opinfo for s in samples}
    loose = {e: {d: [tolerance, tolerance] for d in discovery.DISCOVERY_DTYPES} for e in entries}
    discovery.save(dataclasses.replace(data, samples=samples, tolerances=loose), cache, mode)


def test_a_cached_tolerance_is_never_applied(tmp_path):
    shipped = _shipped()
    _planted(tmp_path, shipped.samples)
    cached = discovery.load(tmp_path, VERSION, "all")
    assert cached is not None and cached.source == str(tmp_path)
    assert cached.tolerances == discovery.shipped_tolerances(VERSION)
    by_name = {s.name: s.opinfo_tolerance for s in shipped.samples}
    assert all(s.opinfo_tolerance == by_name[s.name] for s in cached.samples)
    assert all(s.opinfo_tolerance != (1e6, 1e6) for s in cached.samples)


@pytest.mark.parametrize(
    ("index", "says"),
    [
        ("[]", "holds list, not an object"),
        ("[" * 200 + "]" * 200, "nests 200 levels deep; at most 64 are read"),
        ('{"format": "x"}', "not a backendconf-ops-data file of version 1"),
        ("not json", "is not valid JSON"),
    ],
)
def test_a_damaged_cache_index_is_an_error_naming_the_file(tmp_path, index, says):
    _planted(tmp_path, _shipped().samples[:2])
    path, _ = discovery.data_paths(tmp_path, VERSION, "all")
    path.write_text(index)
    with pytest.raises(discovery.OpsDataError) as info:
        discovery.load(tmp_path, VERSION, "all")
    assert str(path) in str(info.value) and says in str(info.value)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r.update(inputs=9), "which the tensor file does not hold"),
        (lambda r: r.update(inputs=10**6), "samples[0].inputs is 1000000; a sample takes at most 64 tensors"),
        (lambda r: r.update(dtype="float64"), 'samples[0].dtype is "float64", not one of float32'),
        (lambda r: r.update(kwargs=[]), "samples[0].kwargs must be an object, got a list"),
    ],
)
def test_a_sample_that_discovery_did_not_write_is_refused(tmp_path, change, says):
    _planted(tmp_path, _shipped().samples[:2])
    path, _ = discovery.data_paths(tmp_path, VERSION, "all")
    document = json.loads(path.read_text())
    change(document["samples"][0])
    path.write_text(json.dumps(document))
    with pytest.raises(discovery.OpsDataError) as info:
        discovery.load(tmp_path, VERSION, "all")
    assert says in str(info.value) and "remove it (the samples are discovered again)" in str(info.value)


def test_a_cache_lacking_what_the_shipped_samples_have_is_not_used(tmp_path):
    shipped = _shipped()
    _planted(tmp_path, [s for s in shipped.samples if s.overload == SUB])
    ctx = types.SimpleNamespace()
    assert _category._cached(ctx, tmp_path, VERSION, "all") is None  # type: ignore[arg-type]
    (said,) = ctx.notices
    assert f"the cached samples are not used: {tmp_path} lacks" in said and "discovered again" in said
    # A damaged one is said too, and not used.
    path, _ = discovery.data_paths(tmp_path, VERSION, "all")
    path.write_text("[]")
    ctx = types.SimpleNamespace()
    assert _category._cached(ctx, tmp_path, VERSION, "all") is None  # type: ignore[arg-type]
    assert "holds list, not an object" in ctx.notices[0]


def test_a_planted_loose_tolerance_does_not_pass_a_wrong_float16_sub(pytester, monkeypatch):
    """The route found: a cached tolerance of 1e6 turned a wrong float16 sub from failed into passed."""
    monkeypatch.setenv("BACKENDCONF_CACHE", str(pytester.path / "cache"))
    _planted(_category.build_cache_dir(), _shipped().samples)
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(
        textwrap.dedent("""
        from broken_backends_ops import WrongHalfSub

        def backendconf_register_backends(register):
            register(WrongHalfSub())
        """)
    )
    result = pytester.runpytest(
        "--backend=wrong_half_sub",
        "-p",
        "no:cacheprovider",
        "--backendconf-ops=all",
        "--backendconf-minify=off",
        "--backendconf-report=report.json",
        "--backendconf-select=ops::aten.sub.Tensor[[]float16*",
    )
    assert result.ret == 1, result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1 and outcomes.get("passed", 0) == 0
    samples = json.loads((pytester.path / "report.json").read_text())["ops"]["samples"]
    assert samples["source"] == str(_category.build_cache_dir()) and samples["digest"].startswith("sha256:")


def _write(path: Path, document: dict) -> str:
    path.write_text(json.dumps(document))
    return str(path)


def test_the_gate_fails_a_run_whose_check_set_shrank(tmp_path, capsys):
    a, b = "backendconf::ops::aten.add.Tensor[float32-sample0]", "backendconf::ops::aten.sub.Tensor[float32-sample0]"
    passed = [{"id": a, "outcome": "passed"}, {"id": b, "outcome": "passed"}]
    before = _write(tmp_path / "before.json", document_of(passed))
    fewer = _write(tmp_path / "after.json", document_of(passed[:1]))
    assert main(["report", "gate", fewer]) == 0
    assert main(["report", "gate", fewer, f"--previous={before}"]) == 1
    out = capsys.readouterr().out
    assert f"the check set shrank: 1 check of {before} is not in this report ({b})" in out
    assert out.splitlines()[-1].endswith("; the check set shrank")
    assert main(["report", "gate", before, f"--previous={fewer}"]) == 0  # more checks is no shrinking
    # A run whose applied known-failures entries named no check it collected (the run's own judgement).
    stale = document_of(
        passed[:1],
        known_failures={"file": "k.toml", "entries": 1, "stale": [b]},
        ops={"samples": {"count": 1, "digest": "sha256:0", "source": "/cache/ops"}},
    )
    capsys.readouterr()
    assert main(["report", "gate", _write(tmp_path / "stale.json", stale)]) == 1
    out = capsys.readouterr().out
    assert "the check set shrank: 1 known-failures entry of k.toml named no check the run collected" in out
    assert "the ops samples came from /cache/ops" in out
    other = document_of(passed, backend="y")
    assert main(["report", "gate", fewer, f"--previous={_write(tmp_path / 'other.json', other)}"]) == 4
    assert "is a report of backend 'y', not 'x'" in capsys.readouterr().err
