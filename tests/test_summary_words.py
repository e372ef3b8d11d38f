"""Counts read as words in the summary and on the HTML page: plurals agree, and the failure groups' masks keep
counts and dtypes readable."""

from __future__ import annotations

import html
import pathlib
import textwrap

import pytest

from pytest_backendconf.report import counted
from pytest_backendconf.report._failure_groups import group_failures, template
from report_records import records

TESTS = pathlib.Path(__file__).parent


def test_a_count_and_its_noun_agree():
    assert counted(1, "known failure") == "1 known failure"
    assert counted(30, "known failure") == "30 known failures"
    assert counted(0, "golden archive") == "0 golden archives"
    assert counted(1, "golden archive") == "1 golden archive"
    assert counted(2, "unexpected pass") == "2 unexpected passes"
    assert counted(3, "entry", "entries") == "3 entries"
    # an outcome's participle is not a noun
    assert counted(5, "failed") == "5 failed" and counted(2, "unsupported") == "2 unsupported"


def test_masks_keep_fractions_dtypes_and_words_with_digits_readable():
    assert (
        template("CheckFailed", "mlp (float32): 4/6 nodes delegated, 2 partitions")
        == "CheckFailed: mlp (float32): <n>/<n> nodes delegated, <n> partitions"
    )
    assert (
        template("OutputSpecError", "output 0 is float32 where the program says float16 (conv2d)")
        == "OutputSpecError: output <n> is float32 where the program says float16 (conv2d)"
    )
    # a path is still a path, and a number still a number
    assert template("X", "saved to /tmp/a/b.safetensors after 1.5e-3 s") == "X: saved to <path> after <n> s"
    # one defect in two dtypes is two groups: the dtype is what a vendor looks for
    groups = group_failures(
        records(
            {"id": f"ops::x[{d}-sample{k}]", "error": {"type": "CheckFailed", "message": f"a.b in {d} (sample {k})"}}
            for d in ("float16", "bfloat16")
            for k in range(2)
        )
    )
    assert [(g.template, len(g.ids)) for g in groups] == [
        ("CheckFailed: <op> in float16 (sample <n>)", 2),
        ("CheckFailed: <op> in bfloat16 (sample <n>)", 2),
    ]


def test_unexpected_passes_are_grouped_as_such_not_as_a_failure():
    groups = group_failures(
        records(
            [
                {"id": "ops::a[float16-sample0]", "outcome": "unexpected_pass", "error": None},
                {"id": "ops::b[float16-sample0]", "outcome": "unexpected_pass"},
                {"id": "ops::c[float16-sample0]", "outcome": "failed", "error": None},
            ]
        )
    )
    assert [(g.template, g.ids) for g in groups] == [
        ("unexpected pass: a listed known failure passes now", ["ops::a[float16-sample0]", "ops::b[float16-sample0]"]),
        ("failure", ["ops::c[float16-sample0]"]),
    ]


def _run_wrong_half_sub(pytester, known_pattern: str, *args: str) -> pytest.RunResult:
    """A run of ``WrongHalfSub`` (float16 ``aten.sub`` off) with ``known_pattern`` listed and an HTML page."""
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(
        textwrap.dedent("""
        from broken_backends_ops import WrongHalfSub

        def backendconf_register_backends(register):
            register(WrongHalfSub())
        """)
    )
    known = pytester.path / "known.toml"
    known.write_text(f'"{known_pattern}" = {{ reason = "fp16 sub" }}\n')
    return pytester.runpytest(
        "--backend=wrong_half_sub",
        "-p",
        "no:cacheprovider",
        f"--backendconf-known-failures={known}",
        "--backendconf-html=report.html",
        *args,
    )


def test_a_run_says_known_failures_in_the_plural_on_the_terminal_and_the_html_cards(pytester):
    result = _run_wrong_half_sub(
        pytester,
        "ops::aten.sub.Tensor[[]float16-*",
        "--backendconf-select=backendconf::ops::aten.sub.Tensor[[]float16*",
        "--backendconf-select=backendconf::parity::nested_nml[[]float16]",
        "--backendconf-select=backendconf::parity::arithmetic_tensors[[]float16]",
    )
    assert result.ret == 1  # the two parity checks are not listed
    terminal = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "parity * 0/2 passed (0.0%); 0 unsupported, 0 known failures, 2 failed*",
            "ops  0/2 passed; 0 unsupported, 2 known failures, 0 failed — 0 of 1 overload fully supported",
            "failures grouped by message (numbers and names masked):",
            "2 × CheckFailed: <op> in float16: the backend's outputs differ from *",
        ]
    )
    assert "known failure," not in terminal.replace("1 known failure,", "")
    page = html.unescape((pytester.path / "report.html").read_text())
    card = page.split('data-category="ops"', 1)[1].split("</div>", 1)[0]
    assert "2 known failures" in card, card
    parity = page.split('data-category="parity"', 1)[1].split("</div>", 1)[0]
    assert "2 failed" in parity and "known failure" not in parity, parity


def test_one_known_failure_is_said_in_the_singular(pytester):
    """The other direction: a count of one keeps its noun singular."""
    result = _run_wrong_half_sub(
        pytester,
        "ops::aten.sub.Tensor[[]float16-sample0]",
        "--backendconf-select=backendconf::ops::aten.sub.Tensor[[]float16-sample0]",
        "--backendconf-select=backendconf::ops::aten.sub.Tensor[[]float32*",
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["ops  */* passed; 0 unsupported, 1 known failure, 0 failed*"])
    page = html.unescape((pytester.path / "report.html").read_text())
    card = page.split('data-category="ops"', 1)[1].split("</div>", 1)[0]
    assert "1 known failure" in card and "1 known failures" not in card, card
