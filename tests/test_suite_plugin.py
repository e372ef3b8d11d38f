"""The suite as a pytest plugin: what `--co`, `-v` headers and captured logs look like.

Each run selects one fast check, so the file stays cheap.
"""

from __future__ import annotations

import textwrap

import pytest

AVAILABLE = "backendconf::contract::is_available_is_a_stable_bool"


def test_collect_only_counts_the_suite_items(pytester):
    result = pytester.runpytest(
        "--backend=reference", f"--backendconf-select={AVAILABLE}", "--co", "-q", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines([AVAILABLE, "1 test collected in *"])
    result.stdout.no_fnmatch_line("*no tests collected*")
    assert result.ret == 0


def test_collect_only_counts_the_suite_beside_a_vendors_tests(pytester):
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = pytester.runpytest("--backend=reference", f"--backendconf-select={AVAILABLE}", "--co", "-q", ".")
    result.stdout.fnmatch_lines(["2 tests collected in *"])


def test_with_verbose_the_header_has_one_hypothesis_profile_line(pytester):
    result = pytester.runpytest("--backend=reference", f"--backendconf-select={AVAILABLE}", "--co", "-v")
    lines = [line for line in result.outlines if "hypothesis profile" in line]
    assert len(lines) == 1 and lines[0].startswith("backendconf: hypothesis profile "), lines


@pytest.mark.slow
def test_the_header_names_torchs_thread_count_of_every_process(pytester, monkeypatch):
    # Without OMP_NUM_THREADS the suite runs torch on one thread, and its child processes take the same.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = pytester.runpytest_subprocess("--backend=reference", f"--backendconf-select={AVAILABLE}", "--co")
    result.stdout.fnmatch_lines(["backendconf: torch intra-op threads 1 (in every process of the run)"])


def test_torch_trace_records_stay_out_of_the_captured_logs(pytester, monkeypatch):
    # A vendor's test beside the suite exports a model (torch logs trace records
    # as it does: without the suite, each lands in the captured log), logs a
    # warning of its own, and fails: only the warning is captured.
    monkeypatch.delenv("TORCH_TRACE", raising=False)
    pytester.makepyfile(
        test_logs=textwrap.dedent(
            """
            import logging

            import torch

            class Double(torch.nn.Module):
                def forward(self, x):
                    return x * 2

            def test_fails():
                torch.export.export(Double(), (torch.ones(2),))
                logging.getLogger("vendor").warning("VENDOR-RECORD")
                assert False
            """
        )
    )
    result = pytester.runpytest("--backend=reference", "--backendconf-select=nothing", ".", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Captured log call*", "*VENDOR-RECORD*"])
    result.stdout.no_fnmatch_line("*torch.__trace*")


@pytest.mark.slow
def test_a_plugin_module_in_the_current_folder_works_with_python_dash_m(pytester):
    # As docs/writing-a-backend.md says: `python -m pytest -p mymodule` finds ./mymodule.py.
    import subprocess
    import sys

    pytester.makepyfile(
        mymodule=textwrap.dedent(
            """
            from backendconf_reference import ReferenceBackend

            class Mine(ReferenceBackend):
                name = "mine"

            def backendconf_register_backends(register):
                register(Mine())
            """
        )
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "mymodule",
        "--backend=mine",
        f"--backendconf-select={AVAILABLE}",
        "--co",
        "-q",
    ]
    done = subprocess.run(command, cwd=pytester.path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 test collected" in done.stdout


def test_help_names_the_report_schema_version_reports_carry(pytester):
    from pytest_backendconf.report._report import REPORT_SCHEMA_VERSION

    version = ".".join(map(str, REPORT_SCHEMA_VERSION))
    result = pytester.runpytest("--help")
    assert f"backendconf-report {version}," in " ".join(result.stdout.str().split())
