"""A torch build without shipped ops samples discovers them once per machine, not once per process.

Real runs (pytester subprocesses, pytest-xdist with two workers, the backend
host) of a build whose shipped data is missing (`tiny_opinfo`): the controller
discovers before any worker starts, with a progress line; the workers and the
host read the cache; a second run reads it too; two runs at once discover once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pytest_backendconf import _compat
from pytest_backendconf.conformance.ops import _category as ops_category

pytest_plugins = ["pytester"]

if _compat.opinfo_database()[0] is None:  # pragma: no cover
    pytest.skip("PyTorch's OpInfo database is not importable here", allow_module_level=True)


@pytest.fixture
def tiny(pytester, tmp_path, monkeypatch):
    (tmp_path / "shipped").mkdir()
    monkeypatch.setenv("TINY_OPINFO_DATA", str(tmp_path / "shipped"))
    monkeypatch.setenv("TINY_OPINFO_COUNT", str(tmp_path / "discoveries"))
    monkeypatch.setenv("BACKENDCONF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent), prepend=os.pathsep)
    return tmp_path


def _run(pytester, *extra):
    return pytester.runpytest_subprocess(
        "--backend=reference", "-p", "tiny_opinfo", "--backendconf-select=ops::aten.*", "-p", "no:cacheprovider", *extra
    )


def _discoveries(tmp_path) -> list[str]:
    path = tmp_path / "discoveries"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow  # two real runs with two workers each: a minute of CPU
def test_the_xdist_controller_discovers_once_and_every_process_reads_the_cache(pytester, tiny):
    result = _run(pytester, "-n", "2")
    result.assert_outcomes(passed=result.parseoutcomes()["passed"])
    assert result.parseoutcomes()["passed"] >= 4  # sub and neg, in several dtypes
    assert len(_discoveries(tiny)) == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["backendconf: ops discovery: torch * has no shipped samples: sampling 2 OpInfo*"])
    cached = list((tiny / "cache" / "ops").glob("*/torch-*.json"))
    assert [p.parent.name for p in cached] == [ops_category.build_cache_dir().name]
    again = _run(pytester, "-n", "2")
    assert again.parseoutcomes()["passed"] == result.parseoutcomes()["passed"]
    assert len(_discoveries(tiny)) == 1  # the second run read the cache
    assert "ops discovery" not in again.stdout.str()


@pytest.mark.slow
def test_two_runs_at_once_discover_once(pytester, tiny):
    command = [sys.executable, "-m", "pytest", "--backend=reference", "-p", "tiny_opinfo", "-p", "no:cacheprovider"]
    command += ["--backendconf-select=ops::aten.*", "--backendconf-in-process", "-q"]
    runs = [
        subprocess.Popen(command, cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)
    ]
    outputs = [run.communicate(timeout=600)[0].decode() for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert len(_discoveries(tiny)) == 1, outputs


def test_the_cache_is_kept_per_torch_build():
    name = ops_category.build_cache_dir().name
    assert name.startswith(torch.__version__.replace("+", "+"))
    assert (torch.version.git_version or "unknown")[:12] in name


@pytest.mark.parametrize(
    ("patterns", "wanted"),
    [
        ([], True),
        (["ops::*"], True),
        (["backendconf::ops::aten.add.Tensor[float32-sample0]"], True),
        (["*add*"], True),
        (["o*::*"], True),
        (["parity::*"], False),
        (["backendconf::contract::*", "serialization::*"], False),
    ],
)
def test_the_controller_discovers_only_when_the_selection_may_keep_ops_checks(patterns, wanted):
    from pytest_backendconf.suite._suite import _may_select

    assert _may_select(patterns, "ops") is wanted


@pytest.mark.slow
def test_a_second_process_waits_for_the_lock(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from pytest_backendconf.conformance.ops import _category
        with _category._discovery_lock(Path({str(tmp_path)!r})) as locked:
            print("in", time.monotonic(), locked, flush=True)
            time.sleep(float(sys.argv[1]))
            print("out", time.monotonic(), flush=True)
        """
    )
    first = subprocess.Popen([sys.executable, "-c", code, "1.5"], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().startswith("in")  # holds the lock now
    second = subprocess.run([sys.executable, "-c", code, "0"], capture_output=True, text=True, check=True)
    first_out = first.communicate()[0]
    released = float(first_out.split()[1])
    entered = float(second.stdout.split()[1])
    assert entered >= released and second.stdout.split()[2] == "True"
