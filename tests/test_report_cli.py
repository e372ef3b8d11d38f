"""``backendconf report`` commands that print a lot end quietly when their reader goes away."""

from __future__ import annotations

import json
import subprocess
import sys


def test_report_ops_piped_into_head_ends_quietly(tmp_path):
    tests = [
        {"id": f"backendconf::ops::aten.op{i}.default[float32-sample0]", "category": "ops", "outcome": "passed"}
        for i in range(5000)  # a matrix larger than a pipe's buffer
    ]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"schema": "backendconf-report", "tests": tests}))
    done = subprocess.run(
        f"{sys.executable} -m pytest_backendconf.cli report ops {report} | head -2",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert done.stdout.splitlines()[0].startswith("overload")
    assert done.stderr == ""  # no BrokenPipeError, no "Exception ignored"


def test_only_checks_that_draw_inputs_name_the_seed_in_their_reproduce_line(pytester):
    pytester.makeini("[pytest]\n")
    pytester.runpytest(
        "--backend=reference",
        "-p",
        "no:cacheprovider",
        "--backendconf-hypothesis=dev",
        "--hypothesis-seed=12345",
        "--backendconf-select=backendconf::contract::*mlp*",
        "--backendconf-select=backendconf::parity::mlp[[]float32]",
        "--backendconf-report=report.json",
    )
    tests = json.loads((pytester.path / "report.json").read_text())["tests"]
    contract = [t for t in tests if t["category"] == "contract"]
    (parity,) = [t for t in tests if t["category"] == "parity"]
    assert contract and not any("--hypothesis-seed" in t["reproduce"] for t in contract)
    assert parity["reproduce"].endswith("--backendconf-hypothesis=dev --hypothesis-seed=12345")
