"""``backendconf replay`` and ``--backendconf-golden``: the device half of vendor CI.

Real target processes throughout: every replay loads its archives in a fresh
interpreter with the backend's host-only modules blocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.cli import main
from pytest_backendconf.report import REPORT_SCHEMA_VERSION, read_report

TESTS = os.path.dirname(os.path.abspath(__file__))
BROKEN = os.path.join(TESTS, "broken_backends_replay.py")
X1, X2 = torch.linspace(-2, 2, 12).reshape(3, 4), torch.linspace(0, 1, 12).reshape(3, 4)


class SinScale(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2


def replay(*args: str) -> subprocess.CompletedProcess:
    """``backendconf replay`` in a fresh interpreter, which must not import pytest or Hypothesis."""
    code = textwrap.dedent(
        """
        import sys
        from pytest_backendconf.cli import main
        status = main(["replay", *sys.argv[1:]])
        imported = [m for m in ("pytest", "hypothesis", "_pytest") if m in sys.modules]
        assert not imported, f"replay imported {imported}"
        sys.exit(status)
        """
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """A matching archive, one whose method faults at run time, and one in a dtype its backend does not declare."""
    folder = tmp_path_factory.mktemp("replay")
    model = SinScale()
    good = bc.to_backend(model, "reference", {"forward": {}}, example_inputs=(X1,))
    bc.save(good, folder / "good.bcpt", bundled_inputs={"forward": [(X1,), (X2,)]}, eager=model)
    faulty = bc.to_backend(
        model, "reference", {"forward": {"__backendconf_fault__": {"node": "sin"}}}, example_inputs=(X1,)
    )
    bc.save(faulty, folder / "faulty.bcpt", bundled_inputs={"forward": [(X1,)]}, eager=model)
    sys.path.insert(0, TESTS)
    try:
        from broken_backends_replay import Float32Only
    finally:
        sys.path.remove(TESTS)
    half = X1.half()
    undeclared = bc.to_backend(model, Float32Only(), {"forward": {}}, example_inputs=(half,))
    bc.save(undeclared, folder / "undeclared.bcpt", bundled_inputs={"forward": [(half,)]}, eager=model)
    return folder


@pytest.mark.slow
def test_matching_bundles_pass_with_pytest_and_hypothesis_blocked_and_write_report_and_junit(archives, tmp_path):
    report, junit = tmp_path / "device.json", tmp_path / "device.xml"
    done = replay(
        str(archives / "good.bcpt"),
        "--report",
        str(report),
        "--junitxml",
        str(junit),
        "--block",
        "pytest",
        "--block",
        "hypothesis",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED backendconf::replay::good.forward[0]" in done.stdout
    assert "replay: 2/2 bundles match their expected outputs (1 archives)" in done.stdout
    document = json.loads(report.read_text())
    assert document["summary"] == {
        "replay": {
            "total": 2,
            "passed": 2,
            **{o: 0 for o in ("skipped", "unsupported", "known_failure", "unexpected_pass", "failed", "error")},
            "not_needed": 0,
            "scored": 2,
            "score": 1.0,
        }
    }
    assert [t["check_outcome"] for t in document["tests"]] == ["passed", "passed"]
    ids = [t["id"] for t in document["tests"]]
    assert ids == ["backendconf::replay::good.forward[0]", "backendconf::replay::good.forward[1]"]
    assert document["tests"][0]["numerics"]["closeness"] < 1
    read_report(report)  # the suite's schema: merge and html read it
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "0", "0")


@pytest.mark.slow
def test_a_runtime_error_is_symbolicated_and_an_undeclared_dtype_is_a_clear_error(archives):
    done = replay(
        str(archives / "faulty.bcpt"), str(archives / "undeclared.bcpt"), str(archives / "good.bcpt"), "-p", BROKEN
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "ERROR  backendconf::replay::faulty.forward[0]" in out
    assert "BackendRuntimeError: injected fault at node 'sin' (aten::sin)" in out
    assert "Traceback of model source (most recent call last):" in out and "test_replay.py" in out
    assert "ERROR  backendconf::replay::undeclared.forward[0]" in out
    assert (
        "bundle forward[0] has float16 inputs, but backend 'float32_only' declares the dtypes float32 "
        "(Capabilities.dtypes); it was not run." in out
    )
    assert "PASSED backendconf::replay::good.forward[1]" in out
    assert "replay: 2/4 bundles match their expected outputs (3 archives)" in out


def test_bad_paths_and_archives_without_bundles_are_clear_errors(archives, tmp_path, capsys):
    assert main(["replay", str(tmp_path / "missing.bcpt")]) == 1
    assert "does not exist; give archives or folders of them" in capsys.readouterr().err
    assert main(["replay", str(tmp_path)]) == 1
    assert "no archives in" in capsys.readouterr().err
    plain = bc.to_backend(SinScale(), "reference", {"forward": {}}, example_inputs=(X1,))
    bc.save(plain, tmp_path / "plain.bcpt")
    assert main(["replay", str(tmp_path / "plain.bcpt")]) == 1
    assert "has no bundled inputs: save it with save(..., bundled_inputs=...)" in capsys.readouterr().out
    (tmp_path / "index.json").write_text(json.dumps({"archives": [{"archive": "../good.bcpt"}]}))
    assert main(["replay", str(tmp_path)]) == 1
    assert "which is not a file name in its folder" in capsys.readouterr().err


# --- the golden folder -------------------------------------------------------------------------------

PARITY = tuple(
    f"backendconf::parity::{name}"
    for name in ("mlp[[]float32]", "linear[[]float32]", "linear[[]float16]", "linear[[]float32-dynamic]")
)


def golden_run(pytester, backend: str, folder, *extra: str):
    pytester.syspathinsert(TESTS)
    pytester.makeconftest("from broken_backends_replay import backendconf_register_backends\n")
    return pytester.runpytest(
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        f"--backendconf-golden={folder}",
        *[f"--backendconf-select={s}" for s in PARITY],
        *extra,
    )


@pytest.mark.slow
def test_a_golden_folder_of_the_reference_backend_replays_and_known_failures_are_left_out(pytester, tmp_path):
    folder = tmp_path / "golden"
    known = tmp_path / "known.toml"
    known.write_text('"parity::linear[[]float16]" = { reason = "listed, but it passes" }\n')
    result = golden_run(
        pytester, "reference", folder, f"--backendconf-known-failures={known}", "--backendconf-report=host.json"
    )
    result.assert_outcomes(passed=3, failed=1)  # the listed check passes, which fails the run
    index = json.loads((folder / "index.json").read_text())
    names = [entry["archive"] for entry in index["archives"]]
    assert sorted(names) == [
        "parity.linear.float32-dynamic.bcpt",
        "parity.linear.float32.bcpt",
        "parity.mlp.float32.bcpt",
    ]
    assert sorted(os.listdir(folder)) == sorted([*names, "index.json"])  # the listed check's file is removed
    result.stdout.fnmatch_lines(
        [
            "backendconf: golden folder *golden: 3 archives with bundled inputs*; 1 archive of checks that did not pass removed"
        ]
    )
    bundles = bc.bundles(bc.load(folder / "parity.mlp.float32.bcpt"))
    assert len(bundles) == 3 and bundles[0].check == "parity::mlp[float32]" and bundles[0].tolerance == "default"
    # The dynamic check's bundles are at the sizes it was checked on: both ends of the range first.
    dynamic = bc.load(folder / "parity.linear.float32-dynamic.bcpt").bundled_inputs()
    assert len({args[0].shape for args in dynamic}) == 3

    report = tmp_path / "device.json"
    done = replay(str(folder), "--report", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replay: 9/9 bundles match their expected outputs (3 archives)" in done.stdout
    # One writer: the device's report has the suite's schema version, sections and summary fields.
    host, device = json.loads((pytester.path / "host.json").read_text()), json.loads(report.read_text())
    assert device["schema_version"] == host["schema_version"] == list(REPORT_SCHEMA_VERSION)
    assert device.keys() == host.keys()
    assert device["summary"]["replay"].keys() == host["summary"]["parity"].keys()
    assert {"scored", "not_needed"} <= device["summary"]["replay"].keys()
    assert device["tests"][0].keys() - {"details"} == host["tests"][0].keys() - {"details"}  # details: when any
    # Host and device side by side.
    page = tmp_path / "both.html"
    assert main(["report", "html", str(pytester.path / "host.json"), str(report), "-o", str(page)]) == 0
    html = page.read_text()
    assert "parity" in html and "replay" in html and "parity.mlp.float32" in html
    assert main(["report", "merge", str(pytester.path / "host.json"), str(report)]) == 0


@pytest.mark.slow
def test_a_backend_right_on_the_host_and_off_on_the_device_passes_parity_and_fails_replay(pytester, tmp_path):
    folder = tmp_path / "golden"
    result = golden_run(pytester, "drifts_on_device", folder)
    result.assert_outcomes(passed=4)
    done = replay(str(folder), "-p", BROKEN)
    assert done.returncode == 1
    out = done.stdout
    assert "replay: 0/12 bundles match their expected outputs (4 archives)" in out
    for name in (
        "parity.mlp.float32",
        "parity.linear.float32",
        "parity.linear.float16",
        "parity.linear.float32-dynamic",
    ):
        for i in range(3):
            assert f"FAILED backendconf::replay::{name}.forward[{i}]" in out
    assert (
        "bundle forward[0]: the outputs on the target differ from the expected outputs (eager PyTorch on the host):"
        in out
    )
    assert "max abs error" in out and "max rel error" in out and "closeness" in out and "worst element" in out
