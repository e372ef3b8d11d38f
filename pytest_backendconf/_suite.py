"""The conformance suite as pytest items: checks, collection, outcomes, reproduction.

Each category module in ``conformance/`` yields `Check` records from the
spec data; this module turns them into `ConformanceItem`s whose ids are
stable across machines (``backendconf::parity::small_cnn[float16]``), so
that known-failure files and reports can name them.

With ``--backend`` and no test paths, only the suite runs; with paths, the
suite runs beside the tests found there (a vendor's own regression tests).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import shlex
from typing import Any, Callable

import pytest

CATEGORIES = ("contract", "parity", "availability", "serialization", "symbolication", "reliability", "delegation")
ROOT_ID = "backendconf"


@dataclasses.dataclass(frozen=True)
class Check:
    """One generated test.

    :param category: one of `CATEGORIES`; also the pytest marker.
    :param name: unique within the category, e.g. ``small_cnn[float16]``.
    :param run: called with the `SuiteContext`; raises `CheckFailed`
        (or any exception) to fail, `Unsupported` to report "unsupported".
        It may return a JSON-compatible dict of details, kept in the report.
    :param stage: the part of the contract it exercises (``preprocess``,
        ``compile``, ``execute``, ``load``, ``target`` …), for the report.
    """

    category: str
    name: str
    run: Callable[[Any], None]
    stage: str
    case: str | None = None


class CheckFailed(AssertionError):
    """A conformance check failed; the message says what the backend did and what was expected."""


class Unsupported(Exception):
    """The backend rejected the model (`UnsupportedNodeError`): counted apart, never as a pass."""

    @classmethod
    def from_rejection(cls, exc: Exception) -> "Unsupported":
        """``The node of aten::mul is not supported in this compiler (reason) at models.py:12``."""
        first = str(exc).splitlines()[0].removesuffix(" Source code:").rstrip(".")
        reason = getattr(exc, "reason", "")
        info = getattr(exc, "debug_info", None)
        where = f" at {info.file}:{info.line}" if info is not None and info.file else ""
        return cls(first + (f" ({reason})" if reason else "") + where)


def fail(message: str) -> None:
    raise CheckFailed(message)


def generate_checks(ctx: Any) -> list[Check]:
    """Every check of every category for the context's backend, in a stable order."""
    found: list[Check] = []
    for category in CATEGORIES:
        module = importlib.import_module(f"pytest_backendconf.conformance.{category}")
        found.extend(module.checks(ctx))
    return found


class SuiteCollector(pytest.Collector):
    """The root of the generated items; it has no file, so its id is fixed."""

    def collect(self) -> list[pytest.Item]:  # pragma: no cover - items are made by the plugin
        return []


class ConformanceItem(pytest.Item):
    def __init__(self, *, check: Check, ctx: Any, reproduce: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.ctx = ctx
        self.reproduce = reproduce
        self.add_marker(check.category)

    def runtest(self) -> None:
        try:
            details = self.check.run(self.ctx)
            if isinstance(details, dict):  # e.g. delegation's node counts, for the report and summary
                self.user_properties.append(("backendconf", details))
        except Unsupported as exc:
            pytest.skip(f"unsupported: {exc}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CheckFailed):
            text = str(excinfo.value)
        else:
            text = str(excinfo.getrepr(style="short", chain=True))
        return f"{text}\nreproduce: {self.reproduce}"

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{ROOT_ID}::{self.check.category}::{self.check.name}"


class SuitePlugin:
    """Registered (as ``backendconf_suite``) when a backend is selected."""

    def __init__(self, config: pytest.Config, ctx_factory: Callable[[], Any], backend_name: str) -> None:
        self.config = config
        self._ctx_factory = ctx_factory
        self.backend_name = backend_name
        self.ctx: Any = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        for category in CATEGORIES:
            config.addinivalue_line("markers", f"{category}: conformance checks of the {category} category")
        config.addinivalue_line("markers", "real_model: conformance checks on a real-world model (--backendconf-zoo)")
        import os

        import torch

        workers = getattr(config, "workerinput", {}).get("workercount")
        if workers:
            # pytest-xdist: share the cores between workers instead of each
            # worker's torch thread pool claiming all of them.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
        elif not os.environ.get("OMP_NUM_THREADS"):
            # The zoo's models are tiny: torch's thread pool costs more than it
            # gives (benchmarks: 55 s → 35 s for the default suite). Set
            # OMP_NUM_THREADS to choose otherwise.
            torch.set_num_threads(1)

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> str | None:
        count = sum(isinstance(item, ConformanceItem) for item in items)
        return f"backendconf: {count} conformance checks for backend {self.backend_name!r}"

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
        ctx = self.ctx = self._ctx_factory()  # kept for tools (benchmarks) that inspect the session
        root = SuiteCollector.from_parent(session, name=ROOT_ID, nodeid=ROOT_ID)
        root.path = _conformance_dir()
        selected = config.getoption("backendconf_select") or []
        from .conformance.real_models import zoo_keeps

        zoo = config.getoption("backendconf_zoo", "synthetic")
        for check in generate_checks(ctx):
            name = f"{check.category}::{check.name}"
            if selected and not any(id_matches(name, p) for p in selected):
                continue
            real = zoo_keeps(ctx, check, zoo)
            if real is None:
                continue
            item = ConformanceItem.from_parent(
                root, name=name, check=check, ctx=ctx, reproduce=self.reproduce_command(f"{ROOT_ID}::{name}")
            )
            if real:
                item.add_marker("real_model")
            items.append(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        report = yield
        if isinstance(item, ConformanceItem) and report.skipped and isinstance(report.longrepr, tuple):
            # "SKIPPED [1] backendconf::parity::x[float16]: unsupported: …", not
            # the line of this package that raised the skip.
            report.longrepr = (item.nodeid, None, report.longrepr[2])
        return report

    def reproduce_command(self, node_id: str) -> str:
        from .plugin import hypothesis_choice

        parts = ["pytest", f"--backend={self.backend_name}", f"--backendconf-select={node_id}"]
        zoo = self.config.getoption("backendconf_zoo", "synthetic")
        if zoo != "synthetic":
            parts.append(f"--backendconf-zoo={zoo}")
        for plugin in self.config.known_args_namespace.plugins or []:
            if not plugin.startswith("no:"):
                parts += ["-p", plugin]
        # The same inputs again: the profile, and the seed unless the profile is derandomized.
        profile, seed = hypothesis_choice(self.config)
        parts.append(f"--backendconf-hypothesis={profile}")
        if profile != "ci":
            parts.append(f"--hypothesis-seed={seed}")
        return shlex.join(parts)


def id_matches(name: str, pattern: str) -> bool:
    """Whether a check (``parity::x[float16]``) matches a selection or known-failure key.

    An exact id always matches itself: ``[float16]`` in an id is not an
    fnmatch character class. Otherwise the key is an fnmatch pattern, with or
    without the ``backendconf::`` prefix.
    """
    full = f"{ROOT_ID}::{name}"
    if pattern in (full, name):
        return True
    return fnmatch.fnmatchcase(full, pattern) or fnmatch.fnmatchcase(name, pattern)


def _conformance_dir() -> Any:
    from pathlib import Path

    from . import conformance

    return Path(conformance.__file__).parent


def suite_only(config: pytest.Config) -> bool:
    """No test paths on the command line: run the suite alone, not the current folder."""
    return config.args_source != pytest.Config.ArgsSource.ARGS

