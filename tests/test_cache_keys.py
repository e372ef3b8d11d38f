"""The preprocess cache's key: everything that changes a blob is in it, and nothing that does not.

Real suite runs (pytester) of a backend whose blobs depend on a setting of its instance
(``Configurable(fast_sub=...)``, ``fast_sub=True`` lowering ``sub`` as ``add``: wrong) and on a pass
the file that registers it may add. Each run is a fresh process, as a user's rerun is: serially with
``runpytest_subprocess``, or the workers of ``-n 2``. The counts come from the terminal summary's
cache line and from a file the backend appends a line to per ``preprocess`` call.
"""

from __future__ import annotations

import re

import pytest

CONFIGURABLE_BACKEND = """
import copy

import torch
from backendconf_reference import ReferenceBackend
from pytest_backendconf.debuginfo import walk_nodes

#: Rewrites of an op a plugin may add (``PASSES.append(f)``, f(target) -> target): not the instance's state.
PASSES = []


class Configurable(ReferenceBackend):
    name = "configurable"

    def __init__(self, fast_sub=False):
        self.fast_sub = fast_sub  # True lowers aten.sub as aten.add: wrong, and only its blobs show it

    def preprocess(self, program, compile_spec, debug_handles):
        with open({count!r}, "a") as f:
            f.write("preprocess\\n")
        rewrites = list(PASSES)
        if self.fast_sub:
            rewrites.append(lambda t: torch.ops.aten.add.Tensor if t is torch.ops.aten.sub.Tensor else t)
        if not rewrites:
            return super().preprocess(program, compile_spec, debug_handles)
        work = copy.deepcopy(program)
        handles = {{}}
        for mine, theirs in zip(walk_nodes(work.graph_module), walk_nodes(program.graph_module)):
            handles[mine] = debug_handles[theirs]
            for rewrite in rewrites:
                mine.target = rewrite(mine.target)
        return super().preprocess(work, compile_spec, handles)
"""
SETTING_CONFTEST = """
import os

from configurable_backend import Configurable


def backendconf_register_backends(register):
    register(Configurable(fast_sub=os.environ.get("FAST_SUB") == "1"))
"""
PLAIN_CONFTEST = """
from configurable_backend import Configurable


def backendconf_register_backends(register):
    register(Configurable())
"""
# The same backend, its instance and its package unchanged; the conftest adds a pass of its own.
FAST_SUB_PASS_CONFTEST = """
import torch

import configurable_backend
from configurable_backend import Configurable

configurable_backend.PASSES.append(lambda t: torch.ops.aten.add.Tensor if t is torch.ops.aten.sub.Tensor else t)


def backendconf_register_backends(register):
    register(Configurable())
"""
#: Checks that lower programs with ``sub`` (and one without, which a wrong sub does not touch).
SELECT = (
    "backendconf::ops::aten.sub.Tensor[[]float32-*",
    "backendconf::parity::arithmetic_tensors[[]float32]",
    "backendconf::ops::aten.mul.Tensor[[]float32-*",
)
SUMMARY = re.compile(r"preprocess cache .*: (\d+) of (\d+) preprocess calls reused, (\d+) stored")


def reused(result) -> tuple[int, int]:
    """``(reused, cacheable)``: the preprocess calls the run's cache served, of those it could."""
    found = [SUMMARY.search(line) for line in result.outlines]
    match = next(m for m in found if m is not None)
    return int(match.group(1)), int(match.group(2))


@pytest.fixture
def configurable(pytester):
    """A pytester folder with the configurable backend; returns the function that runs the suite there.

    ``run(conftest, *options, fast_sub=False, cache="cache")`` writes that conftest, runs the
    selection in fresh processes (a subprocess, or the workers of ``-n 2``) over that cache folder
    and returns the result and the number of ``preprocess`` calls the backend made.
    """
    count = pytester.path / "preprocess-calls.txt"
    pytester.makepyfile(configurable_backend=CONFIGURABLE_BACKEND.format(count=str(count)))

    def run(conftest: str, *options: str, fast_sub: bool = False, cache: str = "cache"):
        pytester.makeconftest(conftest)
        count.write_text("")
        pytester._monkeypatch.setenv("FAST_SUB", "1" if fast_sub else "0")
        args = [
            "--backend=configurable",
            "-p",
            "no:cacheprovider",
            f"--backendconf-cache={cache}",
            *(f"--backendconf-select={s}" for s in SELECT),
            *options,
        ]
        if "-n" in options:  # the workers are fresh processes already
            result = pytester.runpytest(*args)
        else:
            result = pytester.runpytest_subprocess(*args)
        return result, len(count.read_text().splitlines())

    return run


# --- a setting of the backend's instance ------------------------------------------------------------


def test_a_wrong_setting_fails_even_after_a_run_with_the_right_one_filled_the_cache(configurable):
    alone, _ = configurable(SETTING_CONFTEST, fast_sub=True, cache="another")
    alone.assert_outcomes(passed=2, failed=3)
    good, cold = configurable(SETTING_CONFTEST, fast_sub=False)
    good.assert_outcomes(passed=5)
    wrong, calls = configurable(SETTING_CONFTEST, fast_sub=True)
    wrong.assert_outcomes(passed=2, failed=3)  # the sub samples and the model with a sub; mul is right anyway
    assert calls == cold  # nothing of the good run's blobs is reused
    good_again, warm = configurable(SETTING_CONFTEST, fast_sub=False)
    good_again.assert_outcomes(passed=5)
    assert warm == 0 and reused(good_again) == (cold, cold)


@pytest.mark.slow  # four runs with two workers each
def test_a_wrong_setting_fails_under_xdist_after_a_good_run(configurable):
    good, cold = configurable(SETTING_CONFTEST, "-n", "2", fast_sub=False)
    good.assert_outcomes(passed=5)
    wrong, calls = configurable(SETTING_CONFTEST, "-n", "2", fast_sub=True)
    wrong.assert_outcomes(passed=2, failed=3)
    assert calls == cold
    again, warm = configurable(SETTING_CONFTEST, "-n", "2", fast_sub=False)
    again.assert_outcomes(passed=5)
    assert warm == 0 and reused(again) == (cold, cold)


# --- the file that registered the backend -----------------------------------------------------------


@pytest.mark.slow  # three runs in fresh processes
def test_an_edited_conftest_misses_and_its_new_pass_is_what_runs(configurable, pytester):
    good, cold = configurable(PLAIN_CONFTEST)
    good.assert_outcomes(passed=5)
    wrong, calls = configurable(FAST_SUB_PASS_CONFTEST)  # the same backend and instance, a pass of the conftest's
    wrong.assert_outcomes(passed=2, failed=3)
    assert calls == cold
    commented, after_comment = configurable(PLAIN_CONFTEST + "\n# only a comment, but another file\n")
    commented.assert_outcomes(passed=5)
    assert after_comment == cold and reused(commented) == (0, cold)


@pytest.mark.slow  # two runs with two workers each
def test_an_edited_conftest_misses_under_xdist(configurable):
    good, cold = configurable(PLAIN_CONFTEST, "-n", "2")
    good.assert_outcomes(passed=5)
    wrong, calls = configurable(FAST_SUB_PASS_CONFTEST, "-n", "2")
    wrong.assert_outcomes(passed=2, failed=3)
    assert calls == cold


# --- nothing that changes from run to run -----------------------------------------------------------


def _reference_run(pytester, *options: str):
    # In the pytest process (as --lf and -k reruns of a few checks often are): the debug handles of
    # earlier lowerings in this process must not change a later lowering's key.
    result = pytester.runpytest(
        "--backend=reference", "-p", "no:cacheprovider", "--backendconf-cache=cache", "-p", "no:randomly", *options
    )
    return result


def test_rerunning_a_few_checks_after_a_run_reuses_their_lowerings(pytester):
    everything = [
        "--backendconf-select=backendconf::parity::small_cnn[[]float32]",
        "--backendconf-select=backendconf::ops::aten.mul.Tensor[[]float32-*",
    ]
    first = _reference_run(pytester, *everything)
    first.assert_outcomes(passed=3)
    stored = reused(first)[1]
    again = _reference_run(pytester, "--backendconf-select=backendconf::ops::aten.mul.Tensor[[]float32-sample1]")
    again.assert_outcomes(passed=1)
    assert reused(again) == (1, 1)
    whole = _reference_run(pytester, *reversed(everything))
    assert reused(whole) == (stored, stored)


@pytest.mark.slow  # the parity category twice with two workers: minutes
def test_an_unchanged_rerun_under_xdist_reuses_nearly_every_lowering(pytester):
    cold = _reference_run(pytester, "-m", "parity", "-n", "2")
    assert cold.ret == 0
    warm = _reference_run(pytester, "-m", "parity", "-n", "2")
    assert warm.ret == 0
    hits, cacheable = reused(warm)
    assert cacheable >= 200 and hits >= 0.9 * cacheable, (hits, cacheable)
