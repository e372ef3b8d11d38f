"""The check vocabulary's room: importable without torch or pytest, and its one outcome record's serializers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytest_backendconf.checks import CHECK_OUTCOMES, CheckOutcome, outcome_from_json, outcome_to_json, reason_text


def test_the_check_vocabulary_imports_neither_torch_nor_pytest():
    code = (
        "import sys, json\n"
        "import pytest_backendconf.checks as c\n"
        "c.outcome_from_json(c.outcome_to_json(c.CheckOutcome('unsupported', 'x')))\n"
        "print(json.dumps(sorted(m for m in ('torch', 'pytest', '_pytest') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_an_outcome_survives_its_serializers_and_json_but_its_exception_stays_home():
    outcome = CheckOutcome(
        "failed",
        "max abs error 0.5 > 1e-05",
        details={"numerics": {"max_abs": 0.5}},
        error={"type": "CheckFailed", "module": "pytest_backendconf.checks._check", "message": "max abs"},
        seconds=0.25,
        ended={"returncode": -11, "timed_out": None, "killed_because": None},
        stderr="segfault\n",
        warnings=({"category": "UserWarning", "module": "builtins", "message": "w", "filename": "f", "lineno": 1},),
        rerun="python -m pytest_backendconf.rerun inputs.safetensors --backend=x",
        exception=RuntimeError("here only"),
    )
    data = json.loads(json.dumps(outcome_to_json(outcome)))
    assert "exception" not in data
    back = outcome_from_json(data)
    assert back == outcome and back.exception is None
    assert outcome_to_json(CheckOutcome("passed")) == {"outcome": "passed"}


def test_the_outcomes_are_the_literal_and_only_skips_have_words_for_the_terminal():
    assert CHECK_OUTCOMES == ("passed", "failed", "unsupported", "not_needed", "skipped")
    assert reason_text(CheckOutcome("unsupported", "no mul")) == "unsupported: no mul"
    assert reason_text(CheckOutcome("not_needed", "lowered whole")) == "not needed: lowered whole"
    assert reason_text(CheckOutcome("skipped", "no /proc")) == "no /proc"
    with pytest.raises(ValueError, match="one of passed, failed, unsupported, not_needed, skipped; got 'xfail'"):
        CheckOutcome("xfail")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ([], "a check outcome must be an object, got a list"),
        ({"message": "x"}, "a check outcome's outcome is null or nothing, not one of passed, failed"),
        ({"outcome": "passed", "seconds": "1"}, 'check outcome.seconds must be a finite number or null, got "1"'),
        ({"outcome": "failed", "error": "boom"}, 'check outcome.error must be an object or null, got "boom"'),
        ({"outcome": "maybe"}, 'a check outcome\'s outcome is "maybe", not one of passed'),
    ],
)
def test_a_bad_outcome_record_is_a_value_error_naming_the_field(data, text):
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        outcome_from_json(data)


def test_the_old_homes_of_the_vocabulary_still_import_with_a_warning_naming_the_new_one():
    import pytest_backendconf.checks as checks
    import pytest_backendconf.report as report

    with pytest.warns(DeprecationWarning, match=r"moved to pytest_backendconf\.checks\.CheckFailed"):
        assert report.CheckFailed is checks.CheckFailed
    with pytest.warns(DeprecationWarning, match=r"raises pytest_backendconf\.checks\.NotNeeded"):
        assert report.NOT_NEEDED == "not needed"
    with pytest.raises(AttributeError):
        report.no_such_name  # noqa: B018
