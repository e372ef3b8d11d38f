"""The preprocess cache's key: everything that changes a blob is in it, and nothing that does not.

Real suite runs (pytester) of a backend whose blobs depend on a setting of its instance
(``Configurable(fast_sub=...)``, ``fast_sub=True`` lowering ``sub`` as ``add``: wrong) and on a pass
the file that registers it may add. Each run is a fresh process, as a user's rerun is: serially with
``runpytest_subprocess``, or the workers of ``-n 2``. The counts come from the terminal summary's
cache line and from a file the backend appends a line to per ``preprocess`` call.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import threading
from pathlib import Path

import pytest
import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc

from pytest_backendconf.debuginfo import DebugHandleRecorder
from pytest_backendconf.lowering import PreprocessCache, export_method, program_digest
from pytest_backendconf.registry import Source

CONFIGURABLE_BACKEND = """
import copy

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc
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


@pytest.mark.slow  # four runs in fresh processes (the key alone is tested below, in `make test`)
def test_a_wrong_setting_fails_even_after_a_run_with_the_right_one_filled_the_cache(configurable):
    alone, _ = configurable(SETTING_CONFTEST, fast_sub=True, cache="another")
    alone.assert_outcomes(passed=2, failed=3)
    good, cold = configurable(SETTING_CONFTEST, fast_sub=False)
    good.assert_outcomes(passed=5)
    wrong, _ = configurable(SETTING_CONFTEST, fast_sub=True)
    wrong.assert_outcomes(passed=2, failed=3)  # the sub samples and the model with a sub; mul is right anyway
    assert reused(wrong)[0] == 0  # nothing of the good run's blobs
    good_again, warm = configurable(SETTING_CONFTEST, fast_sub=False)
    good_again.assert_outcomes(passed=5)
    assert warm == 0 and reused(good_again) == (cold, cold)


@pytest.mark.slow  # four runs with two workers each
def test_a_wrong_setting_fails_under_xdist_after_a_good_run(configurable):
    good, cold = configurable(SETTING_CONFTEST, "-n", "2", fast_sub=False)
    good.assert_outcomes(passed=5)
    wrong, _ = configurable(SETTING_CONFTEST, "-n", "2", fast_sub=True)
    wrong.assert_outcomes(passed=2, failed=3)
    assert reused(wrong)[0] == 0
    again, warm = configurable(SETTING_CONFTEST, "-n", "2", fast_sub=False)
    again.assert_outcomes(passed=5)
    assert warm == 0 and reused(again) == (cold, cold)


# --- the file that registered the backend -----------------------------------------------------------


@pytest.mark.slow  # three runs in fresh processes
def test_an_edited_conftest_misses_and_its_new_pass_is_what_runs(configurable, pytester):
    good, cold = configurable(PLAIN_CONFTEST)
    good.assert_outcomes(passed=5)
    wrong, _ = configurable(FAST_SUB_PASS_CONFTEST)  # the same backend and instance, a pass of the conftest's
    wrong.assert_outcomes(passed=2, failed=3)
    assert reused(wrong)[0] == 0
    commented, after_comment = configurable(PLAIN_CONFTEST + "\n# only a comment, but another file\n")
    commented.assert_outcomes(passed=5)
    assert after_comment == cold and reused(commented) == (0, cold)


@pytest.mark.slow  # two runs with two workers each
def test_an_edited_conftest_misses_under_xdist(configurable):
    good, cold = configurable(PLAIN_CONFTEST, "-n", "2")
    good.assert_outcomes(passed=5)
    wrong, _ = configurable(FAST_SUB_PASS_CONFTEST, "-n", "2")
    wrong.assert_outcomes(passed=2, failed=3)
    assert reused(wrong)[0] == 0


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
        "--backendconf-select=backendconf::ops::aten.add.Tensor[[]float32-*",
        "--backendconf-select=backendconf::ops::aten.mul.Tensor[[]float32-*",
    ]
    first = _reference_run(pytester, *everything)
    first.assert_outcomes(passed=4)
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


# --- the key, without a run ---------------------------------------------------------------------------


class Mode(enum.Enum):
    FAST = "fast"
    EXACT = "exact"


@dataclasses.dataclass(frozen=True)
class Options:
    level: int
    layout: str


class Tuned(ReferenceBackend):
    """The reference backend with whatever settings a test gives it, as attributes."""

    name = "tuned"

    def __init__(self, **settings: object) -> None:
        self.__dict__.update(settings)


class Declares(Tuned):
    """Names its settings itself: its attributes (a lock among them) are not looked at."""

    def cache_identity(self) -> str | None:
        return self.__dict__["declared"]


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x) - 1


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    return export_method(_Linear().eval(), "forward", (torch.randn(3, 4),), {})


def _key(tmp_path, program, backend, source: Source | None = None) -> str | None:
    cache = PreprocessCache(tmp_path / "cache", backend, "1.0", 2**20, source=source)
    return cache.key(program, {}, DebugHandleRecorder().assign(program.graph_module))


PLAIN_SETTINGS = {
    "fast_sub": True,
    "level": 3,
    "scale": 0.5,
    "name_prefix": "npu",
    "nothing": None,
    "dtype": torch.float16,
    "device": torch.device("cpu"),
    "library": Path("/opt/npu/lib"),
    "mode": Mode.FAST,
    "tiles": (8, 16),
    "passes": ["fold", "fuse"],
    "table": {"conv": [1, 2.0], 3: {"x": b"\x00"}},
    "ops": frozenset({"aten.add", "aten.mul"}),
    "options": Options(2, "nhwc"),
}


def test_every_setting_of_the_backend_is_in_the_key_and_the_same_settings_give_the_same_key(tmp_path, program):
    key = _key(tmp_path, program, Tuned(**PLAIN_SETTINGS))
    assert key is not None and key == _key(tmp_path, program, Tuned(**PLAIN_SETTINGS))
    for name, other in [
        ("fast_sub", False),
        ("scale", 0.25),
        ("dtype", torch.bfloat16),
        ("mode", Mode.EXACT),
        ("table", {"conv": [1, 2.5], 3: {"x": b"\x00"}}),
        ("options", Options(2, "nchw")),
        ("ops", frozenset({"aten.add"})),
    ]:
        assert _key(tmp_path, program, Tuned(**{**PLAIN_SETTINGS, name: other})) not in (None, key), name
    assert _key(tmp_path, program, Tuned(**PLAIN_SETTINGS, extra=1)) != key


@pytest.mark.parametrize(
    ("value", "where", "kind"),
    [
        (threading.Lock(), "lock", "_thread.lock"),
        ({"on_compile": print}, "lock['on_compile']", "builtins.builtin_function_or_method"),
        ([1, object()], "lock[1]", "builtins.object"),
    ],
)
def test_a_setting_with_no_stable_form_turns_the_cache_off_and_says_how_to_enable_it(
    tmp_path, program, value, where, kind
):
    backend = Tuned(level=3, lock=value)
    assert _key(tmp_path, program, backend) is None
    cache = PreprocessCache(tmp_path / "cache", backend, "1.0", 2**20)
    assert cache.identity_problem() == (
        f"its attribute {where} ({kind}) has no stable form across processes; define cache_identity(self) -> str "
        'on the backend, returning every setting that changes a blob (docs/backend-contract.md, "Caching '
        'preprocess results")'
    )


def test_cache_identity_names_the_settings_instead_of_the_attributes(tmp_path, program):
    key = _key(tmp_path, program, Declares(declared="level=3", lock=threading.Lock()))
    assert key is not None and key == _key(tmp_path, program, Declares(declared="level=3", lock=threading.Lock()))
    assert _key(tmp_path, program, Declares(declared="level=2", lock=threading.Lock())) not in (None, key)
    never = PreprocessCache(tmp_path / "cache", Declares(declared=None), "1.0", 2**20)
    assert never.identity() is None
    assert never.identity_problem() == "its cache_identity() returned None (never cache this backend)"
    wrong = PreprocessCache(tmp_path / "cache", Declares(declared=3), "1.0", 2**20)
    assert wrong.identity() is None
    assert wrong.identity_problem().startswith("its cache_identity() returned int, not a str; return a str naming")


def test_the_file_that_registered_the_backend_is_in_the_key(tmp_path, program):
    conftest = tmp_path / "conftest.py"
    conftest.write_text("def backendconf_register_backends(register):\n    register(Tuned())\n")
    source = Source(f"conftest {conftest}", file=str(conftest))
    key = _key(tmp_path, program, Tuned(), source)
    assert key is not None and key == _key(tmp_path, program, Tuned(), source)
    conftest.write_text(conftest.read_text() + "# an edit\n")
    assert _key(tmp_path, program, Tuned(), source) not in (None, key)
    nowhere = PreprocessCache(
        tmp_path / "cache", Tuned(), "1.0", 2**20, source=Source("register_backend() in '__main__'")
    )
    assert nowhere.identity() is None
    assert "which has no file to hash" in nowhere.identity_problem()


def test_a_backend_that_cannot_be_cached_says_why_at_the_end_of_the_run(pytester):
    pytester.makeconftest(
        "import threading\n"
        "from backendconf_reference import ReferenceBackend\n\n"
        "class Locked(ReferenceBackend):\n"
        "    name = 'locked'\n\n"
        "    def __init__(self):\n"
        "        self.lock = threading.Lock()\n\n"
        "def backendconf_register_backends(register):\n"
        "    register(Locked())\n"
    )
    result = pytester.runpytest(
        "--backend=locked",
        "-p",
        "no:cacheprovider",
        "--backendconf-cache=cache",
        "--backendconf-select=backendconf::ops::aten.mul.Tensor[[]float32-sample0]",
    )
    result.assert_outcomes(passed=1)
    assert reused(result) == (0, 0)
    result.stdout.fnmatch_lines(
        [
            "backendconf: preprocess cache off for backend 'locked': its attribute lock (_thread.lock) has no "
            "stable form across processes; define cache_identity(self) -> str on the backend*"
        ]
    )
    assert not list((pytester.path / "cache").glob("*.bcpc"))


def test_an_availability_probe_is_no_setting_and_the_project_engines_are_cached(tmp_path, program):
    probed = Tuned(level=3, _availability=bc.AvailabilityProbe(lambda: ""))
    assert _key(tmp_path, program, probed) not in (None, _key(tmp_path, program, Tuned(level=2)))
    engine = pytest.importorskip("backendconf_onnxruntime").OnnxRuntimeBackend()
    assert PreprocessCache(tmp_path / "cache", engine, "1.0", 2**20).identity_problem() == ""


def test_what_a_backend_sets_on_itself_during_the_run_is_not_in_the_key(tmp_path, program):
    backend = Tuned(level=3)
    cache = PreprocessCache(tmp_path / "cache", backend, "1.0", 2**20)
    handles = DebugHandleRecorder().assign(program.graph_module)
    key = cache.key(program, {}, handles)
    backend.kernels = {"mul": object()}  # a table of compiled kernels, filled by its first lowerings
    assert key is not None and cache.key(program, {}, handles) == key


def test_a_program_exported_after_others_has_the_same_hash():
    """FX numbers its generated code per process; a torch.cond program's stack traces name it."""
    from pytest_backendconf.conformance.zoo import CondOnSign

    first = program_digest(export_method(CondOnSign().eval(), "forward", (torch.randn(2, 3),), {}))
    export_method(CondOnSign().eval(), "forward", (torch.randn(4, 3),), {})  # another export in between
    assert program_digest(export_method(CondOnSign().eval(), "forward", (torch.randn(2, 3),), {})) == first


def test_an_edit_to_any_file_of_the_backends_package_misses_every_entry(tmp_path, program, monkeypatch):
    # docs/ci-gating.md: a fix to the backend (any file of its package) misses every entry; a rerun
    # after it pays every preprocess once.
    package = tmp_path / "npu_backend"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from backendconf_reference import ReferenceBackend\n\nclass Npu(ReferenceBackend):\n    name = 'npu'\n"
    )
    (package / "kernels.py").write_text("TILE = 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    npu = importlib.import_module("npu_backend")
    monkeypatch.setitem(sys.modules, "npu_backend", npu)  # removed again after the test
    key = _key(tmp_path, program, npu.Npu())
    assert key is not None and key == _key(tmp_path, program, npu.Npu())
    (package / "kernels.py").write_text("TILE = 8  # a fix elsewhere in the package\n")
    assert _key(tmp_path, program, npu.Npu()) not in (None, key)
