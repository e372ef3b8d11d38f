"""CI gating: known failures (strict, stale, bad files, the ratchet), the JSON report, the summary, JUnit
(under xdist: tests/test_xdist.py).

Each run selects a few fast checks with --backendconf-select so that the
whole file stays quick; the backends are the reference backend with one
defect each (see broken_backends.py).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest

import pytest_backendconf as bc
from pytest_backendconf.checks import id_matches
from pytest_backendconf.report._known_failures import (
    KnownFailure,
    KnownFailureIndex,
    format_known_failures,
    load_known_failures,
    merge_known_failures,
)
from pytest_backendconf.report import ReportTest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TESTS = Path(__file__).parent

CONFTEST = textwrap.dedent(
    f"""
    import sys
    sys.path.insert(0, {str(TESTS)!r})

    import torch
    from backendconf_reference import ReferenceBackend
    from broken_backends import WrongOutputDtype

    import pytest_backendconf as bc


    class NoMul(ReferenceBackend):
        '''Rejects aten.mul.Tensor: the models using it are unsupported.'''

        name = "no_mul"

        def preprocess(self, program, compile_spec, debug_handles):
            for node in program.graph.nodes:
                if node.op == "call_function" and node.target is torch.ops.aten.mul.Tensor:
                    raise bc.UnsupportedNodeError(node, "this device has no multiplier")
            return super().preprocess(program, compile_spec, debug_handles)


    class NoMulWrongDtype(NoMul, WrongOutputDtype):
        name = "no_mul_wrong_dtype"


    class Float32Only(ReferenceBackend):
        '''Declares less than the reference backend: its scores cover fewer checks.'''

        name = "float32_only"
        capabilities = bc.Capabilities(dtypes={{torch.float32}}, tolerances={{torch.float32: (1e-5, 1e-6)}})


    def backendconf_register_backends(register):
        register(WrongOutputDtype())  # name "wrong_dtype"
        register(NoMul())
        register(NoMulWrongDtype())
        register(Float32Only())
    """
)

# Fast checks: the first passes everywhere, the second fails with a wrong output dtype,
# the third is unsupported without aten.mul.
AVAILABLE = "backendconf::contract::is_available_is_a_stable_bool"
LINEAR = "backendconf::parity::linear[float32]"
ARITHMETIC = "backendconf::parity::arithmetic_tensors[float32]"
MLP = "backendconf::parity::mlp[float32]"


def select(*ids: str) -> list[str]:
    # A `[` in a select pattern opens an fnmatch class; `?` stands in for the brackets.
    return [f"--backendconf-select={i}" for i in ids]


@pytest.fixture
def suite(pytester):
    """Run the suite in a pytester folder whose conftest registers the broken backends."""
    pytester.makeconftest(CONFTEST)

    def run(backend: str, *args: str):
        return pytester.runpytest(
            f"--backend={backend}", "--backendconf-hypothesis=ci", "-p", "no:cacheprovider", *args
        )

    return run


def expect(output: pytest.LineMatcher, patterns: list[str]) -> None:
    """``output.fnmatch_lines(patterns)`` with literal brackets (test ids have them); ``*`` stays a wildcard."""
    output.fnmatch_lines([p.replace("[", "[[]") for p in patterns])


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# --- matching and merging (no pytest run) ----------------------------------------


def test_an_exact_id_with_brackets_matches_itself_and_patterns_match_with_or_without_the_prefix():
    assert id_matches(LINEAR, LINEAR)
    assert id_matches(LINEAR, "parity::linear[float32]")
    assert id_matches(LINEAR, "parity::linear*")
    assert id_matches(LINEAR, "backendconf::parity::*")
    assert not id_matches(LINEAR, "parity::linear[float16]")
    assert not id_matches(LINEAR, "contract::*")


def result(test_id: str, outcome: str, message: str = "boom") -> ReportTest:
    error = {"type": "RuntimeError", "module": "builtins", "message": message} if outcome == "failed" else None
    verdict = {"known_failure": "failed", "unexpected_pass": "passed"}.get(outcome, outcome)
    return ReportTest(test_id, "parity", outcome, verdict, stage="execute", reproduce="pytest …", error=error)


def test_merging_keeps_what_still_holds_and_drops_what_passes():
    existing = [
        KnownFailure("parity::a*", "a is broken", "https://bugs/1"),  # every match still fails: kept as written
        KnownFailure("parity::b*", "b is broken", "https://bugs/2"),  # one match passes: split up
        KnownFailure("parity::outside_the_run", "not run today"),  # not run, still a check: kept
        KnownFailure("parity::renamed", "gone"),  # matches no check: dropped
    ]
    results = [
        result("backendconf::parity::a[float32]", "failed"),
        result("backendconf::parity::a[float16]", "known_failure"),
        result("backendconf::parity::b[float32]", "passed"),
        result("backendconf::parity::b[float16]", "failed"),
        result("backendconf::parity::c[float32]", "failed", "c differs\nsecond line"),
        result("backendconf::parity::d[float32]", "unsupported"),
    ]
    merged = merge_known_failures(results, existing, stale={"parity::renamed"})
    assert [(e.pattern, e.reason, e.link) for e in merged] == [
        ("backendconf::parity::b[float16]", "b is broken", "https://bugs/2"),
        ("backendconf::parity::c[float32]", "RuntimeError: c differs", ""),
        ("parity::a*", "a is broken", "https://bugs/1"),
        ("parity::outside_the_run", "not run today", ""),
    ]


@pytest.mark.slow
def test_the_index_finds_the_entry_a_scan_of_every_entry_finds(tmp_path):
    # 16,000 entries (what a vendor's file of every failing ops sample can reach) load in one pass
    # and are looked up without trying each; benchmarks/ measures the time (docs/ci-gating.md).
    lines = [f'"backendconf::ops::aten.op{i}.default[float16-sample0]" = {{ reason = "r{i}" }}' for i in range(16_000)]
    lines += ['"parity::lin*" = { reason = "glob" }', '"*[[]float16]" = { reason = "any float16" }']
    lines += ['"backendconf::parity::linear[float32]" = { reason = "exact, after the glob" }']
    path = tmp_path / "known.toml"
    path.write_text("# header\n" + "\n".join(lines) + "\n")
    entries = load_known_failures(path, "--backendconf-known-failures")
    assert len(entries) == 16_003 and entries[0].line == 2 and entries[-1].line == 16_004
    index = KnownFailureIndex(entries)

    def scan(test_id, *exact):
        return next((e for e in entries if e.pattern in exact), None) or next(
            (e for e in entries if e.matches(test_id)), None
        )

    for test_id in [
        "backendconf::ops::aten.op15999.default[float16-sample0]",
        "backendconf::ops::aten.op7.default[float32-sample0]",
        "backendconf::parity::linear[float32]",
        "backendconf::parity::linear[float16]",
        "backendconf::parity::small_cnn[float16]",
        "backendconf::contract::preprocess_returns_bytes[linear]",
    ]:
        name = test_id.removeprefix("backendconf::")
        assert index.entry_for(test_id, test_id, name) == scan(test_id, test_id, name), test_id
    assert index.entry_for(LINEAR, LINEAR, "parity::linear[float32]").reason == "exact, after the glob"
    assert index.entry_for("backendconf::parity::linear[float16]").reason == "glob"  # first in file order
    assert index.entry_for("backendconf::ops::aten.x.default[float32-sample0]") is None


def test_a_written_file_reads_back_whatever_the_reasons_contain():
    odd = 'quote " backslash \\ newline \n tab \t del \x7f unicode µ'
    entries = [KnownFailure(LINEAR, odd, "https://b/1"), KnownFailure("contract::*", "plain")]
    text = format_known_failures(entries, "mybackend")
    assert tomllib.loads(text) == {
        "contract::*": {"reason": "plain", "link": ""},
        LINEAR: {"reason": odd, "link": "https://b/1"},
    }
    assert text.index(LINEAR) < text.index('"contract::*"')  # sorted by key


# --- known failures ----------------------------------------------------------------


def test_a_listed_failure_is_a_known_failure_and_a_listed_pass_fails_the_run_naming_the_entry(suite, pytester):
    known = write(
        pytester.path / "known.toml",
        f"""
        "{LINEAR}" = {{ reason = "float64 outputs", link = "https://bugs.example/7" }}
        "contract::is_available*" = {{ reason = "was flaky" }}
        """,
    )
    result = suite("wrong_dtype", *select(LINEAR, AVAILABLE), f"--backendconf-known-failures={known}", "-rx")
    result.assert_outcomes(xfailed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    expect(
        result.stdout,
        [
            f"{AVAILABLE} passed, but it is listed as a known failure: entry 'contract::is_available*' in "
            f"*known.toml (reason: was flaky). Backend 'wrong_dtype' passes it now: narrow the entry's pattern, "
            f"or rewrite the file with --backendconf-write-known-failures=*known.toml.",
            f"reproduce: pytest --backend=wrong_dtype --backendconf-select={AVAILABLE} --backendconf-hypothesis=ci",
        ],
    )
    expect(result.stdout, [f"XFAIL {LINEAR} - known failure: float64 outputs (https://bugs.example/7)"])
    expect(result.stdout, ["backendconf: known failures from *known.toml (2 entries)"])


def test_a_stale_entry_warns_but_not_an_entry_outside_the_selection(suite, pytester):
    known = write(
        pytester.path / "known.toml",
        f"""
        "{LINEAR}" = {{ reason = "not selected in this run, still a check" }}
        "parity::no_such_model[float32]" = {{ reason = "renamed long ago" }}
        """,
    )
    result = suite("reference", *select(AVAILABLE), f"--backendconf-known-failures={known}")
    result.assert_outcomes(passed=1, warnings=1)
    expect(
        result.stdout,
        [
            "*known.toml:2: StaleKnownFailureWarning: known-failures entry 'parity::no_such_model[float32]' "
            "matches no conformance check of backend 'reference' (renamed or removed?): "
            "fix its pattern or remove it from *known.toml"
        ],
    )
    assert "linear" not in result.stdout.str()


def test_under_the_quick_ops_selection_an_entry_of_the_default_matrix_is_not_stale(suite, pytester):
    # A file recorded with the default matrix, run with the quick one (float32 and float16, first
    # sample): its bfloat16 and second-sample entries name real checks; a sample that exists in no
    # selection is stale.
    known = write(
        pytester.path / "known.toml",
        """
        "ops::aten.add.Tensor[[]bfloat16-sample0]" = { reason = "default matrix only" }
        "ops::aten.add.Tensor[[]float32-sample1]" = { reason = "default matrix only" }
        "ops::aten.add.Tensor[[]float32-sample7]" = { reason = "no such sample" }
        """,
    )
    result = suite("reference", *select(AVAILABLE), "--backendconf-ops=quick", f"--backendconf-known-failures={known}")
    result.assert_outcomes(passed=1, warnings=1)
    expect(
        result.stdout,
        [
            "*known.toml:3: StaleKnownFailureWarning: known-failures entry 'ops::aten.add.Tensor*float32-sample7]' matches*"
        ],
    )
    assert "sample0]' matches" not in result.stdout.str() and "sample1]' matches" not in result.stdout.str()


BAD_FILES = {
    "invalid TOML": (
        "backendconf::parity::linear[float32] = { reason = 'x' }\n",
        "*known.toml is not valid TOML: *. Each entry is one line, with the test id quoted as a key: "
        '"backendconf::parity::small_cnn[float16]" = { reason = "why it fails", link = *',
    ),
    "not a table": (
        '"parity::linear[float32]" = "float64 outputs"\n',
        "*known.toml: entry 'parity::linear[float32]' is a str, not a table. Write it as "
        '"parity::linear[float32]" = { reason = "why it fails", link = "issue URL" }',
    ),
    "no reason": (
        '"parity::linear[float32]" = { link = "https://bugs/1" }\n',
        "*known.toml: entry 'parity::linear[float32]' has no reason; add reason = \"why it fails\"*",
    ),
    "unknown key": (
        '"parity::linear[float32]" = { reason = "x", issue = "https://bugs/1" }\n',
        "*known.toml: entry 'parity::linear[float32]' has unknown key(s) 'issue'; an entry has only "
        "`reason` (required), `link`, `when` and `strict`, and what it records of its failure: `node`, `op`, "
        "`output` and `figures` (all optional).",
    ),
    "dotted key": (
        'parity.linear = { reason = "x" }\n',
        "*entry 'parity' has unknown key(s) 'linear'; *a test id with dots must be quoted whole*",
    ),
    "link not a string": (
        '"parity::linear[float32]" = { reason = "x", link = 7 }\n',
        "*known.toml: entry 'parity::linear[float32]': link must be a string (an issue URL, or \"\"), not 7.",
    ),
    "deeply nested": (
        "x = " + "[" * 5000 + "]" * 5000 + "\n",
        "*known.toml: its arrays or tables nest too deeply to read; a known-failures file is one level of entries*",
    ),
    "a pattern too long to match": (
        '"' + "[" * 20_000 + '" = { reason = "x" }\n',
        "*known.toml: entry '[[[[*'…: the pattern is 20000 characters long; at most 1000 are read*",
    ),
}


@pytest.mark.parametrize("content, message", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_known_failures_file_is_a_usage_error_naming_the_file_the_entry_and_the_fix(
    suite, pytester, content, message
):
    known = write(pytester.path / "known.toml", content)
    result = suite("reference", f"--backendconf-known-failures={known}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    expect(result.stderr, [f"ERROR: *{message}"])


def test_a_missing_known_failures_file_says_how_to_write_one(suite):
    result = suite("reference", "--backendconf-known-failures=nope.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    expect(
        result.stderr,
        [
            "ERROR: --backendconf-known-failures=*nope.toml: the file does not exist. Fix the path, or write "
            "the file from a run with --backendconf-write-known-failures=*nope.toml."
        ],
    )


def test_an_output_file_in_a_missing_folder_is_a_usage_error(suite):
    result = suite("reference", "--backendconf-report=no/such/folder/report.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    expect(
        result.stderr,
        [
            "ERROR: --backendconf-report 'no/such/folder/report.json': the directory '*/no/such/folder' does not "
            "exist; create it first"
        ],
    )


def test_an_output_file_that_is_a_directory_is_a_usage_error(suite, pytester):
    (pytester.path / "known").mkdir()
    result = suite("reference", "--backendconf-write-known-failures=known")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    expect(
        result.stderr,
        ["ERROR: --backendconf-write-known-failures 'known': that is a directory; give a file name in it"],
    )


def test_standard_output_is_refused_for_the_suites_files(suite):
    # pytest writes its own output there: a report mixed into it could not be read back.
    result = suite("reference", "--backendconf-html=-")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    expect(
        result.stderr,
        ["ERROR: --backendconf-html '-': that is standard output, which carries pytest's own output; give a file name"],
    )


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_the_report_is_written_through_a_symlink(suite, pytester):
    target = pytester.path / "ci" / "report.json"
    target.parent.mkdir()
    (pytester.path / "report.json").symlink_to(target)
    result = suite("reference", *select(AVAILABLE), "--backendconf-report=report.json")
    assert result.ret == pytest.ExitCode.OK
    assert (pytester.path / "report.json").is_symlink()
    assert [t["id"] for t in json.loads(target.read_text())["tests"]] == [AVAILABLE]


def test_the_written_file_makes_the_next_run_pass_and_ratchets_when_the_backend_is_fixed(suite, pytester):
    known = pytester.path / "known.toml"
    first = suite("wrong_dtype", *select(LINEAR, AVAILABLE), f"--backendconf-write-known-failures={known}")
    first.assert_outcomes(passed=1, failed=1)
    expect(first.stdout, [f"backendconf: wrote 1 known failure to {known} (1 added, 0 removed)"])
    written = tomllib.loads(known.read_text())
    assert list(written) == [LINEAR]
    assert written[LINEAR]["reason"].startswith(
        "OutputSpecError: method 'forward' output 0: expected a float32[3, 4] tensor, got a float64[3, 4] tensor"
    )
    assert written[LINEAR]["link"] == ""
    assert not [p for p in pytester.path.iterdir() if p.name.endswith(".tmp")]

    # A person adds the link; rewriting from a run where it still fails keeps it.
    known.write_text(known.read_text().replace('link = ""', 'link = "https://bugs.example/7"'))
    again = suite(
        "wrong_dtype",
        *select(LINEAR, AVAILABLE),
        f"--backendconf-known-failures={known}",
        f"--backendconf-write-known-failures={known}",
    )
    again.assert_outcomes(passed=1, xfailed=1)
    assert again.ret == pytest.ExitCode.OK
    assert tomllib.loads(known.read_text())[LINEAR]["link"] == "https://bugs.example/7"

    # The defect is fixed (the reference backend): the run fails until the entry goes, and the rewrite drops it.
    fixed = suite(
        "reference",
        *select(LINEAR),
        f"--backendconf-known-failures={known}",
        f"--backendconf-write-known-failures={known}",
    )
    fixed.assert_outcomes(failed=1)
    expect(fixed.stdout, [f"backendconf: wrote 0 known failures to {known} (0 added, 1 removed)"])
    assert tomllib.loads(known.read_text()) == {}


# --- the report and the summary --------------------------------------------------------------


def test_the_report_and_the_summary_count_every_outcome(suite, pytester):
    known = write(
        pytester.path / "known.toml", f'"{LINEAR}" = {{ reason = "float64 outputs", link = "https://b/7" }}\n'
    )
    result = suite(
        "no_mul_wrong_dtype",
        *select(AVAILABLE, LINEAR, ARITHMETIC, MLP),
        f"--backendconf-known-failures={known}",
        "--backendconf-report=report.json",
    )
    result.assert_outcomes(passed=1, xfailed=1, skipped=1, failed=1)
    expect(
        result.stdout,
        [
            "*= backendconf: conformance of backend 'no_mul_wrong_dtype' =*",
            "contract       1/1 passed (100.0%); 0 unsupported, 0 known failures, 0 failed — score = passed / all 1",
            "parity         0/3 passed (0.0%); 1 unsupported, 1 known failure, 1 failed — score = passed / all 3",
            "compile errors: 1 not claimed by the backend (unsupported), 0 compiler failures on claimed nodes "
            "(failed), 0 undecided (no node named: the harness could not tell)",
            "",
            "to reproduce a failure, run its command:",
            f"FAILED {MLP}: pytest --backend=no_mul_wrong_dtype '--backendconf-select={MLP}' --backendconf-hypothesis=ci",
            f"backendconf: report written to {pytester.path / 'report.json'}",
        ],
    )
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["schema"] == "backendconf-report"
    assert report["schema_version"] == [1, 9]
    capabilities = report["backend"].pop("capabilities")
    assert report["backend"] == {
        "name": "no_mul_wrong_dtype",
        "source": f"conftest {pytester.path / 'conftest.py'}",
        "distribution": None,
        "version": None,
        "available": True,
        "unavailable_reason": None,
        "not_under_test": [],
    }
    assert {"float32", "float16", "bfloat16"} <= set(capabilities["dtypes"])
    assert capabilities["thread_safe"] is True and capabilities["fault_injection"] is True
    assert capabilities["host_only_modules"] == ["backendconf_reference.compiler"]
    # Every declared field is listed, the flags as declared.
    assert set(capabilities) == {f.name for f in dataclasses.fields(bc.Capabilities)}
    assert capabilities["dynamic_shapes"] is True and capabilities["batch_ops"] is None
    import torch

    assert report["environment"]["torch"] == torch.__version__
    assert report["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["hypothesis"]["profile"] == "ci" and report["hypothesis"]["derandomized"] is True
    assert isinstance(report["hypothesis"]["seed"], int)
    assert report["run"]["exit_status"] == 1 and report["run"]["xdist_workers"] == 0
    assert report["run"]["duration"] > 0
    assert report["known_failures"] == {
        "file": str(known),
        "entries": 1,
        "stale": [],
        "non_strict": 0,
        "non_strict_passed": 0,
    }

    tests = {t["id"]: t for t in report["tests"]}
    assert list(tests) == [AVAILABLE, ARITHMETIC, LINEAR, MLP]  # collection order
    assert {i: t["outcome"] for i, t in tests.items()} == {
        AVAILABLE: "passed",
        LINEAR: "known_failure",
        ARITHMETIC: "unsupported",
        MLP: "failed",
    }
    assert tests[AVAILABLE] == {
        "id": AVAILABLE,
        "category": "contract",
        "case": None,
        "stage": "is_available",
        "outcome": "passed",
        "verdict": "passed",
        "duration": tests[AVAILABLE]["duration"],
        "error": None,
        "reason": None,
        "known_failure": None,
        "reproduce": f"pytest --backend=no_mul_wrong_dtype --backendconf-select={AVAILABLE} --backendconf-hypothesis=ci",
        "rerun": None,  # only failures have one
        "numerics": None,  # only comparisons (parity, ops) measure closeness
        "reproduction": None,  # only failures are shrunk (and the project's tests turn it off)
        "check_outcome": "passed",
    }
    # The check's own verdict: a known failure failed, a rejection is unsupported.
    assert {i: t["check_outcome"] for i, t in tests.items()} == {
        AVAILABLE: "passed",
        LINEAR: "failed",
        ARITHMETIC: "unsupported",
        MLP: "failed",
    }
    # The test's verdict before known failures applied, beside its gated outcome: a gate starts from it.
    assert {i: t["verdict"] for i, t in tests.items()} == {
        AVAILABLE: "passed",
        LINEAR: "failed",
        ARITHMETIC: "unsupported",
        MLP: "failed",
    }
    assert tests[LINEAR]["known_failure"] == {"pattern": LINEAR, "reason": "float64 outputs", "link": "https://b/7"}
    assert tests[LINEAR]["error"]["type"] == "OutputSpecError"
    assert tests[MLP]["case"] == "mlp" and tests[MLP]["stage"] == "execute"
    assert tests[MLP]["error"] == {
        "type": "OutputSpecError",
        "module": "pytest_backendconf.errors",
        "message": "method 'forward' output 0: expected a float32[4, 3] tensor, got a float64[4, 3] tensor "
        "from backend 'no_mul_wrong_dtype'",
    }
    # Every failure, known ones too, has its rerun command: the saved comparison's, as a field of its own.
    for failing in (LINEAR, MLP):
        assert tests[failing]["rerun"].startswith("python -m pytest_backendconf.rerun "), tests[failing]
        assert tests[failing]["rerun"].endswith(".safetensors --backend=no_mul_wrong_dtype")
    assert tests[ARITHMETIC]["rerun"] is None
    assert tests[ARITHMETIC]["error"] is None
    assert "aten::mul" in tests[ARITHMETIC]["reason"] and "this device has no multiplier" in tests[ARITHMETIC]["reason"]

    assert report["summary"]["parity"] == {
        "total": 3,
        "passed": 0,
        "skipped": 0,
        "unsupported": 1,
        "known_failure": 1,
        "unexpected_pass": 0,
        "failed": 1,
        "error": 0,
        "not_needed": 0,
        "scored": 3,
        "score": 0.0,
    }
    assert report["summary"]["contract"]["score"] == 1.0
    assert report["summary"]["reliability"]["total"] == 0 and report["summary"]["reliability"]["score"] is None
    assert report["errors"] == {
        "total": 2,
        "by_type": {"OutputSpecError": 2},
        "by_stage": {"execute": 2},
        "compile_errors": {"unsupported": 1, "compiler_failure": 0, "undecided": 0},
    }


def test_the_report_and_the_summary_say_what_the_declaration_left_out(suite, pytester):
    result = suite("float32_only", *select(AVAILABLE), "--backendconf-report=report.json")
    result.assert_outcomes(passed=1)
    expect(
        result.stdout,
        [
            "contract       1/1 passed*",
            "not under test (as declared): dtypes float16, bfloat16 (not in Capabilities.dtypes); calls from "
            "several threads (thread_safe=False); runtime symbolication by fault injection (fault_injection=False)",
        ],
    )
    backend = json.loads((pytester.path / "report.json").read_text())["backend"]
    assert backend["capabilities"] == {
        "supported_ops": None,
        "dtypes": ["float32"],
        "tolerances": {"float32": [1e-05, 1e-06]},
        "host_only_modules": [],
        "thread_safe": False,
        "fault_injection": False,
        "dynamic_shapes": True,
        "target_runtime_modules": [],
        "batch_ops": None,
        "keeps_state": False,
    }
    assert backend["not_under_test"][0] == "dtypes float16, bfloat16 (not in Capabilities.dtypes)"
