"""`backendconf report merge`: one matrix from the reports of several environments, and the flips."""

from __future__ import annotations

import copy
import json

import pytest

from pytest_backendconf.checks import CATEGORIES
from pytest_backendconf.report import OUTCOMES, REPORT_SCHEMA, REPORT_SCHEMA_VERSION
from pytest_backendconf.cli._main import main

SMALL_CNN = "backendconf::parity::small_cnn[float16]"
LINEAR = "backendconf::parity::linear[float32]"
ROUND_TRIP = "backendconf::serialization::round_trip[linear]"
CONV = "backendconf::parity::conv2d_no_bias[float32]"


def make_report(torch="2.13.0+cpu", outcomes=None, backend="mybackend", python="3.11.7", select=()):
    """A report of the documented schema (docs/ci-gating.md) with the given outcome per test id."""
    outcomes = outcomes if outcomes is not None else {SMALL_CNN: "passed", LINEAR: "passed", ROUND_TRIP: "passed"}
    tests = []
    summary = {c: {"total": 0, **{o: 0 for o in OUTCOMES}, "score": None} for c in CATEGORIES}
    for test_id, outcome in outcomes.items():
        category = test_id.split("::")[1]
        failing = outcome in ("failed", "error", "known_failure")
        tests.append(
            {
                "id": test_id,
                "category": category,
                "case": None,
                "stage": "execute",
                "outcome": outcome,
                "duration": 0.1,
                "error": {
                    "type": "OutputSpecError",
                    "module": "pytest_backendconf.errors",
                    "message": "method 'forward' output 0: expected a float16[2, 5] tensor\nmore",
                }
                if failing
                else None,
                "reason": None,
                "known_failure": None,
                "reproduce": f"pytest --backend={backend} '--backendconf-select={test_id}'",
            }
        )
        summary[category]["total"] += 1
        summary[category][outcome] += 1
    for counts in summary.values():
        if counts["total"]:
            counts["score"] = round(counts["passed"] / counts["total"], 6)
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": list(REPORT_SCHEMA_VERSION),
        "backend": {
            "name": backend,
            "source": "entry point",
            "distribution": backend,
            "version": "1.4.0",
            "available": True,
            "unavailable_reason": None,
        },
        "environment": {
            "torch": torch,
            "python": python,
            "python_implementation": "CPython",
            "platform": "Linux-6.1-x86_64-with-glibc2.36",
            "machine": "x86_64",
            "pytest": "9.2.0",
            "pytest_backendconf": "0.1.0",
        },
        "hypothesis": {"profile": "ci", "seed": 1, "derandomized": True},
        "run": {
            "started": "2025-01-31T12:00:00+00:00",
            "duration": 1.0,
            "exit_status": 0,
            "select": list(select),
            "xdist_workers": 0,
        },
        "known_failures": None,
        "summary": summary,
        "errors": {"total": 0, "by_type": {}, "by_stage": {}},
        "tests": tests,
    }


def write(path, document):
    path.write_text(document if isinstance(document, str) else json.dumps(document), encoding="utf-8")
    return str(path)


def merge(capsys, *args):
    code = main(["report", "merge", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def two_versions(tmp_path):
    old = write(tmp_path / "torch213.json", make_report())
    new = write(
        tmp_path / "torch214.json",
        make_report(torch="2.14.1", outcomes={SMALL_CNN: "failed", LINEAR: "passed", ROUND_TRIP: "unsupported"}),
    )
    return old, new


# --- the matrix and the flips -------------------------------------------------------------


def test_matrix_has_a_row_per_environment_and_a_cell_per_category(capsys, two_versions):
    code, out, err = merge(capsys, *two_versions)
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("backend "))
    assert header.split() == ["backend", "environment", *CATEGORIES, "all"]
    old = next(line for line in lines if line.startswith("mybackend") and "2.13.0+cpu" in line)
    new = next(line for line in lines if line.startswith("mybackend") and "2.14.1" in line)
    # parity 2/2 then 1/2; serialization 1/1 then 0/1; categories without checks (ops too) are 0/0
    assert old.split()[3:] == [
        "0/0",
        "2/2",
        "100.0%",
        "0/0",
        "1/1",
        "100.0%",
        "0/0",
        "0/0",
        "0/0",
        "0/0",
        "0/0",
        "0/0",
        "3/3",
        "100.0%",
    ]
    assert new.split()[3:] == [
        *["0/0", "1/2", "50.0%", "0/0", "0/1", "0.0%"],
        *["0/0", "0/0", "0/0", "0/0", "0/0", "0/0", "1/3", "33.3%"],
    ]
    assert lines.index(old) < lines.index(new)  # rows sorted by torch version


def test_a_check_that_passes_in_one_environment_and_fails_in_another_is_a_flip(capsys, two_versions):
    code, out, _ = merge(capsys, *two_versions)
    assert "flips: 1 check passed in one environment and failed in another" in out
    flips = out[out.index("flips:") : out.index("other differences:")]
    assert f"  {SMALL_CNN} (mybackend)" in flips
    assert "    torch 2.13.0+cpu: passed" in flips
    assert (
        "    torch 2.14.1: failed (OutputSpecError: method 'forward' output 0: expected a float16[2, 5] tensor)"
        in flips
    )
    assert LINEAR not in out  # the same outcome everywhere is not listed
    # passed -> unsupported is a difference, not a flip
    others = out[out.index("other differences:") :]
    assert f"{ROUND_TRIP} (mybackend) — torch 2.13.0+cpu: passed; torch 2.14.1: unsupported" in others


def test_fail_on_flips_sets_the_exit_status(capsys, two_versions, tmp_path):
    assert merge(capsys, "--fail-on-flips", *two_versions)[0] == 1
    same = write(tmp_path / "same.json", make_report(torch="2.14.1"))
    assert merge(capsys, "--fail-on-flips", two_versions[0], same)[0] == 0


def test_no_flips_says_so(capsys, two_versions, tmp_path):
    same = write(tmp_path / "same.json", make_report(torch="2.14.1"))
    code, out, _ = merge(capsys, two_versions[0], same)
    assert code == 0
    assert "flips: none (no check passed in one environment and failed in another)" in out
    assert "other differences" not in out


def test_markdown_has_the_matrix_the_flips_and_the_sources(capsys, two_versions, tmp_path):
    target = tmp_path / "matrix.md"
    code, out, _ = merge(capsys, *two_versions, "--markdown", target)
    assert code == 0
    assert f"backendconf: markdown written to {target}" in out
    text = target.read_text()
    assert text.startswith("# Conformance across environments\n")
    # What comes from a report is a code span (docs/security.md): a `|` or a newline in it stays in its cell.
    assert f"| backend | environment | {' | '.join(f'`{c}`' for c in CATEGORIES)} | all |" in text
    assert (
        "| `mybackend` | `torch 2.14.1` | 0/0 | 1/2 50.0% | 0/0 | 0/1 0.0% | 0/0 | 0/0 | 0/0 | 0/0 | 0/0 | 0/0 | 1/3 33.3% |"
        in text
    )
    assert "## Flips (1)" in text
    assert "| check | `torch 2.13.0+cpu` | `torch 2.14.1` |" in text
    assert (
        f"| `{SMALL_CNN}` | passed | **failed** (`OutputSpecError: method 'forward' output 0: "
        "expected a float16[2, 5] tensor`) |"
    ) in text
    assert "## Other differences (1)" in text
    assert f"| `{ROUND_TRIP}` | passed | unsupported |" in text
    assert f"| `mybackend` | `torch 2.13.0+cpu` | `{two_versions[0]}` | `2.13.0+cpu` | `3.11.7` |" in text


def test_backends_are_rows_and_never_compared_with_each_other(capsys, tmp_path):
    ours = write(tmp_path / "a.json", make_report(backend="alpha"))
    theirs = write(tmp_path / "b.json", make_report(backend="beta", outcomes={SMALL_CNN: "failed"}))
    code, out, _ = merge(capsys, ours, theirs)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines() if line.startswith(("alpha", "beta"))] == ["alpha", "beta"]
    assert "flips: none" in out


def test_environments_with_the_same_torch_are_told_apart_by_python(capsys, tmp_path):
    a = write(tmp_path / "a.json", make_report(python="3.10.14"))
    b = write(tmp_path / "b.json", make_report(python="3.12.3", outcomes={SMALL_CNN: "error"}))
    code, out, _ = merge(capsys, a, b)
    assert "    torch 2.13.0+cpu, Python 3.10.14: passed" in out
    assert "    torch 2.13.0+cpu, Python 3.12.3: error (" in out


def test_a_check_missing_from_one_environment_is_not_a_difference(capsys, tmp_path):
    a = write(tmp_path / "a.json", make_report())
    b = write(
        tmp_path / "b.json", make_report(torch="2.14.1", outcomes={SMALL_CNN: "passed"}, select=["parity::small*"])
    )
    code, out, _ = merge(capsys, a, b)
    assert "flips: none" in out and "other differences" not in out
    assert (
        "note: mybackend, torch 2.14.1 ran a selection (parity::small*): its scores cover the selected checks only"
        in out
    )


def test_a_directory_merges_its_json_files(capsys, two_versions, tmp_path):
    (tmp_path / "torch213-junit.xml").write_text("<testsuites/>")
    code, out, _ = merge(capsys, tmp_path)
    assert code == 0
    assert "backendconf: merged 2 reports" in out


def test_a_newer_minor_schema_version_is_read_and_its_new_fields_ignored(capsys, tmp_path):
    document = make_report()
    document["schema_version"] = [REPORT_SCHEMA_VERSION[0], REPORT_SCHEMA_VERSION[1] + 3]
    document["something_new"] = {"x": 1}
    document["tests"][0]["also_new"] = True
    code, _, err = merge(capsys, write(tmp_path / "r.json", document))
    assert code == 0, err


# --- bad input: exit status 1, `backendconf: error:` naming the file ----------------------------


def _with(change):
    document = make_report()
    change(document)
    return document


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "report '{path}' is not valid JSON (Expecting property name enclosed in double quotes"),
        ("[]", "'{path}' is not a backendconf report (it holds a list, not an object)"),
        (json.dumps({"schema": "junit"}), "'{path}' is not a backendconf report (its \"schema\" is 'junit'"),
        (
            _with(lambda d: d.update(schema_version=[REPORT_SCHEMA_VERSION[0] + 1, 0])),
            f"report '{{path}}' has schema version {REPORT_SCHEMA_VERSION[0] + 1}.0; this backendconf reads "
            f"version {REPORT_SCHEMA_VERSION[0]}.x",
        ),
        (
            _with(lambda d: d.update(schema_version="1.0")),
            "report '{path}': \"schema_version\" must be [major, minor], got '1.0'",
        ),
        (_with(lambda d: d.pop("environment")), "report '{path}': environment must be an object, got null or nothing"),
        (_with(lambda d: d["environment"].pop("torch")), "report '{path}': environment.torch must be a string"),
        (
            _with(lambda d: d["summary"]["parity"].update(total="2")),
            "report '{path}': summary.parity.total must be a count",
        ),
        (
            _with(lambda d: d["summary"].update(parity=[])),
            "report '{path}': summary.parity must be an object, got a list",
        ),
        (_with(lambda d: d.update(tests={})), "report '{path}': tests must be a list, got an object"),
        (
            _with(lambda d: d["tests"][1].update(outcome="flaky")),
            f"report '{{path}}': tests[1].outcome ({LINEAR}) is \"flaky\", not one of passed, skipped",
        ),
        (
            _with(lambda d: d["tests"].append(copy.deepcopy(d["tests"][0]))),
            f"report '{{path}}': tests[3]: check '{SMALL_CNN}' is listed twice",
        ),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "other-schema",
        "major-version",
        "version-type",
        "no-environment",
        "no-torch",
        "bad-count",
        "bad-category",
        "tests-not-list",
        "bad-outcome",
        "duplicate-id",
    ],
)
def test_a_bad_report_is_an_error_naming_the_file(capsys, tmp_path, two_versions, content, message):
    bad = write(tmp_path / "bad.json", content)
    code, out, err = merge(capsys, two_versions[0], bad)
    assert code == 1
    assert out == ""
    assert err.startswith("backendconf: error: " + message.format(path=bad)), err


def test_a_missing_report_is_an_error_naming_it(capsys, tmp_path):
    code, _, err = merge(capsys, tmp_path / "missing.json")
    assert code == 1
    assert err == f"backendconf: error: cannot read report '{tmp_path / 'missing.json'}': No such file or directory\n"


def test_a_directory_without_reports_is_an_error(capsys, tmp_path):
    code, _, err = merge(capsys, tmp_path)
    assert code == 1
    assert f"backendconf: error: directory '{tmp_path}' holds no report (*.json)" in err


def test_markdown_into_a_missing_directory_is_an_error(capsys, two_versions, tmp_path):
    code, _, err = merge(capsys, *two_versions, "--markdown", tmp_path / "nowhere" / "m.md")
    assert code == 1
    assert f"the directory '{tmp_path / 'nowhere'}' does not exist; create it first" in err


def test_merge_without_reports_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["report", "merge"])
    assert info.value.code == 2
    assert "the following arguments are required: REPORT" in capsys.readouterr().err


# --- a report written by a real run -------------------------------------------------------------


def test_a_report_from_a_real_run_merges_with_another_environment(capsys, pytester, tmp_path):
    pytest.importorskip("backendconf_reference")
    selected = ["parity::linear*", "serialization::round_trip[[]linear]"]
    report = tmp_path / "real.json"
    # A real pytest run, in this process (a subprocess would only add a torch import).
    proc = pytester.runpytest(
        "--backend=reference",
        "-p",
        "no:cacheprovider",
        "-q",
        *(f"--backendconf-select={s}" for s in selected),
        f"--backendconf-report={report}",
    )
    assert proc.ret == 0, proc.stdout.str()[-3000:] + proc.stderr.str()[-3000:]
    capsys.readouterr()
    real = json.loads(report.read_text())
    ids = [t["id"] for t in real["tests"]]
    assert len(ids) >= 2 and ROUND_TRIP in ids

    # The same run under a (pretend) other torch, where the round trip fails.
    other = copy.deepcopy(real)
    other["environment"]["torch"] = "99.0.0"
    for test in other["tests"]:
        if test["id"] == ROUND_TRIP:
            test.update(
                outcome="failed", verdict="failed", error={"type": "ArchiveError", "module": "x", "message": "boom"}
            )
    other["summary"]["serialization"]["passed"] -= 1
    other["summary"]["serialization"]["failed"] += 1
    code, out, err = merge(capsys, report, write(tmp_path / "other.json", other), "--markdown", tmp_path / "m.md")
    assert code == 0, err
    n = sum(1 for t in real["tests"] if t["category"] == "parity")
    row = next(
        line for line in out.splitlines() if line.startswith("reference") and real["environment"]["torch"] in line
    )
    assert f"{n}/{n} 100.0%" in row
    assert f"{ROUND_TRIP} (reference)" in out
    assert "    torch 99.0.0: failed (ArchiveError: boom)" in out
    assert f"note: reference, torch {real['environment']['torch']} ran a selection" in out


@pytest.mark.slow
@pytest.mark.parametrize("command", [["ops"], ["ops", "--capabilities"], ["merge"]])
def test_report_output_into_a_closed_pipe_ends_quietly(tmp_path, command):
    import os
    import shlex
    import subprocess
    import sys

    ops = {f"backendconf::ops::aten.op{i}.default[float32-sample0]": "passed" for i in range(20_000)}
    path = write(tmp_path / "ops.json", make_report(outcomes={**ops, LINEAR: "failed"}))
    other = write(tmp_path / "other.json", make_report(torch="2.14.1", outcomes={**ops, LINEAR: "passed"}))
    files = [path, other] if command == ["merge"] else [path]
    tool = os.path.join(os.path.dirname(sys.executable), "backendconf")
    done = subprocess.run(
        f"{shlex.quote(tool)} report {' '.join(command)} {' '.join(map(shlex.quote, files))} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert len(done.stdout.splitlines()) == 1
    assert "Traceback" not in done.stderr and "Broken pipe" not in done.stderr, done.stderr


def test_merge_escapes_what_a_report_says(capsys, tmp_path):
    forged = make_report(torch="2.14.1\x1b[2J\nflips: none", outcomes={SMALL_CNN: "failed", LINEAR: "passed"})
    forged["backend"]["version"] = "1.4.0\u202e"
    code, out, _ = merge(capsys, write(tmp_path / "a.json", make_report()), write(tmp_path / "b.json", forged))
    assert code == 0
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b[2J\\nflips: none" in out
    assert [line for line in out.splitlines() if line.startswith("flips:")] == [
        "flips: 1 check passed in one environment and failed in another"
    ]
