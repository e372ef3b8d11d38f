"""The conformance suite as pytest items: checks, collection, outcomes, reproduction.

Each category module in ``conformance/`` yields `Check` records from the
spec data; this module turns them into `ConformanceItem`s whose ids are
stable across machines (``backendconf::parity::small_cnn[float16]``), so
that known-failure files and reports can name them.

With ``--backend`` and no test paths, only the suite runs; with paths, the
suite runs beside the tests found there (a vendor's own regression tests).
"""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path
from typing import Any, Callable

import pytest

from . import conformance
from ._check import CATEGORIES, ROOT_ID, Check, CheckFailed, Unsupported, id_matches
from ._hypothesis import hypothesis_choice
from .conformance import availability, contract, delegation, parity, reliability, serialization, symbolication

#: torch's trace-structured logger: it logs a record (mostly empty) for every
#: export and compile step, which would fill every failure's captured log.
TORCH_TRACE_LOGGER = "torch.__trace"


class _DropRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False

#: The module of each category: it yields the category's `Check` records from ``checks(ctx)``.
CATEGORY_MODULES = {
    "contract": contract,
    "parity": parity,
    "availability": availability,
    "serialization": serialization,
    "symbolication": symbolication,
    "reliability": reliability,
    "delegation": delegation,
}
assert tuple(CATEGORY_MODULES) == CATEGORIES, "a category needs its module here and its name in _check.CATEGORIES"


def generate_checks(ctx: Any) -> list[Check]:
    """Every check of every category for the context's backend, in a stable order."""
    found: list[Check] = []
    for module in CATEGORY_MODULES.values():
        found.extend(module.checks(ctx))
    return found


class SuiteCollector(pytest.Collector):
    """The root of the generated items; it has no file, so its id is fixed.

    The suite plugin creates it beside whatever pytest collected from the
    command line and collects it through pytest's collect-report hooks, so the
    terminal counts its items and a failure to generate them is a collection
    error like any other.
    """

    def __init__(self, *, plugin: "SuitePlugin", ctx: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plugin = plugin
        self.ctx = ctx

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        from .conformance.real_models import zoo_keeps

        selected = self.config.getoption("backendconf_select") or []
        zoo = self.config.getoption("backendconf_zoo", "synthetic")
        items: list[pytest.Item | pytest.Collector] = []
        for check in generate_checks(self.ctx):
            name = f"{check.category}::{check.name}"
            if selected and not any(id_matches(name, p) for p in selected):
                continue
            real = zoo_keeps(self.ctx, check, zoo)
            if real is None:
                continue
            reproduce = self.plugin.reproduce_command(f"{ROOT_ID}::{name}")
            item = ConformanceItem.from_parent(self, name=name, check=check, ctx=self.ctx, reproduce=reproduce)
            if real:
                item.add_marker("real_model")
            items.append(item)
        return items


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
        self._trace_filter: logging.Filter | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        # Keep torch's trace logger out of the captured logs. It does not
        # propagate, but pytest attaches its capture handlers to non-propagating
        # loggers too; its records only matter to torch's own trace handler,
        # which writes nothing unless TORCH_TRACE names a folder, so drop them
        # unless it does.
        if not os.environ.get("TORCH_TRACE"):
            self._trace_filter = _DropRecords()
            logging.getLogger(TORCH_TRACE_LOGGER).addFilter(self._trace_filter)
        for category in CATEGORIES:
            config.addinivalue_line("markers", f"{category}: conformance checks of the {category} category")
        config.addinivalue_line("markers", "real_model: conformance checks on a real-world model (--backendconf-zoo)")
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

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._trace_filter is not None:
            logging.getLogger(TORCH_TRACE_LOGGER).removeFilter(self._trace_filter)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_header(self, config: pytest.Config) -> Any:
        lines = yield
        if not suite_only(config):
            return lines
        # Run alone, the suite uses only its own Hypothesis profile (the
        # "backendconf: hypothesis profile" line); Hypothesis's line about the
        # global profile, printed with -v, would be a second, unused one.
        return [line for line in lines if not (isinstance(line, str) and line.startswith("hypothesis profile "))]

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> str | None:
        count = sum(isinstance(item, ConformanceItem) for item in items)
        return f"backendconf: {count} conformance checks for backend {self.backend_name!r}"

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
        ctx = self.ctx = self._ctx_factory()  # kept for tools (benchmarks) that inspect the session
        root = SuiteCollector.from_parent(session, name=ROOT_ID, nodeid=ROOT_ID, path=_conformance_dir(), plugin=self, ctx=ctx)
        # The public collect hooks, as pytest's own collection calls them: the
        # terminal counts these items (`--co` says how many), and plugins see a
        # collect report for the suite.
        root.ihook.pytest_collectstart(collector=root)
        report = root.ihook.pytest_make_collect_report(collector=root)
        root.ihook.pytest_collectreport(report=report)
        # A failed report counts as a collection error (the session plugin sees it too).
        items.extend(node for node in report.result if isinstance(node, pytest.Item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        report = yield
        if isinstance(item, ConformanceItem) and report.skipped and isinstance(report.longrepr, tuple):
            # "SKIPPED [1] backendconf::parity::x[float16]: unsupported: …", not
            # the line of this package that raised the skip.
            report.longrepr = (item.nodeid, None, report.longrepr[2])
        return report

    def reproduce_command(self, node_id: str) -> str:
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


def _conformance_dir() -> Path:
    return Path(conformance.__file__).parent


def suite_only(config: pytest.Config) -> bool:
    """No test paths on the command line: run the suite alone, not the current folder."""
    return config.args_source != pytest.Config.ArgsSource.ARGS

