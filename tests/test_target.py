"""The simulated target: archives loaded and run in a fresh process with host-only modules blocked."""

from __future__ import annotations

import concurrent.futures
import sys

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.lowering import _saving
from pytest_backendconf.target import _target
from test_archive import ALL_INPUTS, ALL_METHODS, TINY_COMPILES, TINY_EXPORTS, TINY_LEAKY, TINY_OFF, TINY_RUNTIME
from test_archive import X, Y, N, TinyBackend, lower
from test_archive import registry  # noqa: F401  (the module-scoped fixture: this module's backends)

TEST_ARCHIVE_FILE = sys.modules[TinyBackend.__module__].__file__


def _reference_available() -> bool:
    try:
        import backendconf_reference  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def runs(tmp_path_factory, registry):  # noqa: F811
    """Every target run of this module, started together: each is a fresh interpreter."""
    directory = tmp_path_factory.mktemp("target")
    crashing_plugin = directory / "crashing_plugin.py"
    crashing_plugin.write_text("import os\nos._exit(3)\n")

    def archive(name, lowered):
        path = directory / f"{name}.bcpt"
        bc.save(lowered, path)
        return path

    main = lower(spec=ALL_METHODS, inputs=ALL_INPUTS)
    jobs = {
        # plugins=None: the active registry's plugin (this test module) is passed on.
        "main": (archive("main", main), {"forward": [(X,), (Y,)], "pair": [(X, Y)], "boom": [(X,)]}, {}),
        "off": (archive("off", lower(TINY_OFF)), {"forward": [(X,)]}, {"plugins": [TEST_ARCHIVE_FILE]}),
        "leaky": (archive("leaky", lower(TINY_LEAKY)), {}, {"plugins": [TEST_ARCHIVE_FILE]}),
        "runtime": (archive("runtime", lower(TINY_RUNTIME)), {"forward": [(X,)]}, {}),
        "compiles": (archive("compiles", lower(TINY_COMPILES)), {"forward": [(X,)]}, {}),
        "exports": (archive("exports", lower(TINY_EXPORTS)), {"forward": [(X,)]}, {}),
        # A plugin that takes the process down on import: a crash, cheaply (no torch import).
        "crash": (archive("crash", lower()), {}, {"plugins": [str(crashing_plugin)]}),
        "ghost": (archive("ghost", lower(TinyBackend("tiny_ghost"))), {}, {"plugins": []}),
    }
    corrupt = directory / "corrupt.bcpt"
    data = bytearray(_saving.to_bytes(lower()))
    data[-40] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    jobs["corrupt"] = (corrupt, {}, {"plugins": []})
    if _reference_available():
        reference = bc.to_backend(N(), "reference", {"forward": {}}, example_inputs=(X,))
        jobs["reference"] = (archive("reference", reference), {"forward": [(X,)]}, {"plugins": []})
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {
            name: pool.submit(_target.run_on_target, path, calls, timeout=120, **options)
            for name, (path, calls, options) in jobs.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    results["lowered"] = main
    return results


def test_round_trip_on_the_target_matches_eager(runs):
    result = runs["main"]
    assert result["error"] is None, result
    assert result["loaded"] and result["backend"] == "tiny"
    assert result["methods"] == ["forward", "pair", "boom"]
    model = N()
    forward = result["outputs"]["forward"]
    torch.testing.assert_close(forward, [model(X), model(Y)])
    total, parts = result["outputs"]["pair"][0]
    torch.testing.assert_close((total, parts), model.pair(X, Y))
    assert isinstance(parts, dict) and list(parts) == ["prod"]
    assert result["errors"]["forward"] == [None, None]


def test_runtime_error_text_comes_back_intact(runs):
    result = runs["main"]
    assert not result["ok"]
    assert result["outputs"]["boom"] == [None]
    error = result["errors"]["boom"][0]
    with pytest.raises(bc.BackendRuntimeError) as here:
        runs["lowered"].boom(X)
    assert error == {"type": "BackendRuntimeError", "message": str(here.value)}
    assert "Traceback of model source" in error["message"] and "return x * 2 + 1" in error["message"]


def test_host_only_and_tracing_modules_are_blocked(runs):
    assert runs["main"]["blocked"] == ["colorsys", "torch._dynamo", "torch.export._trace"]
    error = runs["leaky"]["error"]
    assert error["type"] == "BackendContractError"
    for module in ("colorsys", "torch.export._trace", "torch._dynamo"):
        assert f"blocked on the target: {module} is host-only" in error["message"]


def test_declared_runtime_modules_are_let_in_but_tracing_calls_are_not(runs):
    runtime = runs["runtime"]
    assert runtime["ok"], runtime
    assert runtime["blocked"] == ["tabnanny", "torch.export._trace"]  # torch._dynamo: declared, imported
    torch.testing.assert_close(runtime["outputs"]["forward"][0], N()(X))
    # compile() calls torch.compile and swallows the error: the load still fails, naming the call.
    compiles = runs["compiles"]
    assert not compiles["loaded"] and compiles["error"]["type"] == "BackendContractError"
    assert compiles["error"]["message"].startswith(
        "backend 'tiny_compiles' called torch.compile on the target; a target loads and runs compiled blobs "
        "and does not trace: export and compile on the host, in preprocess()"
    )
    # execute() re-exports: the load passes, the call fails.
    exports = runs["exports"]
    assert exports["loaded"] and exports["outputs"]["forward"] == [None]
    error = exports["errors"]["forward"][0]
    assert error["type"] == "BackendContractError"
    assert error["message"].startswith("backend 'tiny_exports' called torch.export.export on the target")


def test_blocked_modules_leave_out_only_declared_tracing_modules():
    strict = bc.Capabilities(host_only_modules=("vendor.compiler",))
    executorch_like = bc.Capabilities(host_only_modules=("vendor.compiler",), target_runtime_modules=("torch._dynamo",))
    assert _target.blocked_modules(strict) == ("vendor.compiler", "torch._dynamo", "torch.export._trace")
    assert _target.blocked_modules(executorch_like, ["extra"]) == ("vendor.compiler", "torch.export._trace", "extra")


def test_tracing_call_guard_records_the_call_and_lifts_everywhere():
    from pytest_backendconf.target._child import TracingCallGuard

    original = torch.compile
    guard = TracingCallGuard()
    guard.install()
    try:
        bound = torch.export.export  # as a module that did "from torch.export import export" on the target
        guard.backend_name = "mybackend"
        with pytest.raises(bc.BackendContractError, match="backend 'mybackend' called torch.compile on the target"):
            torch.compile(torch.nn.ReLU())
        mark = guard.mark()
        try:
            bound(torch.nn.ReLU(), (torch.ones(2),))
        except Exception:
            pass  # swallowed: check() still sees the call
        with pytest.raises(bc.BackendContractError, match=r"called torch\.export\.export on the target"):
            guard.check(mark)
    finally:
        guard.lift()
    assert torch.compile is original
    # The host phase: what was bound on the target works again.
    assert isinstance(bound(torch.nn.ReLU(), (torch.ones(2),)), torch.export.ExportedProgram)


def test_unavailable_backend_on_the_target(runs):
    error = runs["off"]["error"]
    assert error["type"] == "BackendUnavailableError"
    assert error["message"].startswith("Backend is not available. Backend 'tiny_off'")
    assert "the tiny test device is switched off" in error["message"]
    assert not runs["off"]["loaded"] and runs["off"]["outputs"] == {}


def test_archive_errors_come_back_intact(runs):
    assert runs["ghost"]["error"]["type"] == "ArchiveBackendError"
    assert "backend 'tiny_ghost'" in runs["ghost"]["error"]["message"]
    corrupt = runs["corrupt"]["error"]
    assert corrupt["type"] == "ArchiveFormatError" or corrupt["type"].startswith("Archive")
    assert "corrupt.bcpt" in corrupt["message"]


def test_a_crashing_backend_is_reported_not_raised(runs):
    result = runs["crash"]
    assert result["error"]["type"] == "TargetCrashError"
    assert result["returncode"] == 3
    assert "exited with code 3" in result["error"]["message"]


@pytest.mark.skipif(not _reference_available(), reason="the reference backend is not installed")
def test_reference_backend_found_through_its_entry_point(runs):
    result = runs["reference"]
    assert result["ok"], result
    assert "backendconf_reference.compiler" in result["blocked"]
    torch.testing.assert_close(result["outputs"]["forward"][0], N()(X))


def test_timeout_kills_the_target(tmp_path):
    path = tmp_path / "m.bcpt"
    bc.save(lower(), path)
    result = _target.run_on_target(path, {}, plugins=[], timeout=0.01)
    assert result["error"]["type"] == "TargetTimeoutError"
    assert "did not finish within 0.01 s" in result["error"]["message"]


def test_import_blocker_refuses_modules_and_submodules():
    blocker = _target.ImportBlocker(["colorsys", "pkg.compiler"])
    for name in ("colorsys", "pkg.compiler", "pkg.compiler.passes"):
        with pytest.raises(ImportError, match=f"blocked on the target: {name} is host-only"):
            blocker.find_spec(name)
    assert blocker.find_spec("pkg") is None and blocker.find_spec("colorsys_extra") is None


def test_active_plugins_are_passed_on(registry):  # noqa: F811
    assert _target.active_plugins() == ["test_archive"]


def test_host_only_modules_of_unknown_backend_are_left_to_the_child():
    assert _target.host_only_modules("tiny") == ("colorsys",)
    assert _target.host_only_modules("no_such_backend") == ()
