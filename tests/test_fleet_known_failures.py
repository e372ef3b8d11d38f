"""A fleet of machines sharing one known-failures file: non-strict entries, and a file written from several reports.

The runs select four fast checks of a backend with two defects (tests/test_gating.py): AVAILABLE passes,
LINEAR and MLP fail with a wrong output dtype, ARITHMETIC is unsupported. A second machine is simulated
by editing a real report's machine header and flipping an outcome, as a run on another CPU would.
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path

import pytest

from pytest_backendconf.cli._main import main
from pytest_backendconf.report import gated_outcome, parse_report, render, separating_when
from pytest_backendconf.report._known_failures import KnownFailure, format_known_failures, load_known_failures

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from test_gating import AVAILABLE, LINEAR, MLP
from test_report_gate import gate, suite, summary_of_gate, summary_of_run, write_known  # noqa: F401

FP16 = {"machine": "x86_64", "cpu_model": "Intel Sapphire Rapids", "cpu_capability": "AVX512"}
EPYC = {"machine": "x86_64", "cpu_model": "AMD EPYC", "cpu_capability": "AVX512"}


# --- strict = false: read, checked, written back -----------------------------------


def test_a_non_strict_entry_is_read_and_written_back_as_written(tmp_path):
    path = write_known(
        tmp_path / "known.toml", '"parity::a[float16]" = { reason = "fp16 GEMM differs by CPU", strict = false }'
    )
    [entry] = load_known_failures(path, "--backendconf-known-failures")
    assert entry.strict is False and entry.as_json()["strict"] is False
    text = format_known_failures([entry], "x")
    assert "strict = false" in text
    path.write_text(text)
    assert load_known_failures(path, "--backendconf-known-failures") == [entry]
    assert "strict" not in KnownFailure("p", "r").as_json()  # a strict entry is written as before


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (
            '{ strict = "false", reason = "r" }',
            "(line 2): strict must be true or false (without quotes), not 'false'",
        ),
        (
            "{ strict = false }",
            "(line 2): strict = false lets its check pass or fail without failing the run, so it needs a reason "
            "saying why the outcome varies",
        ),
        ('{ strict = false, reason = "  " }', "so it needs a reason saying why the outcome varies"),
    ],
)
def test_a_bad_strict_is_a_usage_error_naming_the_file_the_entry_and_the_fix(tmp_path, entry, says):
    path = write_known(tmp_path / "known.toml", '"parity::b" = { reason = "ok" }', f'"parity::a[float16]" = {entry}')
    with pytest.raises(pytest.UsageError) as info:
        load_known_failures(path, "--backendconf-known-failures")
    assert f"{path}: entry 'parity::a[float16]'" in str(info.value)
    assert says in str(info.value)


def test_a_non_strict_pass_is_a_pass_and_its_failure_a_known_failure():
    assert gated_outcome("passed", True, strict=False) == "passed"
    assert gated_outcome("failed", True, strict=False) == "known_failure"
    assert gated_outcome("passed", True) == "unexpected_pass"


def test_a_non_strict_entry_may_pass_or_fail_and_is_counted_apart_in_the_run_the_report_and_the_gate(
    suite,  # noqa: F811
    pytester,
    capsys,
):
    known = write_known(
        pytester.path / "known.toml",
        f'"{LINEAR}" = {{ reason = "float64 outputs" }}',
        f'"{MLP}" = {{ reason = "float64 outputs; varies by CPU", strict = false }}',
        f'"{AVAILABLE}" = {{ reason = "flaky on some CPUs", strict = false }}',
    )
    run = suite(f"--backendconf-known-failures={known}", "--backendconf-report=report.json")
    assert run.ret == pytest.ExitCode.OK
    run.assert_outcomes(xfailed=2, xpassed=1, skipped=1)
    line = "backendconf: 3 known failures, 2 of them non-strict (1 passed here, which does not fail the run)"
    assert line in run.stdout.lines
    document = json.loads((pytester.path / "report.json").read_text())
    assert document["known_failures"]["non_strict"] == 2
    assert document["known_failures"]["non_strict_passed"] == 1
    [available] = [t for t in document["tests"] if t["id"] == AVAILABLE]
    assert available["outcome"] == "passed" and available["known_failure"]["strict"] is False
    assert f"{known} (3 entries; 2 checks non-strict, 1 passed)" in html.unescape(
        render([parse_report(document, "report.json")])
    )

    # `report gate` decides the same with the same file, and prints the same summary.
    status, lines = gate(capsys, pytester.path / "report.json", known)
    assert status == 0 and line in lines
    assert summary_of_gate(lines) == summary_of_run(run.stdout.lines)
    # The same entries strict: the pass is an unexpected pass, in the gate as in a run.
    strict = write_known(pytester.path / "strict.toml", *known.read_text().replace(", strict = false", "").splitlines())
    status, lines = gate(capsys, pytester.path / "report.json", strict)
    assert status == 1 and not any("non-strict" in x for x in lines)

    # Files written from the run and from its report keep the non-strict entries as written.
    rewritten = pytester.path / "rewritten.toml"
    suite(f"--backendconf-known-failures={known}", f"--backendconf-write-known-failures={rewritten}")
    assert (
        main(["report", "known-failures", str(pytester.path / "report.json"), "-o", str(pytester.path / "r.toml")]) == 0
    )
    for path in (rewritten, pytester.path / "r.toml"):
        entries = tomllib.loads(path.read_text())
        assert entries[AVAILABLE] == {"reason": "flaky on some CPUs", "link": "", "strict": False}, path
        assert entries[MLP]["strict"] is False and "strict" not in entries[LINEAR]


# --- report known-failures over several machines -----------------------------------


def test_the_narrowest_machine_field_that_separates_failing_from_passing_machines():
    fails = [{**FP16, "cpu_flags": ["avx2", "avx512_fp16", "avx512f", "amx_tile"]}]
    passes = [{**EPYC, "cpu_flags": ["avx2", "avx512f"]}, {**EPYC, "cpu_flags": ["avx2", "avx512f", "amx_tile"]}]
    assert separating_when(fails, passes) == (("cpu_flags", ("avx512_fp16",)),)
    # No flag apart, but torch's capability is: it is chosen; then the architecture.
    avx2 = {**EPYC, "cpu_capability": "AVX2", "cpu_flags": ["avx2"]}
    assert separating_when([avx2], [{**EPYC, "cpu_flags": ["avx2"]}]) == (("cpu_capability", "AVX2"),)
    arm = {"machine": "aarch64", "cpu_capability": "DEFAULT", "cpu_flags": []}
    assert separating_when([arm], [{**EPYC, "cpu_capability": "DEFAULT", "cpu_flags": []}]) == (("machine", "aarch64"),)
    # Two flags together, where neither alone separates.
    both = [{**EPYC, "cpu_flags": ["a_flag", "b_flag"]}]
    apart = [{**EPYC, "cpu_flags": ["a_flag"]}, {**EPYC, "cpu_flags": ["b_flag"]}]
    assert separating_when(both, apart) == (("cpu_flags", ("a_flag", "b_flag")),)
    # Nothing separates two identical machines.
    assert separating_when([{**EPYC, "cpu_flags": ["avx2"]}], [{**EPYC, "cpu_flags": ["avx2"]}]) is None


def _second_machine(report: Path, target: Path, machine: dict, flip: dict[str, str]) -> Path:
    """``report`` as a run on ``machine`` would have written it, with the outcomes in ``flip`` changed."""
    document = json.loads(report.read_text())
    document["environment"].update(machine)
    for test in document["tests"]:
        if test["id"] in flip:
            test["outcome"] = test["verdict"] = test["check_outcome"] = flip[test["id"]]
            test["error"] = None
    target.write_text(json.dumps(document))
    return target


def test_reports_of_two_machines_give_one_file_scoped_to_where_checks_fail_green_on_both(suite, pytester, capsys):  # noqa: F811
    run = suite("--backendconf-report=a.json")
    assert run.ret == 1  # LINEAR and MLP fail on this machine
    a = pytester.path / "a.json"
    _second_machine(a, a, {**FP16, "cpu_flags": ["avx2", "avx512_fp16", "avx512f"]}, {})
    # The other machine: LINEAR passes there, MLP still fails, AVAILABLE fails there only.
    other = {**EPYC, "cpu_capability": "AVX2", "cpu_flags": ["avx2", "avx512f"]}
    b = _second_machine(a, pytester.path / "b.json", other, {LINEAR: "passed", AVAILABLE: "failed"})
    known = pytester.path / "known.toml"
    capsys.readouterr()
    assert main(["report", "known-failures", str(a), str(b), "-o", str(known)]) == 0
    out = capsys.readouterr().out
    entries = tomllib.loads(known.read_text())
    assert set(entries) == {LINEAR, MLP, AVAILABLE}
    assert "when" not in entries[MLP] and "strict" not in entries[MLP]  # fails everywhere: a plain entry
    assert entries[LINEAR]["when"] == {"cpu_flags": ["avx512_fp16"]}
    # It fails on b only, whose flags a has too: torch's CPU capability tells them apart.
    assert entries[AVAILABLE]["when"] == {"cpu_capability": "AVX2"}
    assert f"backendconf: {LINEAR}: fails on a.json (x86_64, Intel Sapphire Rapids" in out
    assert 'scoped to where it fails, when = { cpu_flags = ["avx512_fp16"] }' in out
    assert 'scoped to where it fails, when = { cpu_capability = "AVX2" }' in out

    # The one file gates both machines' reports green.
    for report in (a, b):
        status, lines = gate(capsys, report, known)
        assert status == 0, lines
        assert "scoped to other machines, not applied there" in "\n".join(lines)


def test_machines_no_field_separates_get_a_non_strict_entry_naming_them_and_stay_green(suite, pytester, capsys):  # noqa: F811
    suite("--backendconf-report=a.json")
    a = pytester.path / "a.json"
    same = json.loads(a.read_text())["environment"]
    machine = {k: same[k] for k in ("machine", "cpu_model", "cpu_capability", "cpu_flags")}
    b = _second_machine(a, pytester.path / "b.json", machine, {LINEAR: "passed"})
    known = pytester.path / "known.toml"
    capsys.readouterr()
    assert main(["report", "known-failures", str(a), str(b), "-o", str(known)]) == 0
    out = capsys.readouterr().out
    entry = tomllib.loads(known.read_text())[LINEAR]
    assert entry["strict"] is False and "when" not in entry
    assert "fails on a.json (" in entry["reason"] and "passes on b.json (" in entry["reason"]
    assert f"{LINEAR}: fails on a.json" in out and "no machine field separates them, written with strict = false" in out
    for report in (a, b):
        status, lines = gate(capsys, report, known)
        assert status == 0, lines
        assert "backendconf: 2 known failures, 1 of them non-strict" in "\n".join(lines)
    # Written again from the same reports, the file is the same (the reason is not said twice).
    text = known.read_text()
    assert main(["report", "known-failures", str(a), str(b), "-o", str(known)]) == 0
    assert known.read_text() == text


def test_reports_of_different_backends_are_refused(suite, pytester, capsys):  # noqa: F811
    suite("--backendconf-report=a.json")
    a = pytester.path / "a.json"
    document = json.loads(a.read_text())
    document["backend"]["name"] = "another"
    b = pytester.path / "b.json"
    b.write_text(json.dumps(document))
    known = pytester.path / "known.toml"
    assert main(["report", "known-failures", str(a), str(b), "-o", str(known)]) != 0
    err = capsys.readouterr().err
    assert "the reports are of different backends (another, no_mul_wrong_dtype)" in err
    assert not known.exists()
