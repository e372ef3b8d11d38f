"""CI gating for the conformance suite: the pytest plugin that applies known failures and writes the report.

Registered (as ``backendconf_gating``) beside the suite when a backend is
selected. What each test's outcome means for the suite is decided where the
test runs and travels on its reports, so that the controller of a
pytest-xdist run, which collects nothing, can still report and summarize.
The known-failures files are read and written by `report._known_failures`, the
report's schema is `report._report`'s; the workflow is in ``docs/ci-gating.md``.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..checks import ROOT_ID
from ._hypothesis import WORKERINPUT_KEY, hypothesis_choice, report_entry
from ..report import KnownFailureIndex, describe_machine, machine_line
from ..report import KnownFailure, KnownFailuresUpdate, edited_known_failures, existing_text
from ..report import load_known_failures, merge_known_failures
from ..report import (
    FAILING,
    ReportTest,
    backend_entry,
    combined,
    counted,
    declared_scope,
    end_lines,
    entries_here,
    entry_for,
    known_failures_entry,
    known_failures_line,
    ops_matrix_of,
    report_document,
    run_entry,
    unexpected_pass_text,
)
from ._phases import REPORT_ATTR, error_of, phase_outcome, report_reason, skip_reason
from ..archive import OutputFile, OutputPathError, output_file
from ._categories import generate_checks
from ._golden import GOLDEN_KEY
from ._suite import ConformanceItem
from ._outcome import OUTCOME_KEY
from ._shards import SHARD_KEY
from ..errors import StaleKnownFailureWarning

if TYPE_CHECKING:
    from ..registry import RegisteredBackend

_ENTRY_KEY = pytest.StashKey[KnownFailure]()


def output_path(config: pytest.Config, option: str, value: str) -> OutputFile:
    """An output option's file, checked before the run so that a typo does not cost a whole run (`output_file`).

    Standard output (``-``, ``/dev/stdout``) is refused: pytest's own output goes there, and a
    document mixed into it could not be read back.
    """
    try:
        return output_file(option, value, base=config.invocation_params.dir, stdout_carries="pytest's own output")
    except OutputPathError as exc:
        raise pytest.UsageError(str(exc)) from None


class GatingPlugin:
    """Known failures, ``--backendconf-report``, the score summary and JUnit properties."""

    def __init__(self, config: pytest.Config, selected: RegisteredBackend, target: dict | None = None) -> None:
        self.config = config
        self.selected = selected
        #: The device of a target command (`target.probe`), recorded as the report's ``run.target``.
        self.target = target
        self.workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        known = config.getoption("backendconf_known_failures")
        self.known_path = Path(config.invocation_params.dir, known) if known else None
        loaded = load_known_failures(self.known_path, "--backendconf-known-failures") if self.known_path else []
        # An entry scoped to other machines (its `when`) is not applied here: its check must pass.
        self.machine = describe_machine()
        self.known, self.elsewhere = self._here(loaded)
        self._index: KnownFailureIndex | None = None
        report = config.getoption("backendconf_report")
        self.report_file = output_path(config, "--backendconf-report", report) if report else None
        page = config.getoption("backendconf_html", None)
        self.html_file = output_path(config, "--backendconf-html", page) if page else None
        write = config.getoption("backendconf_write_known_failures")
        self.write_file = output_path(config, "--backendconf-write-known-failures", write) if write else None
        self.previous: list[KnownFailure] = list(self.known)
        old = self.write_file.old_file if self.write_file is not None else None
        if old is not None and old != self.known_path:
            here, elsewhere = self._here(load_known_failures(old, "--backendconf-write-known-failures"))
            self.previous += here
            self.elsewhere += [e for e in elsewhere if e not in self.elsewhere]
        self.results: dict[str, ReportTest] = {}
        self.durations: dict[str, float] = {}
        self.order: dict[str, int] = {}
        #: Patterns (of either file) that match no check of the suite; None while unknown.
        self.stale: set[str] | None = None
        #: The ops checks' sample set (`conformance.ops.samples_record`); None without ops checks.
        self.samples: dict[str, Any] | None = None
        self.workers = 0
        self.started = time.time()
        self.notes: list[str] = []

    # --- configuration, collection ------------------------------------------------

    def _here(self, entries: list[KnownFailure]) -> tuple[list[KnownFailure], list[KnownFailure]]:
        """(the entries that apply on this machine, those scoped to other machines)."""
        return entries_here(entries, self.machine)

    def pytest_report_header(self, config: pytest.Config) -> list[str] | None:
        lines = [f"backendconf: machine {machine_line(self.machine)}"]
        if self.known_path is None:
            return lines
        return [*lines, known_failures_line(self.known_path, self.known, self.elsewhere)]

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKERINPUT_KEY] = list(hypothesis_choice(self.config))
        self.workers = int(node.workerinput.get("workercount", self.workers + 1))

    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        # A plain hookimpl: after the suite (tryfirst) adds its items, before -k/-m deselect any.
        suite = [item for item in items if isinstance(item, ConformanceItem)]
        for item in suite:
            check = item.check
            item.user_properties += [
                ("category", check.category),
                ("stage", check.stage),
                ("reproduce", item.reproduce),
            ]
            if check.case is not None:
                item.user_properties.append(("case", check.case))
            entry = self._entry_for(item)
            if entry is not None:
                item.stash[_ENTRY_KEY] = entry
                item.user_properties.append(("known_failure", entry.pattern))
                reason = f"known failure: {entry.reason}" + (f" ({entry.link})" if entry.link else "")
                # A non-strict entry's pass is an XPASS that does not fail the run; the summary counts it apart.
                item.add_marker(pytest.mark.xfail(strict=entry.strict, reason=reason))
        self.stale = self._stale(suite)
        if any(item.check.category == "ops" for item in suite):
            from ..conformance.ops import samples_record

            # What the ops checks were made from: a sample set that shrank or changed shows in the report.
            self.samples = samples_record(suite[0].ctx)
            if self.workerinput is not None:
                config.workeroutput["backendconf_samples"] = self.samples  # type: ignore[attr-defined]
        if self.stale is not None:
            for entry in self.known:
                if entry.pattern in self.stale:
                    warnings.warn_explicit(
                        StaleKnownFailureWarning(
                            f"known-failures entry {entry.pattern!r} matches no conformance check of backend "
                            f"{self.selected.name!r} (renamed or removed?): fix its pattern or remove it "
                            f"from {self.known_path}"
                        ),
                        StaleKnownFailureWarning,
                        filename=str(self.known_path),
                        lineno=entry.line,
                    )
            if self.workerinput is not None:
                config.workeroutput["backendconf_stale"] = sorted(self.stale)  # type: ignore[attr-defined]

    def _entry_for(self, item: ConformanceItem) -> KnownFailure | None:
        """The entry naming ``item``: one with its exact id first, else the first pattern matching it."""
        if self._index is None:
            self._index = KnownFailureIndex(self.known)
        return entry_for(self._index, item.nodeid)

    def _stale(self, suite: list[ConformanceItem]) -> set[str] | None:
        patterns = {e.pattern for e in self.previous}
        if not patterns:
            return set()
        quick = self.config.getoption("backendconf_ops", None) == "quick"
        if self.config.getoption("backendconf_select") or quick:
            # The run is narrowed: judge the entries against every check, not only the selected ones,
            # and against the default operator matrix that the quick one is a part of.
            if not suite:
                return None
            ctx = suite[0].ctx
            ids = [f"{ROOT_ID}::{c.category}::{c.name}" for c in generate_checks(ctx)]
            if quick:
                from ..conformance.ops import names_in_default_selection

                ids += [f"{ROOT_ID}::ops::{name}" for name in names_in_default_selection(ctx)]
        else:
            ids = [item.nodeid for item in suite]
        index = KnownFailureIndex(self.previous)
        matched = {index.entries[i].pattern for test_id in ids for i in index.matching(test_id)}
        return patterns - matched

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.order = {item.nodeid: i for i, item in enumerate(session.items)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.order:
            self.order = {nodeid: i for i, nodeid in enumerate(ids)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", {})
        if output.get("backendconf_stale") is not None:
            self.stale = set(output["backendconf_stale"])
        if output.get("backendconf_samples") is not None:
            self.samples = output["backendconf_samples"]

    # --- running ------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield  # after the skipping plugin has turned xfail markers into outcomes
        if not isinstance(item, ConformanceItem):
            return report
        entry = item.stash.get(_ENTRY_KEY, None)
        # The check's own verdict, kept by the item (`OUTCOME_KEY`); it belongs to the call phase.
        check = item.stash.get(OUTCOME_KEY, None) if report.when == "call" else None
        phase = phase_outcome(report, listed=entry is not None, check=check, strict=entry is None or entry.strict)
        test = None
        if phase is not None:
            verdict, outcome = phase
            error = reason = None
            if outcome in FAILING:
                error = error_of(call.excinfo)
            elif outcome in ("unsupported", "skipped"):
                reason = report_reason(check) if check is not None else skip_reason(report)
            elif outcome == "unexpected_pass" and entry is not None and report.failed:
                report.longrepr = unexpected_pass_text(
                    item.nodeid, entry, self.known_path, self.selected.name, item.reproduce
                )
            test = ReportTest(
                id=item.nodeid,
                category=item.check.category,
                outcome=outcome,
                verdict=verdict,
                case=item.check.case,
                stage=item.check.stage,
                reproduce=item.reproduce,
                error=error,
                reason=reason,
                known_failure=entry.as_json() if entry is not None else None,
                details=check.details if check is not None else None,
                reproduction=item.reproduction if outcome in ("failed", "error") else None,
                check_outcome=check.outcome if check is not None else None,
                rerun=check.rerun if check is not None else None,
            )
        # The phase's record reaches an xdist controller as JSON, on this report.
        setattr(
            report,
            REPORT_ATTR,
            {"test": test.to_json() if test is not None else None, "location": list(item.check.location())},
        )
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Any:
        data = getattr(report, REPORT_ATTR, None)
        if data is None or self.workerinput is not None:
            return (yield)
        self._record(report, data)
        longrepr = report.longrepr
        if not (report.skipped and isinstance(longrepr, tuple) and longrepr[1] is None):
            return (yield)
        # JUnit writes a skip as "{file}:{line}: {reason}", which gives
        # "<id>:None:" for the check id the terminal shows: while the report is
        # logged, point it at the check's code, then give the id back.
        report.longrepr = (data["location"][0], data["location"][1], longrepr[2])
        try:
            return (yield)
        finally:
            report.longrepr = longrepr

    def _record(self, report: pytest.TestReport, data: dict[str, Any]) -> None:
        # Every phase's time counts, a setup that passed (and has no record of its own) too.
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if data["test"] is not None:
            phase = ReportTest.from_json(data["test"])
            self.results[report.nodeid] = combined(self.results.get(report.nodeid), phase)

    # --- the end of the run ---------------------------------------------------------

    def finished(self) -> list[ReportTest]:
        """The tests that ran, in collection order."""
        done = [
            dataclasses.replace(r, duration=self.durations[r.id]) if r.id in self.durations else r
            for r in self.results.values()
        ]
        return sorted(done, key=lambda r: (self.order.get(r.id, len(self.order)), r.id))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.workerinput is not None:
            return
        results = self.finished()
        golden = self.config.stash.get(GOLDEN_KEY, None)
        if golden is not None:
            self._write_golden_index(results)
            if self.config.getoption("backendconf_replay_on_target", False) and self.target is not None:
                results = self._replay_on_target(session, golden, results)
        document = None
        if self.report_file is not None or self.html_file is not None:
            document = report_document(
                results,
                backend=backend_entry(self.selected),
                run=run_entry(
                    self.started,
                    int(session.exitstatus),  # a replay on the target may have failed the run
                    select=self.config.getoption("backendconf_select") or [],
                    workers=self.workers,
                    shard=self.config.stash.get(SHARD_KEY, None),
                )
                | ({"target": self.target} if self.target is not None else {}),
                pytest_version=pytest.__version__,
                hypothesis=report_entry(self.config),
                known_failures=known_failures_entry(self.known_path, self.known, self.stale),
                ops=ops_matrix_of(self.selected, results, self.samples),
            )
        if self.report_file is not None:
            self.report_file.write(json.dumps(document, indent=2) + "\n")
            self.notes.append(f"report written to {self.report_file.path}")
        if self.html_file is not None and document is not None:
            from ..report import render

            from ..report import parse_report

            # The page is drawn from the report alone, read back as any report is.
            self.html_file.write(render([parse_report(document, str(self.html_file.path))]))
            self.notes.append(f"HTML report written to {self.html_file.path}")
        if self.write_file is not None:
            if exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
                self.notes.append(f"known failures not written to {self.write_file.path}: the run did not complete")
            else:
                self._write_known_failures(results)

    def _write_golden_index(self, results: list[ReportTest]) -> None:
        from ._golden import write_index

        folder = self.config.stash[GOLDEN_KEY]
        listed, removed = write_index(folder, results, self.selected.name)
        dropped = f"; {counted(removed, 'archive')} of checks that did not pass removed" if removed else ""
        self.notes.append(
            f"golden folder {folder}: {counted(listed, 'archive')} with bundled inputs "
            f"(replay them with: backendconf replay {folder}){dropped}"
        )

    def _replay_on_target(self, session: pytest.Session, folder: Path, results: list[ReportTest]) -> list[ReportTest]:
        """Replay the golden archives just indexed on the device (`target.replay_archives`, as ``backendconf
        replay`` does): one ``replay`` test per bundle beside the checks; a bundle that does not pass fails the run."""
        from ..report import replay_test_results
        from ..target import replay_archives
        from ._golden import INDEX

        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
        paths = [str(folder / entry["archive"]) for entry in index["archives"]]
        if not paths:
            self.notes.append("replay on the target device: no golden archives to replay (no parity check passed)")
            return results
        # plugins=None: the modules that registered the backend here, by name, as for every target-stage check.
        replayed = replay_test_results(replay_archives(paths, plugins=None))
        for test in replayed:
            self.results[test.id] = test
        passed = sum(t.outcome == "passed" for t in replayed)
        self.notes.append(
            f"replay on the target device {(self.target or {}).get('machine')}: {passed}/{len(replayed)} bundles of "
            f"{counted(len(paths), 'golden archive')} match their expected outputs"
        )
        if passed < len(replayed) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return results + replayed

    def _write_known_failures(self, results: list[ReportTest]) -> None:
        assert self.write_file is not None
        # Entries for other machines are kept as written: this run cannot judge them.
        removed: dict[str, str] = {}
        entries = sorted(
            merge_known_failures(results, self.previous, self.stale, removed) + self.elsewhere,
            key=lambda e: e.pattern,
        )
        # The file is edited line by line: the comments people wrote in it stay.
        old = self.write_file.old_file
        text, rewritten = edited_known_failures(existing_text(old) if old else None, entries, self.selected.name)
        self.write_file.write(text)
        update = KnownFailuresUpdate(text, entries, self.previous + self.elsewhere, removed, rewritten)
        self.notes += update.lines(str(self.write_file.path))

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.workerinput is not None:
            return
        results = self.finished()
        if not results and not self.notes:
            return
        tr = terminalreporter
        tr.write_sep("=", f"backendconf: conformance of backend {self.selected.name!r}")
        for line in end_lines(results, *declared_scope(self.selected)):
            tr.write_line(line)
        for note in self.notes:
            tr.write_line(f"backendconf: {note}")
