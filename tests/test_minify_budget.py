"""What minimal reproductions cost a run, said in the summary, and bounded: one per failure group, and a run budget.

``raises_on_sigmoid`` fails every model with a sigmoid the same way (one failure group): only the first is
shrunk, the others name its script. A backend that also computes ``aten.sub`` wrong in float16 fails
``arithmetic_tensors[float16]`` in another group: with a tiny run budget, the second group's reproduction
is skipped, in one line that says how to get it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).parent
SIGMOID = ("backendconf::parity::smooth_activations[float32]", "backendconf::parity::encoder_decoder.decode[float32]")
SUB = "backendconf::parity::arithmetic_tensors[float16]"


@pytest.fixture(autouse=True)
def backends(pytester, monkeypatch):
    monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "1")  # errors and divergences need no host
    monkeypatch.delenv("BACKENDCONF_MINIFY_RUN_BUDGET", raising=False)
    pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})  # pytest-xdist's workers too\n"
        + textwrap.dedent("""
        from broken_backends_minify import RaisesOnSigmoid
        from broken_backends_ops import WrongHalfSub

        class SigmoidAndHalfSub(RaisesOnSigmoid, WrongHalfSub):
            name = "sigmoid_and_half_sub"

        def backendconf_register_backends(register):
            register(RaisesOnSigmoid())
            register(SigmoidAndHalfSub())  # the reference backend is installed: registered by its entry point
        """)
    )


def _run(pytester, backend, checks, *more, ini="[pytest]\n"):
    pytester.makeini(ini)
    result = pytester.runpytest(
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        "--backendconf-minify=on",
        "--backendconf-report=report.json",
        f"--basetemp={pytester.path / 'tmp'}",
        *[f"--backendconf-select={c.replace('[', '[[]')}" for c in checks],
        *more,
    )
    tests = {t["id"]: t for t in json.loads((pytester.path / "report.json").read_text())["tests"]}
    return result, tests


@pytest.mark.slow
def test_one_failure_group_is_shrunk_once_and_the_summary_says_what_it_cost(pytester):
    result, tests = _run(pytester, "raises_on_sigmoid", SIGMOID)
    records = [tests[c]["reproduction"] for c in SIGMOID]
    own = [r for r in records if not r.get("same_as")]
    (first,) = own
    (same,) = [r for r in records if r.get("same_as")]
    assert first["script"] and first["ops"] == ["aten::sigmoid"] and first["seconds"] >= 0
    first_id = next(c for c in SIGMOID if tests[c]["reproduction"] is first)
    # the other failure of the group names the first one's script, and cost nothing
    assert same["same_as"] == first_id and same["script"] == first["script"] and "seconds" not in same
    text = result.stdout.str()
    assert f"minimal reproduction (the same failure as {first_id}): 1 node, {first['script']}" in text
    result.stdout.fnmatch_lines(
        [
            "minimal reproductions: 1 script, * s; --backendconf-minify=off skips them; "
            "1 failure of a group already shrunk named its reproduction",
        ]
    )
    assert len(list((pytester.path).rglob("repro_*.py"))) == 1


def test_the_run_budget_skips_later_groups_in_one_line_that_says_how_to_get_them(pytester):
    ini = "[pytest]\nbackendconf_minify_run_budget = 0.001\n"  # the ini option: spent by the first group
    result, tests = _run(pytester, "sigmoid_and_half_sub", (SIGMOID[0], SUB), ini=ini)
    records = {c: tests[c]["reproduction"] for c in (SIGMOID[0], SUB)}
    skipped = [c for c, r in records.items() if r.get("skipped")]
    assert len(skipped) == 1, records
    (made,) = [r for c, r in records.items() if c not in skipped]
    assert made["run_budget"] == 0.001 and made["budget"] <= 0.001  # its own budget trimmed to what was left
    record = records[skipped[0]]
    assert record["script"] is None and record["run_budget"] == 0.001
    text = result.stdout.str()
    assert (
        "minimal reproduction: none (skipped: the run's 0.001 s for minimal reproductions "
        "(--backendconf-minify-run-budget) are spent; rerun this check alone (its reproduce command) to get one)"
    ) in text
    result.stdout.fnmatch_lines(
        [
            "minimal reproductions: * s; --backendconf-minify=off skips them; 1 failure not shrunk: the run's "
            "budget (0.001 s, --backendconf-minify-run-budget) was spent (rerun a check alone to get its reproduction)",
        ]
    )


@pytest.mark.slow
def test_without_a_run_budget_every_group_gets_its_reproduction(pytester):
    """The other direction: 0 is no limit, and two groups are two scripts."""
    result, tests = _run(pytester, "sigmoid_and_half_sub", (SIGMOID[0], SUB), "--backendconf-minify-run-budget=0")
    for check in (SIGMOID[0], SUB):
        record = tests[check]["reproduction"]
        assert record["script"] and not record.get("skipped") and not record.get("same_as"), record
        assert "run_budget" not in record
    assert tests[SUB]["reproduction"]["ops"] == ["aten::sub"]
    result.stdout.fnmatch_lines(["minimal reproductions: 2 scripts, * s; --backendconf-minify=off skips them"])


def test_a_correct_backend_has_nothing_to_shrink_and_says_nothing_of_it(pytester):
    result, tests = _run(pytester, "reference", (SIGMOID[0], SUB))
    assert result.ret == 0
    assert all(t["reproduction"] is None for t in tests.values())
    assert "minimal reproduction" not in result.stdout.str()


@pytest.mark.parametrize(
    ("how", "said"),
    [
        (("--backendconf-minify-run-budget=-1",), "--backendconf-minify-run-budget=-1: give the seconds"),
        (("--backendconf-minify-run-budget=soon",), "--backendconf-minify-run-budget=soon: give the seconds"),
    ],
)
def test_a_bad_run_budget_is_a_usage_error_naming_where_it_came_from(pytester, how, said):
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest("--backend=reference", "--backendconf-minify=on", *how)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{said} a run may spend on minimal reproductions, e.g. 300 (0: no limit)*"])


def test_a_bad_run_budget_from_the_environment_names_the_variable(pytester, monkeypatch):
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("BACKENDCONF_MINIFY_RUN_BUDGET", "inf")
    result = pytester.runpytest("--backend=reference", "--backendconf-minify=on")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*$BACKENDCONF_MINIFY_RUN_BUDGET=inf: give the seconds*"])
    # minify off: the budget is not read
    off = pytester.runpytest("--backend=reference", "--backendconf-minify=off", "--backendconf-select=contract::x")
    assert off.ret != pytest.ExitCode.USAGE_ERROR


@pytest.mark.slow
def test_pytest_xdist_workers_share_the_groups_and_the_budget(pytester):
    """Two workers, one failure group: still one script for the run (the account is a locked file of the run)."""
    pytest.importorskip("xdist")
    result, tests = _run(pytester, "raises_on_sigmoid", SIGMOID, "-n", "2")
    records = [tests[c]["reproduction"] for c in SIGMOID]
    assert sum(1 for r in records if not r.get("same_as")) == 1, records
    assert len({r.get("same_as") for r in records if r.get("same_as")}) == 1
    assert len(list(pytester.path.rglob("repro_*.py"))) == 1
    result.stdout.fnmatch_lines(["minimal reproductions: 1 script, * s; --backendconf-minify=off skips them*"])
    # the account the workers shared: in the run's temporary folder (the workers' basetemps are inside it)
    account = json.loads((pytester.path / "tmp" / "backendconf-minify.json").read_text())
    assert len(account["groups"]) == 1 and account["spent"] > 0
