"""The conformance suite as pytest items: checks, collection, outcomes, reproduction.

Each category module in ``conformance/`` yields `Check` records from the
spec data; this module turns them into `ConformanceItem`s whose ids are
stable across machines (``backendconf::parity::small_cnn[float16]``), so
that known-failure files and reports can name them.

With ``--backend`` and no test paths, only the suite runs; with paths, the
suite runs beside the tests found there (a vendor's own regression tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator, Literal

import pytest

from .. import conformance
from .._quoting import shell_command
from ..backend import TorchScriptBackend
from ..checks import CATEGORIES, ROOT_ID, Check, CheckContext, CheckFailed, CheckOutcome, id_matches, reason_text
from ._failure_text import failure_text
from ._hypothesis import hypothesis_choice
from ._preprocess_cache import CACHE_KEY, cache_off_notice, cache_summary
from ._categories import generate_checks
from ._outcome import OUTCOME_KEY, run_check

if TYPE_CHECKING:
    from ._batching import Batcher
    from ._context import SuiteContext
    from ._host import BackendHost
    from ._minify import Minimiser

#: torch's trace-structured logger: it logs a record (mostly empty) for every
#: export and compile step, which would fill every failure's captured log.
TORCH_TRACE_LOGGER = "torch.__trace"
#: ``1`` runs the checks in the pytest process, as ``--backendconf-in-process`` does (the project's
#: own tests set it for the many small runs that do not test isolation: each host costs a torch import).
IN_PROCESS_ENV = "BACKENDCONF_IN_PROCESS"


def _may_select(patterns: list[str], category: str) -> bool:
    """Whether ``--backendconf-select`` patterns may keep checks of ``category`` (no patterns: all)."""
    if not patterns:
        return True
    for pattern in patterns:
        head = pattern.removeprefix(f"{ROOT_ID}::")
        if "::" not in head or fnmatch.fnmatchcase(category, head.split("::", 1)[0]):
            return True
    return False


class _DropRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


class SuiteCollector(pytest.Collector):
    """The root of the generated items; it has no file, so its id is fixed.

    The suite plugin creates it beside whatever pytest collected from the
    command line and collects it through pytest's collect-report hooks, so the
    terminal counts its items and a failure to generate them is a collection
    error like any other.
    """

    def __init__(self, *, plugin: "SuitePlugin", ctx: SuiteContext, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plugin = plugin
        self.ctx = ctx

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        from ..conformance.real_models import zoo_keeps

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
            reproduce = self.plugin.reproduce_command(f"{ROOT_ID}::{name}", draws_inputs=check.draws_inputs)
            item = ConformanceItem.from_parent(
                self, name=name, check=check, ctx=self.ctx, reproduce=reproduce, suite=self.plugin
            )
            if real:
                item.add_marker("real_model")
            items.append(item)
        return items


class HostCheckFailed(CheckFailed):
    """A check failed in the backend host; ``error_record`` is the original exception's ``{type, module, message}``."""

    def __init__(self, message: str, error: dict[str, str] | None) -> None:
        super().__init__(message, error_record=error)


class ConformanceItem(pytest.Item):
    def __init__(
        self, *, check: Check, ctx: SuiteContext, reproduce: str, suite: "SuitePlugin | None" = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.ctx = ctx
        self.reproduce = reproduce
        self.suite = suite
        #: The minimal reproduction of its failure (`suite._minify`), for the failure text and the report.
        self.reproduction: dict | None = None
        self.add_marker(check.category)

    def runtest(self) -> None:
        reason = self.suite.not_applicable(self.check) if self.suite is not None else None
        if reason:
            self._apply(CheckOutcome("skipped", reason))  # raises pytest's skip
            return
        batcher = self.suite.batcher() if self.suite is not None else None
        batched = batcher.outcome(self) if batcher is not None else None
        if batched is not None:  # decided by a batch that shared its lowering (`_batching`)
            if batched.outcome == "failed":
                self._minimise(batched.error, batched.message, None)
            self._apply(batched)
            return
        host = self.suite.host() if self.suite is not None else None
        check = self.check
        if host is None:
            outcome = run_check(check, self.ctx)
        else:
            from ._host import model_key

            model = model_key(check.category, check.name, check.case, _dtype(check, self.ctx))
            outcome = host.run(check.id, _subject(check, self.ctx), model, runs_backend=check.requires_available())
        if batcher is not None:
            batcher.ran_alone(check, outcome.outcome, outcome.message)
        if outcome.outcome == "failed":
            self._minimise(outcome.error, outcome.message, outcome.ended)
        self._apply(outcome)

    def _minimise(self, error: dict | None, message: str, ended: dict | None) -> None:
        """Shrink the failed model check to a minimal reproduction (not a known failure: those are expected)."""
        minimiser = self.suite.minimiser() if self.suite is not None else None
        if minimiser is None or self.get_closest_marker("xfail") is not None:
            return
        self.reproduction = minimiser.reproduce(self.check, self.ctx, error, message, ended)

    def _apply(self, outcome: CheckOutcome) -> None:
        """Keep the outcome for the reports (`OUTCOME_KEY`) and end the test as it says.

        A failure raised in this process is raised again (a debugger stops where the check raised it);
        one from the backend host or a batch is a `HostCheckFailed` carrying the original error record.
        """
        self.stash[OUTCOME_KEY] = outcome
        for w in outcome.warnings:
            category = _warning_class(w["module"], w["category"])
            message = w["message"] if category is not UserWarning else f"{w['category']}: {w['message']}"
            warnings.warn_explicit(message, category, w["filename"], w["lineno"])
        if outcome.stderr:
            self.add_report_section("call", "stderr (backend host)", outcome.stderr)
        if outcome.details is not None:  # e.g. delegation's node counts, a failed comparison's numerics (JUnit)
            self.user_properties.append(("backendconf", outcome.details))
        if outcome.outcome == "passed":
            return
        if outcome.exception is not None:
            raise outcome.exception
        if outcome.outcome == "failed":
            raise HostCheckFailed(outcome.message, outcome.error)
        pytest.skip(reason_text(outcome))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CheckFailed):
            text = str(excinfo.value)
        else:
            text = failure_text(excinfo)
        from ._minify import reproduction_line

        line = reproduction_line(self.reproduction)
        return f"{text}\nreproduce: {self.reproduce}" + (f"\n{line}" if line else "")

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        return self.path, None, f"{ROOT_ID}::{self.check.category}::{self.check.name}"


class SuitePlugin:
    """Registered (as ``backendconf_suite``) when a backend is selected."""

    def __init__(self, config: pytest.Config, ctx_factory: Callable[[], SuiteContext], backend_name: str) -> None:
        self.config = config
        self._ctx_factory = ctx_factory
        self.backend_name = backend_name
        self.ctx: SuiteContext | None = None
        self._trace_filter: logging.Filter | None = None
        #: The backend host, started with the first check.
        self._host: BackendHost | None = None
        #: Why checks that need the backend available are not applicable here (None: it is available).
        self._unavailable: str | None = None
        from ._minify import minify_choice
        from ._minify_ledger import run_budget_choice

        #: The batches of checks that share a lowering (`_batching.Batcher`); False: batching is off.
        self._batcher: Batcher | Literal[False] | None = None
        #: The items of this session, in order (a batch takes the next checks of its group).
        self._items: list[pytest.Item] = []
        #: The minimiser of failed model checks (started with the first failure); False: minify is off.
        #: A bad --backendconf-minify value is a usage error now, not at the first failure.
        self._minimiser: Minimiser | Literal[False] | None = None if minify_choice(config) else False
        #: The seconds the run may spend on minimal reproductions (None: no limit); a bad value: a usage error now.
        self._minify_run_budget = run_budget_choice(config) if self._minimiser is None else None
        #: The preprocess-cache counts of the xdist workers (the controller prints the sum).
        self._cache_elsewhere: dict[str, int] = {}
        #: Why the preprocess cache cannot serve the backend, for the summary (None: it can, or no cache).
        self._cache_notice: str | None = None

    def in_process(self) -> bool:
        """Checks run in this process: asked for, or a debugger wants to stop in them."""
        options = self.config.option
        return bool(
            getattr(options, "backendconf_in_process", False)
            or getattr(options, "usepdb", False)
            or getattr(options, "trace", False)
            or os.environ.get(IN_PROCESS_ENV) == "1"
        )

    def host(self) -> BackendHost | None:
        """The backend host the checks run in, or None when they run in this process."""
        if self.in_process():
            return None
        if self._host is None:
            from ._host import DEFAULT_MAX_RSS_MIB, DEFAULT_TIMEOUT, BackendHost

            ctx = self.ctx if self.ctx is not None else self._ctx_factory()
            factory = getattr(self.config, "_tmp_path_factory", None)
            timeout = self.config.getoption("backendconf_timeout", None)
            timeout = DEFAULT_TIMEOUT if timeout is None else timeout
            max_rss = self.config.getoption("backendconf_max_rss", None)
            max_rss = DEFAULT_MAX_RSS_MIB if max_rss is None else max_rss
            # The host builds its context from this context's own options; its temporary folders go in this run's.
            options = dataclasses.replace(
                ctx.options, tmp_root=str(factory.getbasetemp()) if factory is not None else None
            )
            self._host = BackendHost(
                options, timeout=timeout or None, max_rss=int(max_rss * 2**20) or None, shared=self._shared_folder()
            )
            ctx.host = self._host  # the benchmarks read its export counts
        return self._host

    def _shared_folder(self) -> str | None:
        """A folder of this run that all its pytest processes share (pytest-xdist workers too), or None."""
        found = self._run_file("backendconf-hangs")
        return None if found is None else str(found)

    def _run_file(self, name: str) -> Path | None:
        """``name`` in the temporary folder of this run that all its pytest processes share, or None."""
        factory = getattr(self.config, "_tmp_path_factory", None)
        if factory is None:
            return None
        base = Path(factory.getbasetemp())
        # An xdist worker's basetemp is a folder of the controller's, which is this run's alone.
        run = base.parent if hasattr(self.config, "workerinput") else base
        return run / name

    def batcher(self) -> Batcher | None:
        """The `_batching.Batcher` of this process, or None when batching is off (`batching_choice`)."""
        if self._batcher is None:
            self._batcher = self._make_batcher() or False
        return self._batcher or None

    def _make_batcher(self) -> Batcher | None:
        from ._batching import DEFAULT_SIZE, Batcher, batching_choice
        from ..conformance import section

        if self.ctx is None or self._unavailable is not None:
            return None
        if not batching_choice(self.config, self.ctx.capabilities):
            return None
        same_scope = False
        worker = getattr(self.config, "workerinput", None)
        if worker is not None:
            # An xdist worker: a batch may hold only checks this worker runs, i.e. of its scope, which
            # holds only when the suite's grouping schedules them (`_xdist`).
            from ._xdist import GROUPED

            if not worker.get(GROUPED):
                return None
            same_scope = True
        size = int(section("ops").get("batch_size", DEFAULT_SIZE))
        return Batcher(self._items, size, self.host(), self.ctx, same_scope)

    def minimiser(self) -> Minimiser | None:
        """The `suite._minify.Minimiser` of this process, or None with ``--backendconf-minify=off`` (or a debugger)."""
        options = self.config.option
        if getattr(options, "usepdb", False) or getattr(options, "trace", False):
            return None  # the debugger wants the failure now, not after a minute of shrinking
        if isinstance(getattr(self.ctx, "backend", None), TorchScriptBackend):
            return None  # minimisation shrinks torch.export programs; a TorchScript model is not one
        if self._minimiser is None:
            from ..diagnostics import DEFAULT_BUDGET
            from ._host import DEFAULT_TIMEOUT
            from ._minify import Minimiser
            from ._minify_ledger import MinifyLedger

            budget = self.config.getoption("backendconf_minify_budget", None)
            timeout = self.config.getoption("backendconf_timeout", None)
            timeout = (DEFAULT_TIMEOUT if timeout is None else timeout) or None

            def candidate_timeout() -> float | None:
                # A candidate gets what the next check would: after a hang, the host's shortened timeout.
                host = self.host()
                return host.check_timeout() if host is not None else timeout

            ledger = MinifyLedger(self._run_file("backendconf-minify.json"), self._minify_run_budget)
            self._minimiser = Minimiser(
                self.config, DEFAULT_BUDGET if budget is None else budget, candidate_timeout, ledger
            )
        return self._minimiser or None

    def not_applicable(self, check: Check) -> str | None:
        if self._unavailable is None or not check.requires_available():
            return None
        return self._unavailable

    def pytest_sessionfinish(self) -> None:
        if self._host is not None:
            self._host.close()
        if self.config.stash.get(CACHE_KEY, None) is not None:
            from ..lowering import use_preprocess_cache

            self._cache_final = self.cache_counts()  # the summary is written after this hook
            use_preprocess_cache(None)  # this session's backend: no later lowering in this process uses it
        batcher = self._batcher or None
        output = getattr(self.config, "workeroutput", None)
        if batcher is not None and output is not None:  # an xdist worker: the controller prints the sum
            output["backendconf_batched"] = batcher.counts()
        if output is not None:
            output["backendconf_cache"] = getattr(self, "_cache_final", None) or self.cache_counts()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        cache = getattr(node, "workeroutput", {}).get("backendconf_cache") or {}
        for what, n in cache.items():
            self._cache_elsewhere[what] = self._cache_elsewhere.get(what, 0) + n
        counts = getattr(node, "workeroutput", {}).get("backendconf_batched")
        if counts:
            from ._batching import Batcher

            self._batched_elsewhere = Batcher.add_counts(getattr(self, "_batched_elsewhere", None), counts)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from ._batching import Batcher

        batcher = self._batcher or None
        counts = batcher.counts() if batcher is not None else getattr(self, "_batched_elsewhere", None)
        if counts and counts["batches"]:
            terminalreporter.write_line(Batcher.summary(counts))
        cache = self.config.stash.get(CACHE_KEY, None)
        if cache is not None and not hasattr(self.config, "workerinput"):
            found = dict(getattr(self, "_cache_final", None) or self.cache_counts())
            for what, n in self._cache_elsewhere.items():
                found[what] = found.get(what, 0) + n
            terminalreporter.write_line(cache_summary(cache, found))
            if self._cache_notice:
                terminalreporter.write_line(self._cache_notice)

    def cache_counts(self) -> dict[str, int]:
        """What this process's preprocess cache found: in its backend host, or here when checks run here."""
        from ..lowering import active_cache

        if self._host is not None:
            return dict(self._host.cache_counts)
        cache = active_cache()
        return dict(cache.counts) if cache is not None else {}

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
        if config.stash.get(CACHE_KEY, None) is not None and not hasattr(config, "workerinput"):
            from ..registry import active_registry

            # Judged on the backend as registered, before any check: what checks set on it is no setting.
            registry = active_registry()
            self._cache_notice = cache_off_notice(registry.get(self.backend_name)) if registry is not None else None
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
        from ..report import counted

        lines = [f"backendconf: {counted(count, 'conformance check')} for backend {self.backend_name!r}"]
        # One-line notices from the categories (e.g. ops data missing for this torch).
        lines += [f"backendconf: {text}" for text in getattr(self.ctx, "notices", None) or []]
        return "\n".join(lines)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config, specs: Any) -> None:
        # pytest-xdist's controller collects nothing. Where this torch build has no shipped ops samples
        # and none cached, it discovers them here, once, before any worker starts: the workers and
        # the backend host then read the cache instead of each discovering for minutes.
        if not _may_select(self.config.getoption("backendconf_select") or [], "ops"):
            return
        from ..conformance import ops

        ctx = self._ctx_factory()
        if not isinstance(ctx.backend, TorchScriptBackend) and ops.samples_needed(ctx):
            ctx.discovery_progress = self._progress_line
            ops.prepare_samples(ctx)

    def _progress_line(self, text: str) -> None:
        """A line on the terminal while collection runs (pytest captures the output meanwhile)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line(f"backendconf: ops discovery: {text}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        ctx = self.ctx = self._ctx_factory()  # kept for tools (benchmarks) that inspect the session
        if not hasattr(config, "workerinput"):
            ctx.discovery_progress = self._progress_line  # a worker's output would go nowhere
        available, why = ctx.registered.availability()
        if not available:
            self._unavailable = (
                f"not applicable: backend {self.backend_name!r} is not available here ({why}); the availability "
                "rows and the lowering-side checks ran, the rest need is_available() True"
            )
        root = SuiteCollector.from_parent(
            session, name=ROOT_ID, nodeid=ROOT_ID, path=_conformance_dir(), plugin=self, ctx=ctx
        )
        # The public collect hooks, as pytest's own collection calls them: the
        # terminal counts these items (`--co` says how many), and plugins see a
        # collect report for the suite.
        root.ihook.pytest_collectstart(collector=root)
        report = root.ihook.pytest_make_collect_report(collector=root)
        root.ihook.pytest_collectreport(report=report)
        # A failed report counts as a collection error (the session plugin sees it too).
        items.extend(node for node in report.result if isinstance(node, pytest.Item))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # The items in the order they run, after every plugin's selection (-k, -m, xdist's share).
        self._items = list(session.items)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if isinstance(item, ConformanceItem) and report.skipped and isinstance(report.longrepr, tuple):
            # "SKIPPED [1] backendconf::parity::x[float16]: unsupported: …", not
            # the line of this package that raised the skip; the checks that are
            # not applicable share one line ("SKIPPED [164] backendconf: not applicable: …").
            reason = report.longrepr[2]
            where = ROOT_ID if str(reason).removeprefix("Skipped: ").startswith("not applicable: ") else item.nodeid
            # pytest prints a skip's location without a line when it has none; its annotation wants an int.
            report.longrepr = (where, None, reason)  # type: ignore[assignment]
        return report

    def reproduce_command(self, node_id: str, *, draws_inputs: bool = True) -> str:
        """The command that runs one check again; the seed only for a check that draws inputs from it."""
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
        if profile != "ci" and draws_inputs:
            parts.append(f"--hypothesis-seed={seed}")
        return shell_command(parts)


def _subject(check: Check, ctx: CheckContext) -> str:
    """``model small_cnn, dtype float16``: what a check runs on, for a message when its process dies."""
    if check.case is None or check.case not in ctx.cases:
        return f"check {check.id} (no single model)"
    dtype = _dtype(check, ctx)
    return f"model {check.case}" + (f", dtype {dtype}" if dtype else "")


def _dtype(check: Check, ctx: CheckContext) -> str | None:
    """The dtype of the model a per-model check runs (its id's bracket, else the case's first)."""
    if check.case is None or check.case not in ctx.cases:
        return None
    bracket = check.name.rpartition("[")[2].rstrip("]") if check.name.endswith("]") else ""
    return bracket if bracket in ctx.dtypes_for(ctx.cases[check.case]) else ctx.first_dtype(check.case)


def _warning_class(module: str, name: str) -> type[Warning]:
    """A warning's class from a module already imported here, else `UserWarning` (nothing is imported)."""
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) and issubclass(found, Warning) else UserWarning


def _conformance_dir() -> Path:
    return Path(conformance.__file__).parent


def suite_only(config: pytest.Config) -> bool:
    """No test paths on the command line: run the suite alone, not the current folder."""
    return config.args_source != pytest.Config.ArgsSource.ARGS
