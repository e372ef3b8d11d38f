"""``--backendconf-artifacts=DIR``: saved inputs and rerun files outlive pytest's temporary folders."""

from __future__ import annotations

import pathlib
import shlex

import pytest

from test_ops import needs_data, rerun_commands

TESTS = pathlib.Path(__file__).parent
FAILING = "--backendconf-select=backendconf::ops::aten.sub.Tensor[[]float16-sample0]"


def _run(pytester, *extra):
    return pytester.runpytest(
        "-p", "broken_backends_ops", "--backend=wrong_half_sub", "-p", "no:cacheprovider", "-p", "no:randomly", *extra
    )


def _rerun_command(result) -> str:
    text = result.stdout.str()
    return next(
        line.split("rerun this comparison: ", 1)[1] for line in text.splitlines() if "rerun this comparison: " in line
    )


@pytest.fixture
def ops_pytester(pytester, monkeypatch):
    # In the backend host, as users run it: the option must reach the host's checks.
    monkeypatch.delenv("BACKENDCONF_IN_PROCESS", raising=False)
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    return pytester


@pytest.mark.slow
@needs_data
def test_a_rerun_command_still_works_after_three_later_runs(ops_pytester):
    basetemp = ops_pytester.path / "basetemp"
    artifacts = ops_pytester.path / "artifacts"
    kept = _rerun_command(_run(ops_pytester, f"--basetemp={basetemp}", f"--backendconf-artifacts={artifacts}", FAILING))
    saved = pathlib.Path(shlex.split(kept)[3])
    assert saved.is_relative_to(artifacts.resolve()) and saved.exists(), kept
    # A file where saved inputs go by default (pytest's folder) ...
    default = basetemp / "ops-inputs-default" / "saved.safetensors"
    default.parent.mkdir()
    default.write_text("")
    ops_pytester.makepyfile(test_other="def test_other(tmp_path):\n    (tmp_path / 'x').write_text('')\n")
    for _ in range(3):  # ... is gone after three later runs with the same --basetemp
        ops_pytester.runpytest(f"--basetemp={basetemp}", "test_other.py").assert_outcomes(passed=1)
    assert not default.exists()
    (again,) = rerun_commands([kept])
    assert again["code"] == 1 and "max abs error" in again["stdout"], again


def test_artifacts_must_be_a_folder(ops_pytester):
    (ops_pytester.path / "file").write_text("")
    result = _run(ops_pytester, "--backendconf-artifacts=file", "--collect-only")
    assert result.ret == 4
    assert "--backendconf-artifacts=file:" in result.stderr.str() and "is a file; give a folder" in result.stderr.str()
