"""The TorchScript flow: the `TorchScriptBackend` record, the C++ reference backend through the suite's
TorchScript form, and a deliberately broken C++ variant caught by each TorchScript-specific check.

The C++ libraries are built by ``make`` before the tests (``python -m
backendconf_torchscript_reference``); here they are found in the cache.
The broken variants are in the same source file
(backends/torchscript_reference/.../csrc/reference_backend.cpp), each a
few lines, registered by the broken library as ``ts_broken_<what>``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pytest_backendconf as bc
from pytest_backendconf.errors import InvalidBackendError
from pytest_backendconf.registry import Source, check_backend

backendconf_torchscript_reference = pytest.importorskip("backendconf_torchscript_reference")
REFERENCE = "torchscript_reference"
# pytester gives each run a HOME of its own: name the cache `make` built into (~/.cache/...) explicitly,
# for the runs and the backend hosts they start, so that no test builds the libraries again.
os.environ[backendconf_torchscript_reference.CACHE_ENV] = str(backendconf_torchscript_reference.cache_root())


def _record(**fields):
    return check_backend(bc.TorchScriptBackend(**fields), Source("a test"))


def test_a_record_is_checked_like_any_backend_and_needs_no_library_loaded():
    record = _record(name="mydsp", library="/opt/mydsp/libmydsp.so", compile_spec={"forward": {"k": "v"}})
    assert record.method_compile_spec(["forward", "encode"]) == {"forward": {"k": "v"}, "encode": {"": ""}}
    assert record.is_available() is False
    assert record.unavailable_reason() == "its library /opt/mydsp/libmydsp.so does not exist"
    assert record.describe() == "TorchScript, library /opt/mydsp/libmydsp.so"


@pytest.mark.parametrize(
    "fields, text",
    [
        ({"name": "Bad"}, "has name 'Bad'"),
        ({"name": "x", "library": 3}, "has library 3; give the path of its shared library"),
        (
            {"name": "x", "compile_spec": {"forward": {}}},
            "compile_spec['forward'] = {}; each method's spec must be a non-empty dict",
        ),
        ({"name": "x", "compile_spec": ["forward"]}, "has compile_spec ['forward']; give a dict of method name"),
        ({"name": "x", "capabilities": {"dtypes": []}}, "has `capabilities` of type dict"),
    ],
)
def test_a_bad_record_names_the_field_and_the_fix(fields, text):
    with pytest.raises(InvalidBackendError, match=None) as info:
        _record(**fields)
    assert text in str(info.value)


@pytest.mark.slow
def test_backendconf_list_shows_a_torchscript_backend_with_its_library(tmp_path):
    plugin = tmp_path / "vendor_plugin.py"
    plugin.write_text(
        "import pytest_backendconf as bc\n"
        "def backendconf_register_backends(register):\n"
        "    register(bc.TorchScriptBackend(name='mydsp', library='/opt/mydsp/libmydsp.so'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "list", "-p", str(plugin)],
        capture_output=True,
        text=True,
        check=True,
    )
    row = next(line for line in done.stdout.splitlines() if line.startswith("mydsp"))
    assert "no (its library /opt/mydsp/libmydsp.so does not exist)" in row
    assert row.endswith("[TorchScript, library /opt/mydsp/libmydsp.so]")


# --- the suite's TorchScript form ---------------------------------------------------------------------


def outcomes(result) -> dict[str, str]:
    found = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):
        name = report.nodeid.split("::", 1)[-1]
        if report.when == "call" or report.outcome != "passed":
            found[name] = report.outcome
    return found


def run(pytester, backend: str, *patterns: str, conftest: str = "", extra: tuple = ()) -> tuple[dict, object]:
    if conftest:
        pytester.makeconftest(textwrap.dedent(conftest))
    result = pytester.runpytest(
        f"--backend={backend}",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::DeprecationWarning",
        *[f"--backendconf-select={p}" for p in patterns],
        *extra,
    )
    return outcomes(result), result


#: One check of each kind, on small models: what the reference must pass.
REFERENCE_SELECTION = [
    "contract::library_registers_backend",
    "contract::lowers?mlp?",
    "parity::mlp?float32?",
    "parity::encoder_decoder?float16?",
    "availability::*",
    "serialization::*?mlp?",
    "symbolication::*",
    "reliability::repeated_calls?mlp?",
    "reliability::inputs_unchanged?mlp?",
    "delegation::*",
    "ops::*",
]


@pytest.mark.slow
def test_the_reference_passes_every_kind_of_check_and_inapplicable_ones_say_why(pytester):
    found, result = run(pytester, REFERENCE, *REFERENCE_SELECTION)
    failed = sorted(name for name, outcome in found.items() if outcome == "failed")
    assert not failed, result.stdout.str()[-4000:]
    assert found["serialization::wrapper_attributes_and_bundled_inputs[mlp]"] == "passed"
    assert found["serialization::target[mlp]"] == "passed"
    assert found["symbolication::runtime_error_lite"] == "passed"
    skipped = result.stdout.str()
    for name in ("availability::unavailable_rows", "delegation::torchscript", "ops::torchscript"):
        assert found[name] == "skipped"
    result = pytester.runpytest(
        "--backend=torchscript_reference",
        "-p",
        "no:cacheprovider",
        "-rs",
        "--backendconf-select=ops::*",
        "--backendconf-select=delegation::*",
    )
    skipped = result.stdout.str()
    assert "not applicable to a TorchScript backend: torch._C._jit_to_backend lowers whole modules" in skipped
    assert "not applicable to a TorchScript backend: its samples are torch.export programs" in skipped


@pytest.mark.slow
def test_the_library_is_loaded_in_the_backend_host_not_in_the_pytest_process(pytester, monkeypatch):
    from pytest_backendconf.torchscript import loaded_libraries

    monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "0")
    library = backendconf_torchscript_reference.library_path()
    before = loaded_libraries()
    found, result = run(pytester, REFERENCE, "contract::library_registers_backend", "parity::mlp?float32?")
    assert set(found.values()) == {"passed"}, result.stdout.str()[-3000:]
    assert loaded_libraries() == before
    if library not in before:
        with open(f"/proc/{os.getpid()}/maps", encoding="ascii") as maps:
            assert library not in maps.read()


def broken(name: str) -> str:
    return f"""
        import pytest_backendconf as bc
        from backendconf_torchscript_reference import broken_library_path

        def backendconf_register_backends(register):
            register(bc.TorchScriptBackend(name="{name}", library=broken_library_path()))
    """


# (broken backend, the checks run, the check that must fail, a piece of its failure text)
CAUGHT = [
    (
        "ts_broken_missing",
        "contract::library_registers_backend",
        "contract::library_registers_backend",
        "is not registered with torch by its library",
    ),
    (
        "ts_broken_wrong_result",
        "parity::arithmetic_tensors?float32?",
        "parity::arithmetic_tensors[float32]",
        "differs from eager PyTorch",
    ),
    (
        "ts_broken_unavailable",
        "availability::host_is_available",
        "availability::host_is_available",
        "is_available() returned False in the process that loaded its library",
    ),
    (
        "ts_broken_preprocess_needs_device",
        "availability::unavailable_rows",
        "availability::unavailable_rows",
        "lowering failed while the backend is not available",
    ),
    (
        "ts_broken_preprocess_needs_device",
        "contract::lowers?mlp?",
        "contract::lowers[mlp]",
        "preprocess needs the device, which is not present",
    ),
    (
        "ts_broken_consumes_blob",
        "serialization::jit_save_load?mlp?",
        "serialization::jit_save_load[mlp]",
        "after torch.jit.save/load",
    ),
    (
        "ts_broken_consumes_blob",
        "serialization::lite_round_trip?mlp?",
        "serialization::lite_round_trip[mlp]",
        "after the lite interpreter round trip",
    ),
    (
        "ts_broken_consumes_blob",
        "serialization::wrapper_*?mlp?",
        "serialization::wrapper_attributes_and_bundled_inputs[mlp]",
        "after torch.jit.save/load",
    ),
    (
        "ts_broken_host_state",
        "serialization::target?mlp?",
        "serialization::target[mlp]",
        "is not in this process's table",
    ),
    (
        "ts_broken_reject_text",
        "symbolication::rejection_text",
        "symbolication::rejection_text",
        "does not say 'The node of backendconf_probe::mystery is not supported in this compiler. Source code:'",
    ),
    (
        "ts_broken_accepts_all",
        "symbolication::rejection_text",
        "symbolication::rejection_text",
        "succeeded; preprocess must reject it",
    ),
    (
        "ts_broken_no_handle",
        "symbolication::runtime_error_lite",
        "symbolication::runtime_error_lite",
        "the text has no module hierarchy",
    ),
    (
        "ts_broken_no_handle",
        "symbolication::runtime_error_without_debug_info",
        "symbolication::runtime_error_without_debug_info",
        "did not report the backend's debug handle as missing",
    ),
    (
        "ts_broken_mutates",
        "reliability::inputs_unchanged?mlp?",
        "reliability::inputs_unchanged[mlp]",
        "the call wrote into its input 0",
    ),
    (
        "ts_broken_nondeterministic",
        "reliability::deterministic_preprocess?mlp?",
        "reliability::deterministic_preprocess[mlp]",
        "gave different processed modules",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend, select, check, text", CAUGHT, ids=[f"{c[0]}-{c[2]}" for c in CAUGHT])
def test_each_torchscript_check_catches_its_broken_cpp_backend(pytester, backend, select, check, text):
    found, result = run(pytester, backend, select, conftest=broken(backend))
    assert found.get(check) == "failed", result.stdout.str()[-3000:]
    assert text in result.stdout.str(), result.stdout.str()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, select, check, text, options",
    [
        (
            "ts_broken_crash",
            "reliability::repeated_calls?mlp?",
            "reliability::repeated_calls[mlp]",
            "the backend took down the process running",
            (),
        ),
        (
            "ts_broken_hang",
            "reliability::repeated_calls?mlp?",
            "reliability::repeated_calls[mlp]",
            "did not finish within 20 s",
            ("--backendconf-timeout=20",),
        ),
        ("ts_broken_leak", "reliability::memory", "reliability::memory", "memory keeps growing with calls", ()),
    ],
)
def test_a_crashing_hanging_or_leaking_cpp_backend_fails_its_check_in_the_backend_host(
    pytester, monkeypatch, backend, select, check, text, options
):
    monkeypatch.setenv("BACKENDCONF_IN_PROCESS", "0")
    found, result = run(
        pytester, backend, select, "contract::library_registers_backend", conftest=broken(backend), extra=options
    )
    assert found.get(check) == "failed", result.stdout.str()[-3000:]
    assert found.get("contract::library_registers_backend") == "passed"  # the run went on
    assert text in result.stdout.str(), result.stdout.str()[-3000:]


def test_to_backend_names_the_torchscript_way_for_a_torchscript_record():
    import torch

    record = bc.TorchScriptBackend(name="mydsp", library="/opt/mydsp/libmydsp.so")
    with pytest.raises(bc.LoweringError) as info:
        bc.to_backend(torch.nn.ReLU(), record, {"forward": {}}, example_inputs=(torch.ones(2),))
    assert "is a TorchScript backend (C++ behind torch._C._jit_to_backend)" in str(info.value)
    assert "torch._C._jit_to_backend('mydsp', scripted, {'forward': {'': ''}})" in str(info.value)


STATE_IN_THE_SEEDS_FLOW = """
import io, os, sys, torch
import backendconf_torchscript_reference as reference
sys.path.insert(0, {tests!r})
from stateful_models import Accumulator, TinyDecoder, greedy
from pytest_backendconf import _compat

torch.ops.load_library(str(reference.library_path()))
spec = {{"forward": {{"": ""}}}}
a = _compat.jit_to_backend("torchscript_reference", torch.jit.script(Accumulator()), spec)
b = _compat.jit_to_backend("torchscript_reference", torch.jit.script(Accumulator()), spec)
x = torch.ones(3)
print("calls", a(x).tolist(), a(x).tolist(), "other instance", b(x).tolist())
saved = io.BytesIO()
torch.jit.save(a, saved)
saved.seek(0)
print("loaded", torch.jit.load(saved)(x).tolist())
decoder = _compat.jit_to_backend("torchscript_reference", torch.jit.script(TinyDecoder().eval()), spec)
print("greedy", greedy(decoder, torch.tensor([[3]]), 8) == greedy(TinyDecoder().eval(), torch.tensor([[3]]), 8))
"""


@pytest.mark.slow  # a fresh process loading the C++ library: seconds
def test_state_in_the_seeds_flow_is_kept_by_the_backend_and_saved_live():
    """What ``torch._C._jit_to_backend`` does with a buffer a method writes (docs/writing-a-backend.md,
    "State in the TorchScript form"): the backend's module keeps it, each lowering its own, a decoder
    generates as eager; but ``torch.jit.save`` writes the live state, and there is no reset."""
    script = STATE_IN_THE_SEEDS_FLOW.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "calls [3.0, 3.0, 3.0] [5.0, 5.0, 5.0] other instance [3.0, 3.0, 3.0]" in lines
    assert "loaded [7.0, 7.0, 7.0]" in lines  # continues from the two calls: 2 * (1 + 1 + 1) + 1
    assert "greedy True" in lines
