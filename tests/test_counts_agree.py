"""One run with a known-failures file: the terminal, the JSON report and the HTML page give the same counts."""

from __future__ import annotations

import html
import json
import pathlib
import re
import textwrap

TESTS = pathlib.Path(__file__).parent

SELECT = [
    "backendconf::ops::aten.sub.Tensor[[]float16*",  # wrong in float16: known failures
    "backendconf::ops::aten.add.Tensor[[]float32*",  # passes
    "backendconf::ops::aten.tanh.default*",  # not declared: unsupported
    "backendconf::parity::nested_nml[[]float16]",  # a subtraction in float16: a known failure
    "backendconf::parity::smooth_activations[[]float32]",  # a tanh: unsupported
    "backendconf::delegation::smooth_activations[[]float32]",  # needs partial delegation
    "backendconf::delegation::nested_nml[[]float32]",  # lowered whole: not needed
    "backendconf::delegation::arithmetic_tensors[[]float32]",  # lowered whole: not needed
]


def test_terminal_json_and_html_agree_on_every_category(pytester):
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(
        textwrap.dedent("""
        from broken_backends_ops import WrongHalfSub
        from broken_backends_wholegraph import FusedBuild

        class FusedBuildHalfSub(FusedBuild, WrongHalfSub):
            name = "fused_build_half_sub"

        def backendconf_register_backends(register):
            register(FusedBuildHalfSub())
        """)
    )
    known = pytester.path / "known.toml"
    known.write_text(
        '"ops::aten.sub.Tensor[[]float16-*" = { reason = "fp16 sub" }\n'
        '"parity::nested_nml[[]float16]" = { reason = "fp16 sub" }\n'
    )
    result = pytester.runpytest(
        "--backend=fused_build_half_sub",
        "-p",
        "no:cacheprovider",
        f"--backendconf-known-failures={known}",
        "--backendconf-report=report.json",
        "--backendconf-html=report.html",
        *[f"--backendconf-select={s}" for s in SELECT],
    )
    assert result.ret == 0, result.stdout.str()
    document = json.loads((pytester.path / "report.json").read_text())
    page = html.unescape((pytester.path / "report.html").read_text())
    terminal = result.stdout.str()
    summary = document["summary"]
    # The run has every kind of count this is about.
    assert summary["ops"]["known_failure"] == 2 and summary["ops"]["failed"] == 0 and summary["ops"]["passed"]
    assert summary["parity"]["known_failure"] == 1 and summary["parity"]["unsupported"] == 1
    delegation = summary["delegation"]
    assert delegation["not_needed"] == 2 and delegation["scored"] == delegation["total"] - 2 == 1
    assert delegation["score"] == delegation["passed"] / delegation["scored"]
    # JSON: the ops matrix's counts are the summary's.
    assert document["ops"]["checks"] == summary["ops"]
    for category, counts in summary.items():
        if not counts["total"]:
            continue
        scored, passed = counts["scored"], counts["passed"]
        known_words = f"{counts['known_failure']} known failure{'' if counts['known_failure'] == 1 else 's'}"
        # terminal
        line = next(
            (l for l in terminal.splitlines() if l.startswith(f"{category} ") and " passed" in l), None
        )
        assert line is not None, (category, terminal)
        assert f" {passed}/{scored} passed" in line, line
        assert known_words in line and f"{counts['failed']} failed" in line
        assert f"{counts['unsupported']} unsupported" in line
        # HTML
        card = page.split(f'data-category="{category}"', 1)[1].split("</div>", 1)[0]
        assert f">{passed}/{scored}<" in card, card
        for outcome, words in (("known_failure", "known failure"), ("unsupported", "unsupported"), ("failed", "failed")):
            if counts[outcome]:
                assert f"{counts[outcome]} {words}" in card, card
            else:
                assert not re.search(rf"\d+ {words}", card), card
    assert f"{delegation['not_needed']} not needed (lowered whole)" in page
    assert f"{delegation['not_needed']} not needed (lowered whole)" in terminal
