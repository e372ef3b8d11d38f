"""bc.profile and execute_profiled: per-node time by source line, op and module; Chrome traces; the CLI."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc
from pytest_backendconf.errors import BackendContractError

from lowering_models import N, SmallCNN

REPEAT = 20
TESTS = os.path.dirname(os.path.abspath(__file__))


class NotProfiled(ReferenceBackend):
    execute_profiled = None


class BadEvents(ReferenceBackend):
    def execute_profiled(self, handle, inputs):
        outputs, events = super().execute_profiled(handle, inputs)
        return outputs, [(str(h), s, e) for h, s, e in events]


@pytest.fixture(scope="module")
def cnn():
    x = torch.randn(16, 3, 8, 8)
    lowered = bc.to_backend(SmallCNN().eval(), "reference", {"forward": {}}, example_inputs=(x,))
    return lowered, x, bc.profile(lowered, x, repeat=REPEAT)


def test_rows_by_source_line_account_for_the_measured_call_time(cnn):
    lowered, x, profile = cnn
    assert profile.profiled and len(profile.calls) == REPEAT
    ops = [i for i in bc.debug_info(lowered).values() if i.node in bc.delegation(lowered)["forward"].delegated]
    # Every call: one event per node; the events (self time, by line) cover >= 90% of the call's time.
    fractions = []
    for call in profile.calls:
        assert sorted(h for h, _, _ in call.events) == sorted(i.handle for i in ops)
        fractions.append(sum(e - s for _, s, e in call.events) / call.duration_ns)
    assert 0.9 <= statistics.median(fractions) <= 1.0, fractions
    by_line = profile.by_line()
    assert {(r["file"], r["line"]) for r in by_line} == {(i.file, i.line) for i in ops}
    assert sum(r["total_ns"] for r in by_line) == sum(s for _, s in profile.spans())
    assert sum(r["calls"] for r in by_line) == REPEAT * len(ops)
    # All calls together: at most the measured time (a call preempted between two events on a busy
    # machine lowers the sum, so the 90% bound is held per call, by the median, above).
    assert sum(r["total_ns"] for r in by_line) <= sum(profile.call_ns)


def test_rows_ops_and_modules(cnn):
    lowered, x, profile = cnn
    rows = profile.rows
    assert set(rows[0]) == {"op", "file", "line", "hierarchy", "calls", "self_ns", "total_ns"}
    assert {r["op"] for r in rows} == {r["op"] for r in profile.by_op()} >= {"aten::conv2d", "aten::linear"}
    assert all(r["calls"] == REPEAT and r["self_ns"] == r["total_ns"] > 0 for r in rows)
    modules = {r["hierarchy"]: r for r in profile.by_module()}
    top = modules["top(SmallCNN)::forward"]
    conv = modules["top(SmallCNN)::forward.conv(Conv2d)::forward"]
    assert top["total_ns"] == sum(r["self_ns"] for r in modules.values())
    assert conv["total_ns"] == conv["self_ns"] == next(r["total_ns"] for r in rows if r["op"] == "aten::conv2d")
    text = str(profile)
    assert f"profile of 'forward' on backend 'reference': {REPEAT} call(s)" in text
    assert (
        "total ms    self ms" in text and "zoo.py:" in text and "top(SmallCNN)::forward.conv(Conv2d)::forward" in text
    )


def test_the_chrome_trace_has_one_event_per_node_per_call(cnn, tmp_path):
    lowered, x, profile = cnn
    path = tmp_path / "trace.json"
    profile.to_chrome_trace(path)
    document = json.loads(path.read_text())
    nodes = [e for e in document["traceEvents"] if e.get("cat") == "node"]
    calls = [e for e in document["traceEvents"] if e.get("cat") == "call"]
    assert len(calls) == REPEAT and len(nodes) == sum(len(c.events) for c in profile.calls)
    assert len(nodes) == REPEAT * len(bc.delegation(lowered)["forward"].delegated)
    conv = next(e for e in nodes if e["name"] == "aten::conv2d")
    assert (
        conv["ph"] == "X"
        and conv["dur"] > 0
        and conv["args"]["source"].endswith(f":{conv['args']['source'].rsplit(':')[-1]}")
    )
    assert "self.conv(x)" in conv["args"]["text"] and conv["args"]["hierarchy"].endswith("conv(Conv2d)::forward")


def test_a_backend_without_execute_profiled_gives_one_row_for_the_method():
    x = torch.randn(2, 3)
    lowered = bc.to_backend(N(), NotProfiled(), {"forward": {}}, example_inputs=(x,))
    profile = bc.profile(lowered, x, repeat=3)
    assert not profile.profiled
    assert profile.rows == [
        {
            "op": "forward",
            "file": None,
            "line": None,
            "hierarchy": "top(N)::forward",
            "calls": 3,
            "self_ns": sum(profile.call_ns),
            "total_ns": sum(profile.call_ns),
        }
    ]
    assert "whole calls only" in str(profile)


def test_bad_events_and_bad_arguments_are_clear_errors():
    x = torch.randn(2, 3)
    lowered = bc.to_backend(N(), BadEvents(), {"forward": {}}, example_inputs=(x,))
    with pytest.raises(
        BackendContractError, match=r"event 0 is \('\d+', \d+, \d+\); each event is \(debug_handle, start_ns, end_ns\)"
    ):
        bc.profile(lowered, x)
    with pytest.raises(ValueError, match="profile\\(repeat=0\\): repeat is the number of calls"):
        bc.profile(lowered, x, repeat=0)
    with pytest.raises(AttributeError, match="no method 'encode'; its methods: forward"):
        bc.profile(lowered, x, method="encode")


def test_profile_of_a_handles_only_archive_names_handles_and_the_symbolicate_command(tmp_path):
    x = torch.randn(2, 3)
    path = tmp_path / "n.bcpt"
    bc.save(bc.to_backend(N(), "reference", {"forward": {}}, example_inputs=(x,)), path, debug_info="separate")
    (tmp_path / "n.bcpt.debug").rename(tmp_path / "elsewhere.debug")
    profile = bc.profile(bc.load(path), x, repeat=2)
    assert all(r["op"] is None and "handle" in r for r in profile.rows)
    assert f"symbolicate handles with: backendconf symbolicate {path}.debug HANDLE" in str(profile)
    trace = profile.chrome_trace()["traceEvents"]
    assert any(
        e.get("args", {}).get("symbolicate", "").startswith(f"backendconf symbolicate {path}.debug ") for e in trace
    )


@pytest.mark.slow
def test_backendconf_profile_from_an_archive(tmp_path):
    x = torch.randn(4, 3, 8, 8)
    path = tmp_path / "cnn.bcpt"
    bc.save(bc.to_backend(SmallCNN().eval(), "reference", {"forward": {}}, example_inputs=(x,)), path)
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"forward": [[x.tolist()]]}))
    trace = tmp_path / "trace.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_backendconf.cli",
            "profile",
            str(path),
            "--inputs",
            str(inputs),
            "--repeat",
            "3",
            "--chrome-trace",
            str(trace),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "profile of 'forward' on backend 'reference': 3 call(s)" in done.stdout
    assert "aten::conv2d" in done.stdout and "conv(Conv2d)" in done.stdout
    assert len([e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "node"]) == 3 * 6
    bad = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "profile", str(path), "--example-inputs", "--repeat", "0"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert bad.returncode == 1 and "--repeat 0: give the number of calls to time, 1 or more" in bad.stderr


# --- the conformance check: contract::execute_profiled_events ----------------------------------

CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
from broken_backends_profiling import WallClockEvents, FirstNodeOnly

def backendconf_register_backends(register):
    register(WallClockEvents())
    register(FirstNodeOnly())
"""


@pytest.mark.parametrize(
    "backend, lines",
    [
        (
            "wall_clock_events",
            [
                "nested_nml.forward (float32): execute_profiled() events are wrong:",
                "  event 0 (handle *) spans *..* ns, outside the call *..* ns (time.perf_counter_ns)",
            ],
        ),
        (
            "first_node_only",
            [
                "small_cnn.forward (float32): execute_profiled() events are wrong:",
                "  no event for 5 of the 6 delegated nodes: 'batch_norm' (aten::batch_norm), *",
            ],
        ),
    ],
)
def test_the_profiling_check_catches_broken_events(pytester, backend, lines):
    from pytest_backendconf.conformance._spec import section

    cases = section("contract")["profiling_cases"]
    pytester.makeconftest(CONFTEST.format(tests=TESTS))
    result = pytester.runpytest(
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        "-rfs",
        "--backendconf-select=backendconf::contract::execute_profiled_events*",
    )
    result.assert_outcomes(failed=len(cases))
    result.stdout.fnmatch_lines(lines)
