"""Failure texts a vendor can act on: one clean block per failure, the suite's own reproduce line, the
dynamic-shape hint only where the shape differs, and every failure's rerun command in the report.

The backends are the reference backend with one defect (tests/broken_backends.py:
``HalfAsFloat`` returns float32 for a float16 model; broken_backends_ops.py:
``CrashingHalfSub`` raises in its float16 subtraction kernel). Each run is a
real pytest run, in the backend host as vendors run it and in-process as a
debugger does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_backendconf.errors import BackendError
from pytest_backendconf.report import FAILING, REPORT_SCHEMA_VERSION
from pytest_backendconf.suite._failure_text import failure_text_of

TESTS = Path(__file__).parent

CONFTEST = textwrap.dedent(
    f"""
    import sys
    sys.path.insert(0, {str(TESTS)!r})

    from backendconf_reference import ReferenceBackend
    from broken_backends import HalfAsFloat
    from broken_backends_ops import CrashingHalfSub


    def backendconf_register_backends(register):
        register(HalfAsFloat())
        register(CrashingHalfSub())
    """
)

AVAILABLE = "backendconf::contract::is_available_is_a_stable_bool"
LINEAR32 = "backendconf::parity::linear[float32]"
HALF = [
    "backendconf::parity::linear[float16]",
    "backendconf::parity::linear[float16-dynamic]",
    "backendconf::parity::mlp[float16]",
    "backendconf::parity::mlp[float16-dynamic]",
]
#: What a failure block must not show: the suite's own modules, chain banners, Hypothesis's advice.
NOT_SHOWN = [
    "parity.py",
    "_lowered_module.py",
    "_method_calls.py",
    "_outcome.py",
    "_suite.py",
    "hypothesis/core.py",
    "The above exception",
    "reproduce_failure",
    "Failing test case",
    "Falsifying",
    "Traceback (most recent call last)",
]
HINT = "A backend must not specialise on the first shape it runs"


def select(*ids: str) -> list[str]:
    return [f"--backendconf-select={i}" for i in ids]


@pytest.fixture(params=["host", "in-process"])
def suite(request, pytester, monkeypatch):
    """Run the suite in the backend host (as vendors do) or in the pytest process (as a debugger does)."""
    if request.param == "host":
        monkeypatch.delenv("BACKENDCONF_IN_PROCESS", raising=False)
    else:
        monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "1")
    pytester.makeconftest(CONFTEST)

    def run(backend: str, *args: str):
        return pytester.runpytest(
            f"--backend={backend}", "--backendconf-hypothesis=ci", "-p", "no:cacheprovider", *args
        )

    return run


def failures_section(text: str) -> str:
    """The FAILURES section of a run's output (the blocks pytest prints, one per failure)."""
    start = text.index("= FAILURES =")
    return text[start : text.index("backendconf: conformance of backend")]


@pytest.mark.slow
def test_a_backend_returning_float32_for_float16_gets_clean_blocks_and_a_rerun_command_per_failure(suite, pytester):
    result = suite(
        "half_as_float",
        *select(AVAILABLE, LINEAR32, *HALF),
        "--backendconf-report=report.json",
        "--backendconf-html=report.html",
    )
    result.assert_outcomes(passed=2, failed=4)
    blocks = failures_section(result.stdout.str())
    for banned in NOT_SHOWN:
        assert banned not in blocks, f"{banned!r} in:\n{blocks}"
    # Its dynamic checks fail on the dtype, at the right shapes: not a word about specialising.
    assert "specialise" not in result.stdout.str()
    # What differs, at which output and node, the saved inputs, the suite's reproduce line.
    for expected in [
        "linear.forward in float16 for inputs drawn with seed=*, mode=*: method 'forward' output 0: "
        "expected a float16[[]3, 4] tensor, got a float32[[]3, 4] tensor from backend 'half_as_float'",
        "  (output 0 is the exported program's node 'linear')",
        "  inputs: *linear.forward-float16.safetensors",
        "  rerun this comparison: python -m pytest_backendconf.rerun *linear.forward-float16.safetensors "
        "--backend=half_as_float",
        "reproduce: pytest --backend=half_as_float '--backendconf-select=backendconf::parity::linear[[]float16]' "
        "--backendconf-hypothesis=ci",
        "linear.forward in float16, lowered once with dynamic shapes and called at batch=*: method 'forward' "
        "output 0: expected a float16[[]?, 4] tensor, got a float32[[]*, 4] tensor from backend 'half_as_float'",
    ]:
        result.stdout.fnmatch_lines([expected])

    report = json.loads((pytester.path / "report.json").read_text())
    assert report["schema_version"] == list(REPORT_SCHEMA_VERSION) == [1, 9]
    tests = {t["id"]: t for t in report["tests"]}
    failing = [t for t in tests.values() if t["outcome"] in FAILING]
    assert sorted(t["id"] for t in failing) == sorted(HALF)
    for test in failing:
        # The error is the backend's, with its figures; the rerun command is a field of its own.
        assert test["error"]["type"] == "OutputSpecError", test
        assert "expected a float16[" in test["error"]["message"] and "got a float32[" in test["error"]["message"]
        assert test["rerun"].startswith("python -m pytest_backendconf.rerun "), test
        saved = Path(test["rerun"].split()[3])
        assert saved.is_file() and saved.suffix == ".safetensors"
        assert test["rerun"] in (pytester.path / "report.html").read_text().replace("&#x27;", "'")
    assert tests[LINEAR32]["outcome"] == "passed" and tests[LINEAR32]["rerun"] is None

    # The command runs the saved comparison alone and says what differs, without a traceback.
    command = tests[HALF[1]]["rerun"].split()[1:] + ["-p", "conftest"]
    done = subprocess.run([sys.executable, *command], cwd=pytester.path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "linear.forward in float16, lowered with dynamic shapes, at batch=" in done.stdout
    assert "FAILED, its outputs are not as the exported program says" in done.stdout
    assert "expected a float16[?, 4] tensor, got a float32[" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_crash_in_the_backends_kernel_is_one_block_with_the_backends_frames(suite):
    ops = "backendconf::ops::aten.sub.Tensor[float16-sample0]"
    parity = "backendconf::parity::arithmetic_tensors[float16]"
    result = suite("crashing_half_sub", *select(parity, ops))
    result.assert_outcomes(failed=2)
    blocks = failures_section(result.stdout.str())
    for banned in NOT_SHOWN:
        assert banned not in blocks, f"{banned!r} in:\n{blocks}"
    assert blocks.count("where it was raised (most recent call last; the suite's own frames left out):") == 2
    result.stdout.fnmatch_lines(
        [
            # The parity block: the symbolicated error, the model's line, the inputs, the backend's frames.
            "BackendRuntimeError: aten::sub at node 'sub' failed: RuntimeError: no float16 kernel for sub on "
            "this device",
            "Traceback of model source (most recent call last):",
            "*return (x + y) * (x - y) / y",
            "(in arithmetic_tensors.forward in float16 for inputs drawn with seed=*, mode=*)",
            "where it was raised (most recent call last; the suite's own frames left out):",
            '  File "*broken_backends_ops.py", line *, in call',
            '    raise RuntimeError("no float16 kernel for sub on this device")',
            "RuntimeError: no float16 kernel for sub on this device",
            "reproduce: pytest --backend=crashing_half_sub "
            "'--backendconf-select=backendconf::parity::arithmetic_tensors[[]float16]' --backendconf-hypothesis=ci",
            # The ops block: the same, once.
            "BackendRuntimeError: aten::sub at node 'sub' failed: RuntimeError: no float16 kernel for sub on "
            "this device",
            "where it was raised (most recent call last; the suite's own frames left out):",
            '  File "*broken_backends_ops.py", line *, in call',
            "RuntimeError: no float16 kernel for sub on this device",
            "reproduce: pytest --backend=crashing_half_sub "
            "'--backendconf-select=backendconf::ops::aten.sub.Tensor[[]float16-sample0]' --backendconf-hypothesis=ci",
        ]
    )


def test_a_correct_backend_is_unaffected(pytester):
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest(
        "--backend=reference",
        "--backendconf-hypothesis=ci",
        "-p",
        "no:cacheprovider",
        *select(AVAILABLE, LINEAR32, *HALF),
        "--backendconf-report=report.json",
    )
    result.assert_outcomes(passed=6)
    report = json.loads((pytester.path / "report.json").read_text())
    assert [t["rerun"] for t in report["tests"]] == [None] * 6


# --- the text itself, without a run ----------------------------------------------------


CATCH = """
def caught():
    try:
        go()
    except Exception as exc:
        return exc
"""


def _raise_in(module: str, source: str) -> BaseException:
    """The exception ``go()`` of ``source`` raises, run as code of ``module``: every frame carries that name."""
    namespace: dict = {"__name__": module, "BackendError": BackendError}
    exec(compile(textwrap.dedent(source) + CATCH, f"<{module}>", "exec"), namespace)
    return namespace["caught"]()


def test_a_fault_of_the_suite_itself_keeps_its_whole_traceback():
    # Not a backend's error and no frame outside the suite: the suite's own bug, to be found.
    exc = _raise_in("pytest_backendconf.conformance.fake", "def go():\n    return {}['missing']\n")
    text = failure_text_of(exc)
    assert "KeyError: 'missing'" in text and "in go" in text


def test_the_suites_own_error_without_backend_frames_is_its_message_alone():
    exc = _raise_in("pytest_backendconf.lowering.fake", "def go():\n    raise BackendError('trap')\n")
    assert failure_text_of(exc) == "BackendError: trap"


def test_a_backends_frames_stay_and_the_suites_go():
    exc = _raise_in(
        "vendor_backend",
        """
        def kernel():
            raise ValueError("bad stride")
        def go():
            try:
                kernel()
            except ValueError as exc:
                raise BackendError("kernel 3 failed") from exc
        """,
    )
    lines = failure_text_of(exc).splitlines()
    assert lines[0] == "BackendError: kernel 3 failed"
    assert lines[1] == "where it was raised (most recent call last; the suite's own frames left out):"
    # The origin's frames: from where the backend caught its own error down to the raise.
    assert [line.rsplit(" ", 1)[-1] for line in lines[2:-1]] == ["go", "kernel"]
    assert lines[-1] == "ValueError: bad stride"
