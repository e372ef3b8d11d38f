"""Minimal reproductions: a failing model check is shrunk to a program of a few nodes, as a script.

Each broken backend fails on one operator of ``smooth_activations`` (eleven
operator nodes: gelu, silu, sigmoid, tanh, elu, softplus and the arithmetic
joining them): it crashes its process on gelu, hangs on tanh, raises an
undeclared error on sigmoid, or computes sub wrong in float16 only. The
suite's failure must name a script of at most three operator nodes that
contains that operator, and running the script with plain ``python`` must
fail the same way. One model per run keeps these runs to seconds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.diagnostics import Candidate, Outcome, same_failure
from pytest_backendconf.report import parse_report, render
from pytest_backendconf.report._failure_groups import same_program_groups, same_program_lines
from report_records import records

TESTS_DIR = Path(__file__).parent
CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
from {module} import {cls}

def backendconf_register_backends(register):
    register({cls}())
"""
MODEL = "smooth_activations"


def run_suite(pytester, name: str, select: str, *more: str, conftest: tuple[str, str] | None = None):
    if conftest is not None:
        pytester.makeconftest(CONFTEST.format(tests=str(TESTS_DIR), module=conftest[0], cls=conftest[1]))
    # In this process: the crashes and hangs happen in the backend host and the minimiser's children.
    result = pytester.runpytest(
        f"--backend={name}",
        "-p",
        "no:cacheprovider",
        "--backendconf-hypothesis=ci",
        "--backendconf-minify=on",
        f"--backendconf-select={select}",
        "--backendconf-report=report.json",
        f"--basetemp={pytester.path / 'tmp'}",
        *more,
    )
    report = json.loads((pytester.path / "report.json").read_text())
    return result, {t["id"]: t for t in report["tests"]}


def reproduction_of(result, tests: dict, check: str, op: str) -> Path:
    """The script the failure names; it has at most 3 operator nodes, among them ``op``."""
    test = tests[f"backendconf::{check}"]
    assert test["outcome"] == "failed"
    record = test["reproduction"]
    assert record["script"] and 1 <= record["nodes"] <= 3, record
    assert op in record["ops"], record
    text = result.stdout.str()
    line = f"minimal reproduction: {record['nodes']} node{'' if record['nodes'] == 1 else 's'}, {record['script']}"
    assert line in text
    # the failure text ends with it (the line after pytest's own failure section is its separator)
    section = text.split(f"_ backendconf::{check} _", 1)[1]
    assert section.split("\n\n", 1)[0].rstrip().endswith(line) or line in section.split("\n=")[0]
    script = Path(record["script"])
    assert script.name == "repro_" + re.sub(r"[^A-Za-z0-9]+", "_", check).strip("_") + ".py"
    assert script.with_suffix(".safetensors").exists()
    code = script.read_text()
    assert f"torch.ops.{op.replace('::', '.')}." in code  # the graph as readable Python
    assert "bc.to_backend(" in code
    return script


def run_script(script: Path, *, timeout: float = 120, prefix: list[str] | None = None):
    """``python repro_x.py`` in its own folder, as the compiler engineer runs it."""
    return subprocess.run(
        [sys.executable, *(prefix or []), script.name],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_clean_env(),
    )


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BACKENDCONF_")}


@pytest.fixture(autouse=True)
def in_the_host(monkeypatch):
    """A crash or a hang happens only in the backend host (as users run it)."""
    monkeypatch.delenv("BACKENDCONF_IN_PROCESS", raising=False)


@pytest.mark.slow
def test_a_crash_on_one_operator_gives_a_script_that_crashes_with_the_same_signal(pytester):
    check = f"parity::{MODEL}[float32]"
    result, tests = run_suite(pytester, "aborts_on_gelu", check, conftest=("broken_backends_minify", "AbortsOnGelu"))
    assert "killed by signal 6 (SIGABRT)" in tests[f"backendconf::{check}"]["error"]["message"]
    script = reproduction_of(result, tests, check, "aten::gelu")
    ran = run_script(script)
    assert ran.returncode == -signal.SIGABRT, ran.stderr[-2000:]


@pytest.mark.slow
def test_a_hang_on_one_operator_gives_a_script_that_hangs_there(pytester):
    check = f"parity::{MODEL}[float32]"
    result, tests = run_suite(
        pytester, "hangs_on_tanh", check, "--backendconf-timeout=4", conftest=("broken_backends_minify", "HangsOnTanh")
    )
    assert "within 4 s" in json.dumps(tests[f"backendconf::{check}"]["error"])  # it hung in its check
    script = reproduction_of(result, tests, check, "aten::tanh")
    # It runs until the backend's preprocess() says it hangs, and is still running a while later.
    process = subprocess.Popen(
        [sys.executable, script.name], cwd=script.parent, stderr=subprocess.PIPE, text=True, env=_clean_env()
    )
    try:
        assert process.stderr is not None
        # Blocks until the script prints (or ends). torch's own warnings may come first: a CUDA build
        # of torch without triton logs "triton not found" when the script imports it.
        said = []
        while len(said) < 20 and (line := process.stderr.readline()):
            said.append(line)
            if "hangs_on_tanh: preprocess() of a program with tanh never returns" in line:
                break
        else:
            raise AssertionError(f"the script never said it hangs: {said}")
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(2)
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_an_undeclared_error_on_one_operator_gives_a_script_that_raises_it(pytester, monkeypatch):
    monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "1")  # an error needs no host: shrunk from the pytest process too
    check = f"parity::{MODEL}[float32]"
    result, tests = run_suite(
        pytester, "raises_on_sigmoid", check, conftest=("broken_backends_minify", "RaisesOnSigmoid")
    )
    assert tests[f"backendconf::{check}"]["error"]["type"] == "LoweringError"
    script = reproduction_of(result, tests, check, "aten::sigmoid")
    ran = run_script(script)
    assert ran.returncode == 1
    assert "LoweringError: preprocess() of backend 'raises_on_sigmoid' failed" in ran.stderr
    assert "NotImplementedError: no kernel for aten.sigmoid.default" in ran.stderr
    # the HTML page links the script
    page = render([parse_report(json.loads((pytester.path / "report.json").read_text()), "report.json")])
    assert f'href="{script.as_uri()}"' in page


@pytest.mark.slow
def test_a_float16_only_error_gives_a_script_that_shows_the_divergence(pytester, monkeypatch):
    monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "1")
    pytester.syspathinsert(TESTS_DIR)
    check = f"parity::{MODEL}[float16]"
    result, tests = run_suite(pytester, "wrong_half_sub", check, "-p", "broken_backends_ops")
    assert "Diverges first at node 'sub' (aten::sub)" in tests[f"backendconf::{check}"]["error"]["message"]
    script = reproduction_of(result, tests, check, "aten::sub")
    assert "'broken_backends_ops'" in script.read_text()  # registered the way the run did: -p
    ran = run_script(script)
    assert ran.returncode == 1
    assert "AssertionError: output 0 (aten::sub) on backend 'wrong_half_sub' diverges from eager PyTorch" in ran.stderr
    assert "max abs error" in ran.stderr


def test_passing_and_known_failing_checks_are_not_shrunk(pytester, monkeypatch):
    monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "1")
    known = pytester.path / "known.toml"
    known.write_text(f'"backendconf::parity::{MODEL}[float32]" = {{ reason = "sigmoid is not implemented" }}\n')
    result, tests = run_suite(
        pytester,
        "raises_on_sigmoid",
        "backendconf::parity::*[[]float32]",
        "-k",
        f"{MODEL} or linear",
        f"--backendconf-known-failures={known}",
        conftest=("broken_backends_minify", "RaisesOnSigmoid"),
    )
    outcomes = {i: t["outcome"] for i, t in tests.items()}
    assert outcomes[f"backendconf::parity::{MODEL}[float32]"] == "known_failure"
    assert outcomes["backendconf::parity::linear[float32]"] == "passed"
    assert all(t["reproduction"] is None for t in tests.values())
    assert "minimal reproduction" not in result.stdout.str()
    assert not (pytester.path / "tmp" / "reproductions").exists()


def test_minify_off_and_a_bad_default_are_refused_or_respected(pytester, monkeypatch):
    monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "1")
    pytester.makeconftest(CONFTEST.format(tests=str(TESTS_DIR), module="broken_backends_minify", cls="RaisesOnSigmoid"))
    select = f"--backendconf-select=parity::{MODEL}[float32]"
    off = pytester.runpytest("--backend=raises_on_sigmoid", "--backendconf-minify=off", select)
    off.assert_outcomes(failed=1)
    assert "minimal reproduction" not in off.stdout.str()
    monkeypatch.setenv("BACKENDCONF_MINIFY", "maybe")
    bad = pytester.runpytest("--backend=raises_on_sigmoid", select)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*BACKENDCONF_MINIFY='maybe': use 'on' or 'off'*"])


class TwoOps(torch.nn.Module):
    def forward(self, x):
        a = torch.relu(x) + 1
        b = torch.tanh(a) * 2
        c = torch.sigmoid(x) - b
        return torch.nn.functional.gelu(c) + a


@pytest.mark.slow
def test_minify_finds_a_failure_that_needs_two_nodes():
    """Delta debugging: the failure needs tanh and gelu together; nothing else stays."""
    x = torch.randn(3, 4)
    program = torch.export.export(TwoOps(), (x,))
    needs = {"aten::tanh", "aten::gelu"}
    found = bc.minify(program, "reference", [x], lambda c: c.outcome.kind == "passed" and needs <= set(c.ops))
    assert found.program is not None and not found.budget_ran_out
    assert sorted(found.ops) == sorted(needs)
    assert found.original_nodes > 4 and found.tried > 2
    program_out, inputs = found  # unpacks as the program and its inputs
    ops = [str(n.target) for n in program_out.graph_module.graph.nodes if n.op == "call_function"]
    assert ops == ["aten.tanh.default", "aten.gelu.default"]
    assert len(inputs) == 2  # tanh's and gelu's inputs, eager values from the cut-off nodes


def test_minify_with_no_budget_says_so_and_bad_inputs_are_named():
    x = torch.randn(3, 4)
    program = torch.export.export(TwoOps(), (x,))
    found = bc.minify(program, "reference", [x], lambda c: True, budget=0)
    assert found.program is None and found.budget_ran_out and found.tried == 0
    with pytest.raises(TypeError, match=r"minify\(\): input 0 is a float; pass the program's flat user inputs"):
        bc.minify(program, "reference", [1.0], lambda c: True)
    with pytest.raises(TypeError, match="needs a registered backend's name or object, got int"):
        bc.minify(program, 3, [x], lambda c: True)
    assert "minify" in bc.__all__


def test_the_predicates_match_the_same_failure_only():
    crash = same_failure(Outcome("crashed", returncode=-6))
    assert crash(Candidate(("a",), ("aten::gelu",), Outcome("crashed", returncode=-6)))
    assert not crash(Candidate(("a",), ("aten::gelu",), Outcome("crashed", returncode=-11)))
    raised = same_failure(Outcome("raised", error_type="KeyError", message="no kernel for aten.sigmoid.default"))
    wrapped = "preprocess() of backend 'x' failed for method 'forward': KeyError: no kernel for aten::sigmoid"
    assert raised(Candidate(("s",), ("aten::sigmoid",), Outcome("raised", error_type="LoweringError", message=wrapped)))
    other = wrapped.replace("sigmoid", "tanh")
    assert not raised(Candidate(("t",), ("aten::tanh",), Outcome("raised", error_type="LoweringError", message=other)))
    diverged = same_failure(Outcome("diverged", op="aten::sub"))
    assert diverged(Candidate(("s",), ("aten::sub",), Outcome("diverged", op="aten::sub", max_abs=0.1)))
    assert not diverged(Candidate(("m",), ("aten::mul",), Outcome("diverged", op="aten::mul", max_abs=0.1)))


def test_failures_that_minimise_to_the_same_program_are_named_together():
    def failure(i, ops):
        return {"id": f"backendconf::parity::m{i}[float32]", "reproduction": {"script": f"/r{i}.py", "ops": ops}}

    groups = same_program_groups(
        records([failure(1, ["aten::gelu"]), failure(2, ["aten::gelu"]), failure(3, ["aten::tanh"]), {"id": "x"}])
    )
    assert [(g.template, g.ids) for g in groups] == [
        ("aten::gelu", ["backendconf::parity::m1[float32]", "backendconf::parity::m2[float32]"])
    ]
    assert same_program_lines(groups)[0] == "2 failures minimise to the same program (aten::gelu):"


def test_a_check_failed_at_once_after_a_hang_is_not_shrunk_again():
    # The check that hung was shrunk; the later checks of that model fail at once and shrink nothing.
    from pytest_backendconf.suite._host import NOT_RUN_AGAIN
    from pytest_backendconf.suite._minify import target_of

    assert target_of({"type": NOT_RUN_AGAIN, "message": "m"}, "not run: ...", None) is None
    assert target_of({"type": "RuntimeError", "message": "m"}, "boom", None) is not None
