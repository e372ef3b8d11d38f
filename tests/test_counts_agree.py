"""One run with a known-failures file: the terminal, the JSON report and the HTML page give the same counts,
and ``backendconf report known-failures`` writes from its report what ``--backendconf-write-known-failures`` wrote."""

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


def test_terminal_json_and_html_agree_and_the_report_rewrites_the_known_failures(pytester):
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
        '"ops::aten.sub.Tensor[[]float16-sample0]" = { reason = "fp16 sub", link = "https://bugs.example/1" }\n'
        '"parity::nested_nml[[]float16]" = { reason = "fp16 sub" }\n'
    )
    result = pytester.runpytest(
        "--backend=fused_build_half_sub",
        "-p",
        "no:cacheprovider",
        f"--backendconf-known-failures={known}",
        "--backendconf-report=report.json",
        "--backendconf-html=report.html",
        "--backendconf-write-known-failures=written.toml",
        *[f"--backendconf-select={s}" for s in SELECT],
    )
    assert result.ret == 1, result.stdout.str()  # sample1 of the float16 subtraction is not listed
    document = json.loads((pytester.path / "report.json").read_text())
    page = html.unescape((pytester.path / "report.html").read_text())
    terminal = result.stdout.str()
    summary = document["summary"]
    # The run has every kind of count this is about.
    assert summary["ops"]["known_failure"] == 1 and summary["ops"]["failed"] == 1 and summary["ops"]["passed"]
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
        line = next((x for x in terminal.splitlines() if x.startswith(f"{category} ") and " passed" in x), None)
        assert line is not None, (category, terminal)
        assert f" {passed}/{scored} passed" in line, line
        assert known_words in line and f"{counts['failed']} failed" in line
        assert f"{counts['unsupported']} unsupported" in line
        # HTML
        card = page.split(f'data-category="{category}"', 1)[1].split("</div>", 1)[0]
        assert f">{passed}/{scored}<" in card, card
        for outcome, words in (
            ("known_failure", "known failure"),
            ("unsupported", "unsupported"),
            ("failed", "failed"),
        ):
            if counts[outcome]:
                assert f"{counts[outcome]} {words}" in card, card
            else:
                assert not re.search(rf"\d+ {words}", card), card
    assert f"{delegation['not_needed']} not needed (lowered whole)" in page
    assert f"{delegation['not_needed']} not needed (lowered whole)" in terminal

    # The known-failures file, from the report alone: entry for entry what the run wrote.
    from pytest_backendconf.cli._main import main

    written = (pytester.path / "written.toml").read_text()
    assert (
        main(["report", "known-failures", str(pytester.path / "report.json"), "-o", str(pytester.path / "k.toml")]) == 0
    )
    assert (pytester.path / "k.toml").read_text() == written
    assert '"https://bugs.example/1"' in written  # the applied entry's reason and link are kept
    # a new one, with its failure's first line as the reason
    assert (
        '"backendconf::ops::aten.sub.Tensor[float16-sample1]" = { reason = "aten.sub.Tensor in float16 (sample 1'
        in written
    )
    # An existing -o file's entries are kept where they still hold.
    other = '"backendconf::parity::mlp[[]float32]" = { reason = "kept", link = "" }\n'
    (pytester.path / "k.toml").write_text(other)
    assert (
        main(["report", "known-failures", str(pytester.path / "report.json"), "-o", str(pytester.path / "k.toml")]) == 0
    )
    again = (pytester.path / "k.toml").read_text()
    assert again.count(" = {") == written.count(" = {") + 1 and '"kept"' in again


def test_known_failures_from_a_file_that_is_not_a_report(tmp_path, capsys):
    from pytest_backendconf.cli._main import main

    (tmp_path / "x.json").write_text("[]")
    assert main(["report", "known-failures", str(tmp_path / "x.json"), "-o", str(tmp_path / "k.toml")]) == 1
    assert "is not a backendconf report" in capsys.readouterr().err
    assert main(["report", "known-failures", str(tmp_path / "x.json"), "-o", str(tmp_path / "no" / "k.toml")]) == 1
    assert "does not exist; create it first" in capsys.readouterr().err
