"""What the report commands and reproduce lines say."""

from __future__ import annotations

import json


# `report ops | head` ending quietly is tests/test_report_merge.py::test_report_output_into_a_closed_pipe_ends_quietly.


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
