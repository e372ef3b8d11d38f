"""The benchmark script runs and prints every figure (benchmarks/run.py; timings are never asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("backendconf_benchmarks_run", BENCHMARKS / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # puts benchmarks/ on sys.path for its models
    yield module
    sys.modules.pop(spec.name, None)
    sys.modules.pop("bench_models", None)
    sys.modules.pop("bench_bounds", None)


def expected_keys(settings) -> set[str]:
    keys = {f"call.overhead.{name}" for name in ("small_mlp", "elementwise", "dict_output")}
    keys |= {"call.eager_dispatch", "call.partition_boundary"}
    keys |= {f"call.profiled.{name}" for name in ("elementwise", "small_cnn", "conv_net")}
    keys |= {f"call.vs_eager.{name}" for name in ("small_mlp", "elementwise", "small_cnn", "wide_mlp", "conv_net")}
    for name in ("small_mlp", "conv_net", f"chain_{settings.archive_chain}"):
        keys |= {f"archive.speedup.{name}", f"archive.debug_ratio.{name}"}
    for n in settings.scaling_sizes:
        keys |= {f"scaling.lower.{n}", f"scaling.size.{n}"}
    keys |= {"symbolicate.cold", "symbolicate.distinct", "symbolicate.warm"}
    keys |= {"bounds.report_html", "bounds.known_failures"}
    return keys


def test_every_figure_is_measured_and_printed(bench, tmp_path):
    settings = bench.Settings.tiny()
    figures = bench.collect(settings)
    by_key = {f.key: f for f in figures}
    suite_keys = {key for key, *_ in bench.SUITE_ROWS}
    assert set(by_key) == expected_keys(settings) | suite_keys
    for key in suite_keys:  # the tiny settings never run the suite
        assert by_key[key].status == bench.SKIPPED
    for figure in figures:
        if figure.key not in suite_keys:
            assert figure.value is not None and math.isfinite(figure.value), figure
            # Call overheads are differences of two timings: with the tiny
            # settings' few repetitions they may come out at or below zero.
            if not figure.key.startswith("call."):
                assert figure.value > 0, figure
            assert figure.status in (bench.MET, bench.MISSED, bench.INFO), figure
    table = bench.render(figures, bench.machine(), settings)
    for figure in figures:
        assert figure.label in table
    assert "torch 2." in table and "CPUs" in table


def test_main_writes_json(bench, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench.Settings, "quick", bench.Settings.tiny)  # --quick at the smallest sizes
    out = tmp_path / "figures.json"
    assert bench.main(["--quick", "--only", "call", "--threads", "1", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert {"settings", "machine", "figures"} <= set(document)
    assert document["machine"]["torch"].startswith("2.")
    assert {f["key"] for f in document["figures"]} == {
        "call.overhead.small_mlp",
        "call.overhead.elementwise",
        "call.overhead.dict_output",
        "call.vs_eager.small_mlp",
        "call.vs_eager.elementwise",
        "call.vs_eager.small_cnn",
        "call.vs_eager.wide_mlp",
        "call.vs_eager.conv_net",
        "call.eager_dispatch",
        "call.partition_boundary",
        "call.profiled.elementwise",
        "call.profiled.small_cnn",
        "call.profiled.conv_net",
    }
    assert "call overhead over execute: small_mlp" in capsys.readouterr().out


def test_suite_stats_plugin_counts_exports(bench):
    """The plugin the suite run loads reports exports and the context's cache from inside pytest."""
    settings = bench.dataclasses.replace(
        bench.Settings.tiny(),
        run_suite=True,
        suite_select=("backendconf::contract::preprocess_returns_bytes[arithmetic_tensors]",),
    )
    figures = {f.key: f for f in bench.suite_figures(settings)}
    assert figures["suite.tests"].value == 1
    assert figures["suite.failed"].value == 0
    assert figures["suite.exports"].value == 1
    assert "SuiteContext.export_count 1 for 1 cached programs" in figures["suite.exports"].detail


@pytest.mark.slow  # two pytest runs in subprocesses: `make test-slow`
def test_batching_benchmark_compares_every_check(tmp_path, capsys):
    """bench_batching runs the ops category batched and unbatched and compares the two reports check by check."""
    spec = importlib.util.spec_from_file_location("backendconf_bench_batching", BENCHMARKS / "bench_batching.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "batching.json"
    select = "--backendconf-select=ops::aten.[acn][bdeo][sdgs]*[[]float32-*"  # abs, add, cos, neg … in float32
    assert module.main(["--engine", "reference", "--json", str(out), "--", select]) == 0
    row = json.loads(out.read_text())["reference"]
    assert row["checks"] >= 6 and row["differences"] == []
    assert row["shared"][0] > row["shared"][1] >= 1  # checks decided in fewer lowerings
    assert "reference" in capsys.readouterr().out
    # a changed outcome or message is a difference; a temporary path or a set's order is not
    one = {"id": "x", "outcome": "failed", "duration": 1.0, "reason": "at /tmp/pytest-of-me/pytest-3/ops-inputs0/a"}
    two = {**one, "duration": 2.0, "reason": "at /tmp/pytest-of-me/pytest-9/ops-inputs4/a"}
    assert module.differences({"x": one}, {"x": two}) == []
    assert module.differences({"x": one}, {"x": {**two, "outcome": "passed"}}) == [
        "x: batched failed / unbatched passed"
    ]
    assert module.comparable({"m": "T=FLOAT | INT64"}) == module.comparable({"m": "T=INT64 | FLOAT"})
