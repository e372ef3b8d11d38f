"""Known-failures entries written from a run keep where the failure starts and its figures as keys of their own,
and a merge into a curated file keeps its comments and names the entries it removed."""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap

import pytest

from pytest_backendconf.cli._main import main
from pytest_backendconf.report import KnownFailure, edited_known_failures, load_known_failures

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TESTS = pathlib.Path(__file__).parent
ARITHMETIC = "backendconf::parity::arithmetic_tensors[float16]"  # (x + y) * (x - y) / y: the sub is wrong
NESTED = "backendconf::parity::nested_nml[float16]"  # a subtraction too
MLP = "backendconf::parity::mlp[float32]"  # passes


def _register(pytester, backend="WrongHalfSub"):
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(
        textwrap.dedent(f"""
        from broken_backends_ops import {backend}

        def backendconf_register_backends(register):
            register({backend}())
        """)
    )


def _run(pytester, backend, *options, select=(ARITHMETIC, NESTED, MLP)):
    return pytester.runpytest(
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        *options,
        *[f"--backendconf-select={s.replace('[', '[[]')}" for s in select],
    )


def test_a_divergence_entry_names_the_node_the_output_and_the_figures(pytester):
    _register(pytester)
    result = _run(pytester, "wrong_half_sub", "--backendconf-report=report.json")
    assert result.ret == 1
    known = pytester.path / "known.toml"
    assert main(["report", "known-failures", str(pytester.path / "report.json"), "-o", str(known)]) == 0
    data = tomllib.loads(known.read_text())
    entry = data[ARITHMETIC]
    # the reason is the failure's first line, whole (it was cut at 200 characters), without its closing colon
    assert entry["reason"].startswith("arithmetic_tensors.forward in float16: the backend's outputs differ from")
    assert entry["reason"].endswith("mode='random'") and len(entry["reason"]) > 150
    # where it starts and how far off, as keys of their own
    assert entry["node"] == "sub" and entry["op"] == "aten::sub" and entry["output"] == 0
    figures = entry["figures"]
    assert set(figures) == {"max_abs_error", "max_rel_error", "closeness", "ulp", "rtol", "atol"}
    assert figures["closeness"] > 1 and figures["max_abs_error"] > 0.01 and figures["rtol"] == 0.001
    # the same figures as the report's numerics, rounded for people to read
    test = next(t for t in json.loads((pytester.path / "report.json").read_text())["tests"] if t["id"] == ARITHMETIC)
    assert figures["max_abs_error"] == pytest.approx(test["numerics"]["outputs"][0]["max_abs_error"], rel=1e-3)
    assert test["details"]["divergence"]["node"] == "sub"
    assert data[NESTED]["node"] == "sub" and MLP not in data
    # each entry is one readable line, and the file reads back strictly, facts and all
    line = next(x for x in known.read_text().splitlines() if x.startswith(f'"{ARITHMETIC}"'))
    assert ', node = "sub", op = "aten::sub", output = 0, figures = { max_abs_error = ' in line
    (read,) = [e for e in load_known_failures(known, "-o") if e.pattern == ARITHMETIC]
    assert (read.node, read.op, read.output) == ("sub", "aten::sub", 0) and dict(read.figures) == figures
    # and it gates the report it came from
    assert main(["report", "gate", str(pytester.path / "report.json"), f"--known-failures={known}"]) == 0
    # The run option writes the same entries.
    again = _run(pytester, "wrong_half_sub", f"--backendconf-write-known-failures={pytester.path / 'run.toml'}")
    assert again.ret == 1
    assert tomllib.loads((pytester.path / "run.toml").read_text()) == data


def test_a_correct_backend_gets_no_entries_and_its_checks_no_divergence(pytester):
    _register(pytester, "AccurateHalf")
    result = _run(pytester, "accurate_half", "--backendconf-report=report.json", select=(ARITHMETIC, MLP))
    assert result.ret == 0, result.stdout.str()
    known = pytester.path / "known.toml"
    assert main(["report", "known-failures", str(pytester.path / "report.json"), "-o", str(known)]) == 0
    assert tomllib.loads(known.read_text()) == {}
    tests = json.loads((pytester.path / "report.json").read_text())["tests"]
    assert not any("divergence" in (t.get("details") or {}) for t in tests)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('node = ""', "node must be a non-empty string"),
        ("op = 3", "op must be a non-empty string"),
        ('output = "0"', "output must be the index of an output"),
        ("output = -1", "output must be the index of an output"),
        ("output = true", "output must be the index of an output"),
        ("figures = 3", "figures must be a table of numbers"),
        ("figures = { speed = 1.0 }", "figures has unknown key(s) 'speed'; it may have max_abs_error"),
        ('figures = { closeness = "314" }', "figures.closeness must be a number"),
        ("nodes = 1", "has unknown key(s) 'nodes'; an entry has only `reason` (required)"),
    ],
)
def test_a_bad_fact_is_a_usage_error_naming_the_entry_and_the_fix(tmp_path, value, said):
    path = tmp_path / "known.toml"
    path.write_text(f'"parity::x[[]float16]" = {{ reason = "r", {value} }}\n')
    with pytest.raises(pytest.UsageError) as raised:
        load_known_failures(path, "--backendconf-known-failures")
    assert "entry 'parity::x[[]float16]'" in str(raised.value) and said in str(raised.value), str(raised.value)


def test_a_run_refuses_a_file_with_a_bad_fact(pytester):
    _register(pytester)
    (pytester.path / "bad.toml").write_text(f'"{MLP}" = {{ reason = "r", figures = {{ closeness = "high" }} }}\n')
    result = _run(pytester, "wrong_half_sub", "--backendconf-known-failures=bad.toml", select=(MLP,))
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*entry 'backendconf::parity::mlp[[]float32]'*figures.closeness must be a number*"])


CURATED = f"""\
# Known failures of wrong_half_sub: reviewed every Monday.
# Numerics (float16 subtraction, https://bugs.example/7):
"{ARITHMETIC}" = {{ reason = "fp16 sub", link = "https://bugs.example/7" }}  # since 0.3

# Fixed last week; this run should drop it:
"{MLP}" = {{ reason = "was off in float32" }}
# (end of list)
"""


def test_a_merge_keeps_the_comments_and_names_what_it_removed(pytester):
    _register(pytester)
    known = pytester.path / "known.toml"
    known.write_text(CURATED)
    result = _run(
        pytester,
        "wrong_half_sub",
        f"--backendconf-known-failures={known}",
        f"--backendconf-write-known-failures={known}",
        "--backendconf-report=report.json",
    )
    assert result.ret == 1  # the mlp entry's check passes: an unexpected pass
    written = known.read_text()
    lines = written.splitlines()
    # every comment and blank line is where it was; the kept entry's line is byte for byte the same
    for line in CURATED.splitlines():
        if line.startswith("#") or not line or line.startswith(f'"{ARITHMETIC}"'):
            assert line in lines, (line, written)
    assert MLP not in written
    # the new failure is inserted where it sorts, among the entries, with its facts
    nested = next(i for i, x in enumerate(lines) if x.startswith(f'"{NESTED}"'))
    assert lines[nested - 1].startswith(f'"{ARITHMETIC}"') and ', node = "sub"' in lines[nested]
    result.stdout.fnmatch_lines(
        [
            f"backendconf: wrote 2 known failures to {known} (1 added, 1 removed)",
            f"backendconf: removed {MLP}: {MLP} passes now",
        ]
    )
    # From the report, onto the curated file again: the same text, and the same lines said.
    known.write_text(CURATED)
    assert main(["report", "known-failures", str(pytester.path / "report.json"), "-o", str(known)]) == 0
    assert known.read_text() == written


def test_a_merge_into_a_file_without_entries_or_with_nothing_removed(capsys, tmp_path):
    """The other direction: nothing removed, nothing said; a file of comments alone gets its entries at the end."""
    old = "# only a comment\n"
    entry = KnownFailure("backendconf::parity::x[float16]", "r", node="sub", figures=(("closeness", 3.5),))
    text, why = edited_known_failures(old, [entry], "b")
    assert why is None
    assert (
        text
        == old
        + '"backendconf::parity::x[float16]" = { reason = "r", link = "", node = "sub", figures = { closeness = 3.5 } }\n'
    )
    assert edited_known_failures(text, [entry], "b") == (text, None)  # unchanged: byte for byte


def test_a_file_that_is_not_one_entry_a_line_is_written_whole_and_says_why(pytester, capsys):
    _register(pytester)
    _run(pytester, "wrong_half_sub", "--backendconf-report=report.json", select=(ARITHMETIC,))
    known = pytester.path / "known.toml"
    known.write_text(f'# a comment\n["{MLP}"]\nreason = "a table"\n')
    assert main(["report", "known-failures", str(pytester.path / "report.json"), "-o", str(known)]) == 0
    out = capsys.readouterr().out
    assert f"backendconf: {known} was written whole, its comments not kept: it has [table] headers" in out
    data = tomllib.loads(known.read_text())
    assert set(data) == {ARITHMETIC, MLP}  # the table's entry kept (it names no check of this report)


def test_an_infinite_figure_is_toml_in_the_file_and_a_string_in_the_report(tmp_path):
    """A backend returning inf: TOML has ``inf``; JSON has none, so the report writes ``"inf"`` as its numerics do."""
    from pytest_backendconf.report._failure_facts import facts_of

    numerics = {
        "outputs": [
            {"output": 1, "closeness": "inf", "max_abs_error": "inf", "passed_by": None, "tolerance": {"rtol": 0.01}}
        ]
    }
    facts = facts_of({"numerics": numerics}, None)
    assert facts["output"] == 1 and dict(facts["figures"])["closeness"] == float("inf")
    path = tmp_path / "known.toml"
    from pytest_backendconf.report import format_known_failures

    path.write_text(format_known_failures([KnownFailure("parity::x[[]float16]", "r", **facts)], "b"))
    assert "figures = { max_abs_error = inf, closeness = inf, rtol = 0.01 }" in path.read_text()
    (read,) = load_known_failures(path, "--backendconf-known-failures")
    assert json.loads(json.dumps(read.as_json(), allow_nan=False))["figures"]["closeness"] == "inf"


def test_entries_rebuilt_from_a_report_whose_file_is_gone_keep_their_facts(pytester):
    _register(pytester)
    known = pytester.path / "applied.toml"
    known.write_text(
        f'"{ARITHMETIC}" = {{ reason = "fp16 sub", link = "https://bugs.example/7", node = "sub", op = "aten::sub", '
        "output = 0, figures = { closeness = inf, rtol = 0.001 } }\n"
    )
    result = _run(
        pytester,
        "wrong_half_sub",
        f"--backendconf-known-failures={known}",
        "--backendconf-report=r.json",
        select=(ARITHMETIC,),
    )
    assert result.ret == 0, result.stdout.str()
    test = json.loads((pytester.path / "r.json").read_text())["tests"][0]
    assert test["known_failure"]["figures"] == {"closeness": "inf", "rtol": 0.001}  # JSON has no inf
    known.unlink()  # the report alone now says what the run applied
    out = pytester.path / "again.toml"
    assert main(["report", "known-failures", str(pytester.path / "r.json"), "-o", str(out)]) == 0
    entry = tomllib.loads(out.read_text())[ARITHMETIC]
    assert entry == {
        "reason": "fp16 sub",
        "link": "https://bugs.example/7",
        "node": "sub",
        "op": "aten::sub",
        "output": 0,
        "figures": {"closeness": float("inf"), "rtol": 0.001},
    }
