"""The backend registry and ``--backend``: discovery from every source, and every error text."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from conftest import TOY_BACKEND, FakeDistribution
from pytest_backendconf import Capabilities, register_backend
from pytest_backendconf.registry._registry import BackendRegistry, PluginLoadWarning, Source, check_backend
from pytest_backendconf.errors import DuplicateBackendError, InvalidBackendError, PluginLoadError, UnknownBackendError

CONFTEST_TOY = TOY_BACKEND + "\ndef backendconf_register_backends(register):\n    register(Toy())\n"


def test_unknown_backend_in_an_empty_folder_is_a_usage_error_listing_the_registered(pytester):
    result = pytester.runpytest("--backend=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*unknown backend 'nope'. Registered backends: *reference (from entry point 'reference = *"]
    )
    result.stderr.fnmatch_lines(["*Install a package that provides it (entry-point group 'backendconf')*"])


def test_a_backend_from_a_conftest_is_selectable(pytester):
    pytester.makeconftest(CONFTEST_TOY)
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--backend=toy", "-p", "no:backendconf_suite")
    result.stdout.fnmatch_lines(["backendconf: backend 'toy' from conftest *conftest.py, available"])


def test_a_backend_from_a_dash_p_plugin_is_selectable(pytester):
    pytester.makepyfile(toy_plugin=CONFTEST_TOY)
    pytester.syspathinsert()
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "toy_plugin", "--backend=toy", "-p", "no:backendconf_suite")
    result.stdout.fnmatch_lines(["backendconf: backend 'toy' from pytest plugin toy_plugin, available"])


def test_the_ini_option_selects_a_backend(pytester):
    pytester.makeconftest(CONFTEST_TOY)
    pytester.makeini("[pytest]\nbackendconf_backend = toy\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:backendconf_suite")
    result.stdout.fnmatch_lines(["backendconf: backend 'toy' from conftest *"])


def test_the_header_gives_the_reason_when_not_available(pytester):
    pytester.makeconftest(
        TOY_BACKEND + "\ndef backendconf_register_backends(register):\n    register(Toy(available=False))\n"
    )
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--backend=toy", "-p", "no:backendconf_suite")
    result.stdout.fnmatch_lines(["backendconf: backend 'toy' *, not available: no toy device attached"])


def test_no_header_line_without_a_backend(pytester):
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    assert "backendconf:" not in result.stdout.str()
    result.assert_outcomes(passed=1)


def test_a_backend_without_execute_names_the_object_and_the_method(pytester):
    pytester.makeconftest(
        TOY_BACKEND
        + "\nclass NoExecute(Toy):\n    execute = None\n"
        + "\ndef backendconf_register_backends(register):\n    register(NoExecute())\n"
    )
    result = pytester.runpytest("--backend=toy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*object conftest.NoExecute (backend 'toy') from conftest *conftest.py has no `execute` method*"]
    )


def test_a_bad_name_is_rejected_with_the_rule(pytester):
    pytester.makeconftest(CONFTEST_TOY.replace("register(Toy())", "register(Toy(name='My-Backend'))"))
    result = pytester.runpytest("--backend=toy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*has name 'My-Backend'; a backend's `name` must be a string matching [[]a-z[]]*"])


def test_one_name_from_two_plugins_names_both_sources(pytester):
    pytester.makeconftest(CONFTEST_TOY)
    pytester.makepyfile(toy_plugin=CONFTEST_TOY)
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "toy_plugin", "--backend=toy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*backend name 'toy' is registered twice: by * and by *Uninstall or unregister one of them*"]
    )
    assert "conftest" in result.stderr.str() and "toy_plugin" in result.stderr.str()


# --- entry points, with fake distributions ----------------------------------------


def test_entry_point_backend_is_selected_with_its_distribution(pytester, fake_distributions):
    pytester.makepyfile(vendor_toy=CONFTEST_TOY)
    pytester.syspathinsert()
    fake_distributions([FakeDistribution("vendor-toy", "1.2.3", {"toy": "vendor_toy"})])
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--backend=toy", "-p", "no:backendconf_suite")
    result.stdout.fnmatch_lines(
        ["backendconf: backend 'toy' from entry point 'toy = vendor_toy' *(distribution vendor-toy 1.2.3), available"]
    )


def test_an_entry_point_may_name_a_backend_instance(pytester, fake_distributions):
    pytester.makepyfile(vendor_toy=TOY_BACKEND + "\nBACKEND = Toy()\n")
    pytester.syspathinsert()
    fake_distributions([FakeDistribution("vendor-toy", "1.0", {"toy": "vendor_toy:BACKEND"})])
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--backend=toy", "-p", "no:backendconf_suite")
    result.stdout.fnmatch_lines(["backendconf: backend 'toy' from entry point 'toy = vendor_toy:BACKEND'*"])


def test_only_the_selected_entry_point_is_imported(pytester, fake_distributions):
    pytester.makepyfile(vendor_toy=CONFTEST_TOY, vendor_broken="raise RuntimeError('never import me')")
    pytester.syspathinsert()
    fake_distributions(
        [
            FakeDistribution("vendor-toy", "1.0", {"toy": "vendor_toy"}),
            FakeDistribution("vendor-broken", "0.1", {"broken": "vendor_broken"}),
        ]
    )
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--backend=toy", "-p", "no:backendconf_suite", "-W", "error")
    assert "never import me" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["backendconf: backend 'toy' *"])


def test_the_selected_entry_point_failing_to_import_is_a_usage_error(pytester, fake_distributions):
    pytester.makepyfile(vendor_broken="raise RuntimeError('driver library missing')")
    pytester.syspathinsert()
    fake_distributions([FakeDistribution("vendor-broken", "0.1", {"broken": "vendor_broken"})])
    result = pytester.runpytest("--backend=broken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*entry point 'broken = vendor_broken' (group 'backendconf') (distribution vendor-broken 0.1) "
            "failed to import: RuntimeError: driver library missing. Fix or reinstall that package*"
        ]
    )


def test_other_entry_points_failing_to_import_only_warn(pytester, fake_distributions):
    pytester.makepyfile(vendor_toy=CONFTEST_TOY, vendor_broken="raise RuntimeError('driver library missing')")
    pytester.syspathinsert()
    fake_distributions(
        [
            FakeDistribution("vendor-toy", "1.0", {"toy": "vendor_toy"}),
            FakeDistribution("vendor-broken", "0.1", {"broken": "vendor_broken"}),
        ]
    )
    registry = BackendRegistry()
    with pytest.warns(PluginLoadWarning, match="vendor_broken.*driver library missing"):
        registry.load_entry_points()
    assert list(registry.backends()) == ["toy"]


def test_one_name_from_two_distributions_names_both(pytester, fake_distributions):
    pytester.makepyfile(vendor_a=CONFTEST_TOY, vendor_b=CONFTEST_TOY)
    pytester.syspathinsert()
    fake_distributions(
        [
            FakeDistribution("vendor-a", "1.0", {"toy": "vendor_a"}),
            FakeDistribution("vendor-b", "2.0", {"toy": "vendor_b"}),
        ]
    )
    result = pytester.runpytest("--backend=toy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "registered twice" in err
    assert "distribution vendor-a 1.0" in err and "distribution vendor-b 2.0" in err


# --- the registry as a library ------------------------------------------------------


class _Backend:
    name = "lib"

    def is_available(self):
        return True

    def preprocess(self, program, compile_spec, debug_handles):
        return b""

    def compile(self, processed, method_compile_spec):
        return {}

    def execute(self, handle, inputs):
        return []


def test_register_backend_records_the_calling_module(monkeypatch):
    monkeypatch.setattr("pytest_backendconf.registry._registry._EXPLICIT", [])
    backend = register_backend(_Backend())
    registry = BackendRegistry()
    found = registry.get("lib")
    assert found.backend is backend
    assert "register_backend() in module 'test_registry'" in str(found.source)


def test_every_source_knows_the_file_that_registered_its_backend(pytester, fake_distributions, monkeypatch):
    """The preprocess cache hashes that file: a conftest, a plugin module, an entry point's module, a caller."""
    pytester.makepyfile(
        vendor_toy=CONFTEST_TOY,
        vendor_instance=TOY_BACKEND + "\nBACKEND = Toy('instance')\n",
        toy_plugin=CONFTEST_TOY.replace("Toy()", "Toy('plugin')"),
    )
    pytester.syspathinsert()
    fake_distributions(
        [FakeDistribution("vendor-toy", "1.0", {"toy": "vendor_toy", "instance": "vendor_instance:BACKEND"})]
    )
    monkeypatch.setattr("pytest_backendconf.registry._registry._EXPLICIT", [])
    try:
        registry = BackendRegistry()
        registry.load_entry_points()
        registry.add_plugin(importlib.import_module("toy_plugin"), Source("plugin toy_plugin"))
        register_backend(_Backend())
        found = {name: registry.get(name).source.file for name in ("toy", "instance", "plugin", "lib")}
    finally:
        for name in ("vendor_toy", "vendor_instance", "toy_plugin"):
            sys.modules.pop(name, None)
    assert found == {
        "toy": str(pytester.path / "vendor_toy.py"),
        "instance": str(pytester.path / "vendor_instance.py"),
        "plugin": str(pytester.path / "toy_plugin.py"),
        "lib": __file__,
    }


def test_unknown_backend_with_nothing_registered_says_none(fake_distributions):
    fake_distributions([])
    with pytest.raises(UnknownBackendError, match=r"unknown backend 'x'\. Registered backends: none\."):
        BackendRegistry().get("x")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: _Backend, "is a class; register an instance of it, e.g. register(_Backend())"),
        (lambda: type("B", (_Backend,), {"name": 3})(), "has name 3"),
        (lambda: type("B", (_Backend,), {"compile": "not callable"})(), "has no `compile` method"),
        (
            lambda: type("B", (_Backend,), {"capabilities": {"thread_safe": True}})(),
            "has `capabilities` of type dict; make it a pytest_backendconf.Capabilities(...)",
        ),
    ],
)
def test_malformed_backends_are_rejected_naming_the_fix(make, message):
    with pytest.raises(InvalidBackendError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_backend(make(), Source("a test"))


def test_capabilities_report_what_is_malformed():
    caps = Capabilities(supported_ops={"mul"}, tolerances={"float16": (1e-3,)}, thread_safe="yes")
    problems = caps.problems()
    assert any("supported_ops has ['mul']" in p for p in problems)
    assert any("tolerances[float16] is (0.001,)" in p for p in problems)
    assert any("thread_safe is 'yes'" in p for p in problems)
    assert Capabilities().problems() == []


def test_entry_point_plugin_load_error_is_a_registry_error(pytester, fake_distributions):
    pytester.makepyfile(vendor_broken="import not_a_module_anywhere")
    pytester.syspathinsert()
    fake_distributions([FakeDistribution("vendor-broken", "0.1", {"broken": "vendor_broken"})])
    with pytest.raises(PluginLoadError, match="No module named 'not_a_module_anywhere'"):
        BackendRegistry().load_entry_points(select="broken")


def test_duplicate_backend_error_type():
    registry = BackendRegistry()

    class Plugin:
        def __init__(self):
            self.backend = _Backend()

        def backendconf_register_backends(self, register):
            register(self.backend)

    registry.add_plugin(Plugin(), Source("plugin one"))
    registry.add_plugin(Plugin(), Source("plugin two"))
    with pytest.raises(DuplicateBackendError, match="by plugin one and by plugin two|by plugin two and by plugin one"):
        registry.backends()


# --- import cost and the CLI ---------------------------------------------------------


def test_importing_the_pytest_plugin_does_not_import_torch():
    code = "import sys, pytest_backendconf.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_backendconf_list_shows_distribution_and_availability():
    out = subprocess.run(
        [sys.executable, "-m", "pytest_backendconf.cli", "list"], capture_output=True, text=True, check=True
    )
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "AVAILABLE", "DISTRIBUTION"]
    reference = next(line for line in lines if line.startswith("reference "))
    assert "yes" in reference and "backendconf-reference 0.5.0" in reference


def test_missing_torch_is_a_usage_error_with_the_install_command(pytester):
    # A torch that cannot be imported, first on the path, as on a machine without torch.
    pytester.mkpydir("torch").joinpath("__init__.py").write_text("raise ImportError('No module named torch')")
    pytester.makeconftest(CONFTEST_TOY)
    result = pytester.runpytest_subprocess("--backend=toy", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--backend=toy needs PyTorch*pip install torch==2.13.0*"])


# --- duplicates outside pytest, and `backendconf list` ----------------------------------


def test_register_backend_twice_under_one_name_names_both(monkeypatch):
    monkeypatch.setattr("pytest_backendconf.registry._registry._EXPLICIT", [])
    first = register_backend(_Backend())
    assert register_backend(first) is first  # the same object again is no second backend
    with pytest.raises(
        DuplicateBackendError,
        match=r"backend name 'lib' is registered twice: by register_backend\(\) "
        r"in module 'test_registry'.* and by register_backend\(\) in module 'test_registry'",
    ):
        register_backend(_Backend())


def test_register_backend_cannot_shadow_an_installed_backend(monkeypatch):
    monkeypatch.setattr("pytest_backendconf.registry._registry._EXPLICIT", [])

    class Impostor(_Backend):
        name = "reference"

    with pytest.raises(
        DuplicateBackendError,
        match=r"'reference' is registered twice: .* installed entry point "
        r"'reference = backendconf_reference.plugin'.*Give your backend another name",
    ):
        register_backend(Impostor())
    from pytest_backendconf.registry._registry import lookup_backend

    assert type(lookup_backend("reference").backend).__name__ == "ReferenceBackend"


def test_backendconf_list_shows_a_broken_entry_point_with_its_error(pytester, fake_distributions, capsys):
    from pytest_backendconf.cli._main import main

    pytester.makepyfile(vendor_toy=CONFTEST_TOY, vendor_broken="raise RuntimeError('driver library missing')")
    pytester.syspathinsert()
    fake_distributions(
        [
            FakeDistribution("vendor-toy", "1.0", {"toy": "vendor_toy"}),
            FakeDistribution("vendor-broken", "0.1", {"broken": "vendor_broken"}),
        ]
    )
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    broken = next(line for line in lines if line.startswith("broken "))
    assert "no (failed to import: RuntimeError: driver library missing)" in broken
    assert "vendor-broken 0.1" in broken
    assert any(line.startswith("toy ") and " yes " in line for line in lines)


def test_backendconf_list_takes_plugins_and_escapes_what_they_print(pytester, fake_distributions, capsys):
    from pytest_backendconf.cli._main import main

    fake_distributions([])
    plugin = pytester.makepyfile(
        vendor_plugin=TOY_BACKEND
        + "\nclass Odd(Toy):\n    def is_available(self):\n        return False\n"
        + "    def unavailable_reason(self):\n        return 'no card\\x1b[2J\\nodd  yes  FORGED'\n"
        + "\ndef backendconf_register_backends(register):\n    register(Odd('odd'))\n"
    )
    assert main(["list", "-p", str(plugin)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "FORGED" in out
    assert [line for line in out.splitlines() if line.startswith("odd ")] == [
        next(line for line in out.splitlines() if "FORGED" in line)
    ]  # the newline did not start a forged row
    assert "no card\\x1b[2J\\nodd" in out


def test_backendconf_list_names_a_plugin_that_fails_to_import(capsys):
    from pytest_backendconf.cli._main import main

    assert main(["list", "-p", "no_such_plugin_module"]) == 1
    assert "plugin 'no_such_plugin_module' (-p) failed to import: ModuleNotFoundError" in capsys.readouterr().err


def test_a_registered_case_that_is_not_a_model_case_is_an_error_naming_it():
    import pytest_backendconf as bc
    from pytest_backendconf.errors import RegistryError

    class Plugin:
        @bc.hookimpl
        def backendconf_register_cases(self, register):
            register({"name": "my_model"})

    registry = BackendRegistry()
    registry.add_plugin(Plugin(), Source("plugin cases"))
    with pytest.raises(RegistryError) as info:
        registry.cases()
    assert "registered dict \"{'name': 'my_model'}\", not a model case" in str(info.value)
    assert "register pytest_backendconf.ModelCase objects" in str(info.value)
