"""Shared fixtures of the project's own tests."""

from __future__ import annotations

import importlib.metadata
import os
import secrets
import textwrap
from typing import Iterable

import pytest

# Import torch once, up front: pytester's in-process runs restore sys.modules
# afterwards, and a torch first imported inside one of them would be imported
# a second time by the next run, which crashes its C extension.
import torch
from _pytest import pytester as _pytester

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: torch's own thread pool per worker would
    # oversubscribe the machine several times over. The same holds for the
    # processes the tests start (pytest runs, backend hosts, targets, fresh
    # interpreters): they inherit the environment.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
from hypothesis import settings

# The many small suite runs of these tests check what the checks find, not the isolation, and a
# backend host per run costs a fresh torch import: they run the checks in-process. test_isolation.py
# (and `make suite`) run them in the host, as users do.
os.environ.setdefault("BACKENDCONF_IN_PROCESS", "1")
# Their deliberately failing runs test other things than the minimal reproductions, each of which
# costs a child process: tests/test_minify.py turns it on (--backendconf-minify=on).
os.environ.setdefault("BACKENDCONF_MINIFY", "off")
# Their thousands of archives and reports are throwaway: written atomically, not synced to disk
# (tests/test_archive_fsync.py tests the syncs).
os.environ.setdefault("BACKENDCONF_FSYNC", "off")
# The preprocess cache's secret for every run of the tests (xdist workers and pytester's subprocesses
# inherit it), so that none makes one in the user's ~/.config; tests/test_cache_trust.py tests the file.
os.environ.setdefault("BACKENDCONF_CACHE_SECRET", "tests-" + secrets.token_hex(32))

# The project's own property tests read these global profiles
# (`pytest --hypothesis-profile=thorough`); Hypothesis registers `ci` itself.
for _name, _examples in (("dev", 100), ("thorough", 2000)):
    if _name not in settings._profiles:
        settings.register_profile(_name, max_examples=_examples, deadline=None)

# A backend with the §3.1 shape, as a conftest or plugin would write it. It
# never runs: the registry and plugin tests only select it.
TOY_BACKEND = textwrap.dedent(
    """
    class Toy:
        def __init__(self, name="toy", available=True):
            self.name = name
            self.available = available
        def is_available(self):
            return self.available
        def unavailable_reason(self):
            return "no toy device attached"
        def preprocess(self, program, compile_spec, debug_handles):
            return b""
        def compile(self, processed, method_compile_spec):
            return {m: None for m in processed}
        def execute(self, handle, inputs):
            return []
    """
)


class FakeDistribution(importlib.metadata.Distribution):
    """An installed distribution that exists only in memory (as pytest's own tests do)."""

    def __init__(self, name: str, version: str, entry_points: dict[str, str]) -> None:
        self._name = name
        self._version = version
        self._entry_points = entry_points

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: {self._name}\nVersion: {self._version}\n"
        if filename == "entry_points.txt":
            lines = [f"{name} = {value}" for name, value in self._entry_points.items()]
            return "[backendconf]\n" + "\n".join(lines) + "\n"
        return None

    def locate_file(self, path):  # pragma: no cover - never asked for files
        return path


@pytest.fixture
def fake_distributions(monkeypatch):
    """Replace the ``backendconf`` entry points with those of fake distributions."""

    def install(dists: Iterable[FakeDistribution]) -> None:
        dists = list(dists)
        real = importlib.metadata.entry_points

        def entry_points(**params):
            if params.get("group") != "backendconf":
                return real(**params)
            found = [ep for d in dists for ep in d.entry_points if ep.group == "backendconf"]
            return importlib.metadata.EntryPoints(found)

        monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)

    return install


# Modules that must survive pytester's sys.modules restore. torch imports
# submodules lazily during an export (torch._inductor.test_operators, and
# triton on CUDA builds, for torch.cond ...; torchao, for the quantized
# category); dropped and imported again by the next in-process run, they register their
# operator libraries twice and torch refuses. Our own modules hold
# process-wide state (the debug-handle recorder) that must stay one object.
_KEEP = ("torch", "functorch", "sympy", "triton", "torchao", "pytest_backendconf", "backendconf_reference")


@pytest.fixture(autouse=True)
def _keep_stateful_modules_across_inline_runs(monkeypatch):
    original = _pytester.SysModulesSnapshot.__init__

    def init(self, preserve=None):
        def keep(name: str) -> bool:
            return name.split(".")[0] in _KEEP or bool(preserve and preserve(name))

        original(self, preserve=keep)

    monkeypatch.setattr(_pytester.SysModulesSnapshot, "__init__", init)


@pytest.fixture
def backends_of():
    """``backends_of(module)``: a test module's backends as the registry load() reads, as a conftest's would be."""
    from pytest_backendconf.registry import BackendRegistry, Source, active_registry, set_active_registry

    previous = active_registry()

    def install(module):
        registry = BackendRegistry()
        registry.add_plugin(module, Source(f"tests/{module.__name__}.py"))
        set_active_registry(registry)
        return registry

    yield install
    set_active_registry(previous)
