"""CI gating for the conformance suite: known failures, the JSON report, the score summary.

Registered (as ``backendconf_gating``) beside the suite when a backend is
selected. What each test's outcome means for the suite is decided where the
test runs and travels on its reports, so that the controller of a
pytest-xdist run, which collects nothing, can still report and summarize.
The report schema and the workflow are documented in ``docs/ci-gating.md``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pytest

from ._suite import CATEGORIES, ROOT_ID, CheckFailed, ConformanceItem, generate_checks
from ._suite import id_matches as _suite_id_matches

if TYPE_CHECKING:
    from ._registry import RegisteredBackend

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPORT_SCHEMA = "backendconf-report"
#: (major, minor): a consumer accepts any minor version of the major it knows.
REPORT_SCHEMA_VERSION = (1, 1)  # 1.1: "ops" (the operator x dtype matrix) and tests[].numerics
#: Every outcome a conformance test can have in the report, mildest first.
OUTCOMES = ("passed", "skipped", "unsupported", "known_failure", "unexpected_pass", "failed", "error")
#: The outcomes of a test that did not work (what a known-failures file lists).
FAILING = ("failed", "error", "known_failure")
#: The report attribute that carries a conformance test's data (xdist serializes it).
REPORT_ATTR = "backendconf"
#: How many lines of an exception's message the report and the summary keep.
MESSAGE_LINES = 5

ENTRY_EXAMPLE = '"backendconf::parity::small_cnn[float16]" = { reason = "why it fails", link = "https://…" }'
_ENTRY_KEYS = {"reason", "link"}
_ENTRY_KEY = pytest.StashKey["KnownFailure"]()


class StaleKnownFailureWarning(pytest.PytestWarning):
    """A known-failures entry matches no conformance check of the selected backend."""


# --- known-failures files ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    """One entry of a known-failures file: a test-id pattern, why it fails, and where that is tracked."""

    pattern: str
    reason: str
    link: str = ""
    #: Where the entry is in its file, for warnings (0 when unknown).
    line: int = dataclasses.field(default=0, compare=False)

    def as_json(self) -> dict[str, str]:
        return {"pattern": self.pattern, "reason": self.reason, "link": self.link}

    def matches(self, test_id: str) -> bool:
        return id_matches(test_id, self.pattern)


def id_matches(test_id: str, pattern: str) -> bool:
    """Whether ``pattern`` names ``test_id`` (the rule of `_suite.id_matches`)."""
    return _suite_id_matches(test_id.removeprefix(f"{ROOT_ID}::"), pattern)


def load_known_failures(path: Path, option: str) -> list[KnownFailure]:
    """The entries of a known-failures file, in file order; a `pytest.UsageError` for any mistake."""
    where = f"{option}={path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise pytest.UsageError(
            f"{where}: the file does not exist. Fix the path, or write the file from a run with "
            f"--backendconf-write-known-failures={path}."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise pytest.UsageError(f"{where}: cannot read the file ({exc}).") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise pytest.UsageError(
            f"{where} is not valid TOML: {exc}. Each entry is one line, with the test id quoted as a key: "
            f"{ENTRY_EXAMPLE}"
        ) from None
    entries = []
    for pattern, value in data.items():
        entry = f"{path}: entry {pattern!r}"
        if not pattern.strip():
            raise pytest.UsageError(f"{entry}: the test-id pattern is empty; write the id of a conformance test.")
        if not isinstance(value, dict):
            raise pytest.UsageError(
                f"{entry} is a {type(value).__name__}, not a table. Write it as "
                f'"{pattern}" = {{ reason = "why it fails", link = "issue URL" }}'
            )
        unknown = sorted(set(value) - _ENTRY_KEYS)
        if unknown:
            hint = ""
            if any(isinstance(value[k], dict) for k in unknown):
                hint = " (a test id with dots must be quoted whole: \"parity::encoder_decoder.decode[float32]\" = { … })"
            raise pytest.UsageError(
                f"{entry} has unknown key(s) {', '.join(map(repr, unknown))}; an entry has only "
                f"`reason` (required) and `link` (optional){hint}."
            )
        if "reason" not in value:
            raise pytest.UsageError(f'{entry} has no reason; add reason = "why it fails" (and link = "issue URL").')
        reason, link = value["reason"], value.get("link", "")
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(f"{entry}: reason must be a non-empty string, not {reason!r}.")
        if not isinstance(link, str):
            raise pytest.UsageError(f'{entry}: link must be a string (an issue URL, or ""), not {link!r}.')
        entries.append(KnownFailure(pattern, reason, link, _line_of(text, pattern)))
    return entries


def _line_of(text: str, key: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        line = line.lstrip()
        for spelling in (json.dumps(key), f"'{key}'", key):
            if line.startswith(spelling) and line[len(spelling):].lstrip().startswith(("=", ".")):
                return number
    return 0


def format_known_failures(entries: Iterable[KnownFailure], backend: str) -> str:
    """A known-failures file: a comment header, then one sorted inline-table line per entry."""
    lines = [
        f"# Known conformance failures of backend {backend!r}, for pytest --backendconf-known-failures.",
        "# Each key is a test id (fnmatch patterns allowed); a listed test that passes fails the run.",
        "# Written by --backendconf-write-known-failures; edit the reasons and links freely.",
    ]
    for entry in sorted(entries, key=lambda e: e.pattern):
        reason, link = _toml_str(entry.reason), _toml_str(entry.link)
        lines.append(f"{_toml_str(entry.pattern)} = {{ reason = {reason}, link = {link} }}")
    return "\n".join(lines) + "\n"


def _toml_str(text: str) -> str:
    # A JSON string is a TOML basic string once DEL is escaped too.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def merge_known_failures(
    results: Iterable["TestResult"], existing: Iterable[KnownFailure], stale: set[str] | None
) -> list[KnownFailure]:
    """The entries to write after a run: the failing tests, keeping what people wrote where it still holds.

    An existing entry is kept as written when the tests it matched in this
    run include a failure and no pass, or when it matched no test of this run
    but still names a check of the suite (it is outside the selection);
    otherwise it is dropped and its still-failing tests are listed one by
    one with its reason and link. A failing test no entry covers gets the
    first line of its failure as the reason.
    """
    results = list(results)
    outcome = {r.id: r.outcome for r in results}
    kept: dict[str, KnownFailure] = {}
    covered: set[str] = set()
    unique: dict[str, KnownFailure] = {}
    for entry in existing:
        unique.setdefault(entry.pattern, entry)  # the applied file's entry wins over the target's
    existing = list(unique.values())
    for entry in existing:
        matched = [i for i in outcome if entry.matches(i)]
        if not matched:
            if stale is None or entry.pattern not in stale:
                kept[entry.pattern] = entry
            continue
        failing = [i for i in matched if outcome[i] in FAILING]
        if failing and not any(outcome[i] in ("passed", "unexpected_pass") for i in matched):
            kept[entry.pattern] = entry
            covered.update(failing)
    for result in results:
        if result.outcome not in FAILING or result.id in covered:
            continue
        prior = next((e for e in existing if e.matches(result.id)), None)
        if prior is not None:
            kept[result.id] = KnownFailure(result.id, prior.reason, prior.link)
        else:
            kept[result.id] = KnownFailure(result.id, result.first_line(), "")
    return sorted(kept.values(), key=lambda e: e.pattern)


# --- per-test outcomes -------------------------------------------------------------


def phase_outcome(report: pytest.TestReport, entry: KnownFailure | None) -> str | None:
    """What one phase's report means for the suite; None for a setup or teardown that passed."""
    if report.skipped:
        if hasattr(report, "wasxfail"):
            return "known_failure"
        return "unsupported" if skip_reason(report).startswith("unsupported: ") else "skipped"
    if report.failed:
        if report.when != "call":
            return "error"
        if entry is not None and str(report.longrepr).startswith("[XPASS(strict)]"):
            return "unexpected_pass"
        return "failed"
    if report.when == "call":
        return "unexpected_pass" if hasattr(report, "wasxfail") else "passed"
    return None


def skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return ""


def error_of(excinfo: pytest.ExceptionInfo[BaseException] | None) -> dict[str, str] | None:
    """``{type, module, message}`` of an exception, the message cut to its first lines."""
    if excinfo is None:
        return None
    exc = excinfo.value
    kind, module, text = type(exc).__qualname__, type(exc).__module__, str(exc)
    remote = getattr(exc, "error_record", None)  # a check that failed in the backend host
    if remote:
        kind, module = remote["type"], remote["module"]
        if kind != "CheckFailed" and module != "pytest_backendconf._host":  # else the text is the message
            text = remote["message"]
    lines = text.strip().splitlines()
    message = "\n".join(lines[:MESSAGE_LINES]) + ("\n…" if len(lines) > MESSAGE_LINES else "")
    return {"type": kind, "module": module, "message": message}


@dataclasses.dataclass
class TestResult:
    """One conformance test as the report and the summary see it (all its phases combined)."""

    __test__ = False  # not a pytest test class

    id: str
    category: str
    case: str | None
    stage: str
    reproduce: str
    outcome: str | None = None
    duration: float = 0.0
    error: dict[str, str] | None = None
    reason: str | None = None
    known_failure: dict[str, str] | None = None
    #: What the check returned, e.g. delegation's ``{"delegation": {"delegated": 41, "total": 47, ...}}``.
    details: dict[str, Any] | None = None

    def add(self, report: pytest.TestReport, data: dict[str, Any]) -> None:
        self.duration += report.duration
        if data.get("details") is not None:
            self.details = data["details"]
        if data["known_failure"] is not None:
            self.known_failure = data["known_failure"]
        new = data["outcome"]
        if new is not None and (self.outcome is None or OUTCOMES.index(new) > OUTCOMES.index(self.outcome)):
            self.outcome, self.error, self.reason = new, data["error"], data["reason"]

    def first_line(self) -> str:
        """The failure's first line, as a known-failures reason."""
        if self.error is None:
            return self.outcome or "failed"
        first = (self.error["message"].splitlines() or [""])[0].strip()
        if self.error["type"] == CheckFailed.__name__ and first:
            return first[:200]
        return f"{self.error['type']}: {first}"[:200] if first else self.error["type"]

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "category": self.category,
            "case": self.case,
            "stage": self.stage,
            "outcome": self.outcome,
            "duration": round(self.duration, 6),
            "error": self.error,
            "reason": self.reason,
            "known_failure": self.known_failure,
            "reproduce": self.reproduce,
            **({"details": rest} if (rest := {k: v for k, v in (self.details or {}).items() if k != "numerics"}) else {}),
            "numerics": (self.details or {}).get("numerics"),
        }


def summarize(results: Iterable[TestResult]) -> dict[str, dict[str, Any]]:
    """Counts per outcome and the score (passed / total) of each category."""
    summary = {c: {"total": 0, **{o: 0 for o in OUTCOMES}, "score": None} for c in CATEGORIES}
    for result in results:
        counts = summary.setdefault(result.category, {"total": 0, **{o: 0 for o in OUTCOMES}, "score": None})
        counts["total"] += 1
        counts[result.outcome] += 1
    for counts in summary.values():
        if counts["total"]:
            counts["score"] = round(counts["passed"] / counts["total"], 6)
    return summary


def error_statistics(results: Iterable[TestResult]) -> dict[str, Any]:
    """How many tests that did not work failed with each exception type, and in each stage."""
    by_type: dict[str, int] = {}
    by_stage: dict[str, int] = {}
    total = 0
    for result in results:
        if result.outcome not in FAILING:
            continue
        total += 1
        by_stage[result.stage] = by_stage.get(result.stage, 0) + 1
        kind = result.error["type"] if result.error else "unknown"
        by_type[kind] = by_type.get(kind, 0) + 1
    return {"total": total, "by_type": dict(sorted(by_type.items())), "by_stage": dict(sorted(by_stage.items()))}


def score_line(category: str, counts: dict[str, Any]) -> str:
    """``parity   160/165 passed (97.0%); 5 unsupported, … — score = passed / all 165``."""
    total, passed = counts["total"], counts["passed"]
    known = counts["known_failure"]
    parts = [
        f"{counts['unsupported']} unsupported",
        f"{known} known failure{'' if known == 1 else 's'}",
        f"{counts['failed']} failed",
    ]
    extra = {"unexpected_pass": "unexpected pass", "error": "error", "skipped": "skipped"}
    for outcome, label in extra.items():
        n = counts[outcome]
        if n:
            parts.append(f"{n} {label}{('es' if label.endswith('s') else 's') if n != 1 and label != 'skipped' else ''}")
    return (
        f"{category:<14} {passed}/{total} passed ({100 * passed / total:.1f}%); "
        f"{', '.join(parts)} — score = passed / all {total}"
    )


# --- files -------------------------------------------------------------------------


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once: a reader sees the old file or the new one, never half."""
    from ._files import write_atomic

    write_atomic(path, text)


def output_path(config: pytest.Config, option: str, value: str) -> Path:
    """An output file's path, checked before the run so that a typo does not cost a whole run."""
    path = Path(config.invocation_params.dir, value)
    if path.is_dir():
        raise pytest.UsageError(f"{option}={value}: that is a directory; give a file name in it.")
    if not path.parent.is_dir():
        raise pytest.UsageError(f"{option}={value}: the directory {path.parent} does not exist; create it first.")
    return path


# --- the plugin ----------------------------------------------------------------------


class GatingPlugin:
    """Known failures, ``--backendconf-report``, the score summary and JUnit properties."""

    def __init__(self, config: pytest.Config, selected: RegisteredBackend) -> None:
        self.config = config
        self.selected = selected
        self.workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        if self.workerinput is not None and "backendconf_hypothesis" in self.workerinput:
            # The controller's profile and seed, so that the seed in its header reproduces the workers' runs.
            config._backendconf_hypothesis = tuple(self.workerinput["backendconf_hypothesis"])  # type: ignore[attr-defined]
        known = config.getoption("backendconf_known_failures")
        self.known_path = Path(config.invocation_params.dir, known) if known else None
        self.known = load_known_failures(self.known_path, "--backendconf-known-failures") if self.known_path else []
        report = config.getoption("backendconf_report")
        self.report_path = output_path(config, "--backendconf-report", report) if report else None
        page = config.getoption("backendconf_html", None)
        self.html_path = output_path(config, "--backendconf-html", page) if page else None
        write = config.getoption("backendconf_write_known_failures")
        self.write_path = output_path(config, "--backendconf-write-known-failures", write) if write else None
        self.previous: list[KnownFailure] = list(self.known)
        if self.write_path is not None and self.write_path.exists() and self.write_path != self.known_path:
            self.previous += load_known_failures(self.write_path, "--backendconf-write-known-failures")
        self.results: dict[str, TestResult] = {}
        self.order: dict[str, int] = {}
        #: Patterns (of either file) that match no check of the suite; None while unknown.
        self.stale: set[str] | None = None
        self.workers = 0
        self.started = time.time()
        self.notes: list[str] = []

    # --- configuration, collection ------------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> list[str] | None:
        if self.known_path is None:
            return None
        count = len(self.known)
        return [f"backendconf: known failures from {self.known_path} ({count} entr{'y' if count == 1 else 'ies'})"]

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        from .plugin import hypothesis_choice

        node.workerinput["backendconf_hypothesis"] = list(hypothesis_choice(self.config))
        self.workers = int(node.workerinput.get("workercount", self.workers + 1))

    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        # A plain hookimpl: after the suite (tryfirst) adds its items, before -k/-m deselect any.
        suite = [item for item in items if isinstance(item, ConformanceItem)]
        for item in suite:
            check = item.check
            item.user_properties += [("category", check.category), ("stage", check.stage), ("reproduce", item.reproduce)]
            if check.case is not None:
                item.user_properties.append(("case", check.case))
            entry = self._entry_for(item)
            if entry is not None:
                item.stash[_ENTRY_KEY] = entry
                item.user_properties.append(("known_failure", entry.pattern))
                reason = f"known failure: {entry.reason}" + (f" ({entry.link})" if entry.link else "")
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
        self.stale = self._stale(suite)
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
        exact = (e for e in self.known if e.pattern in (item.nodeid, item.name))
        return next(exact, None) or next((e for e in self.known if e.matches(item.nodeid)), None)

    def _stale(self, suite: list[ConformanceItem]) -> set[str] | None:
        patterns = {e.pattern for e in self.previous}
        if not patterns:
            return set()
        if self.config.getoption("backendconf_select"):
            # The run is narrowed: judge the entries against every check, not only the selected ones.
            if not suite:
                return None
            ids = [f"{ROOT_ID}::{c.category}::{c.name}" for c in generate_checks(suite[0].ctx)]
        else:
            ids = [item.nodeid for item in suite]
        return {p for p in patterns if not any(id_matches(i, p) for i in ids)}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.order = {item.nodeid: i for i, item in enumerate(session.items)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.order:
            self.order = {nodeid: i for i, nodeid in enumerate(ids)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        stale = getattr(node, "workeroutput", {}).get("backendconf_stale")
        if stale is not None:
            self.stale = set(stale)

    # --- running ------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield  # after the skipping plugin has turned xfail markers into outcomes
        if not isinstance(item, ConformanceItem):
            return report
        entry = item.stash.get(_ENTRY_KEY, None)
        outcome = phase_outcome(report, entry)
        error = reason = None
        if outcome in FAILING:
            error = error_of(call.excinfo)
        elif outcome in ("unsupported", "skipped"):
            reason = skip_reason(report).removeprefix("unsupported: ")
        elif outcome == "unexpected_pass" and entry is not None and report.failed:
            fix = "remove the entry" if entry.pattern in (item.nodeid, item.name) else "narrow the entry's pattern"
            report.longrepr = (
                f"{item.nodeid} passed, but it is listed as a known failure: entry {entry.pattern!r} in "
                f"{self.known_path} (reason: {entry.reason}). Backend {self.selected.name!r} passes it now: "
                f"{fix}, or rewrite the file with --backendconf-write-known-failures={self.known_path}.\n"
                f"reproduce: {item.reproduce}"
            )
        setattr(
            report,
            REPORT_ATTR,
            {
                "category": item.check.category,
                "case": item.check.case,
                "stage": item.check.stage,
                "reproduce": item.reproduce,
                "outcome": outcome,
                "error": error,
                "reason": reason,
                "known_failure": entry.as_json() if entry is not None else None,
                "details": next((v for k, v in item.user_properties if k == "backendconf"), None),
            },
        )
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTR, None)
        if data is None or self.workerinput is not None:
            return
        result = self.results.get(report.nodeid)
        if result is None:
            result = self.results[report.nodeid] = TestResult(
                report.nodeid, data["category"], data["case"], data["stage"], data["reproduce"]
            )
        result.add(report, data)

    # --- the end of the run ---------------------------------------------------------

    def finished(self) -> list[TestResult]:
        """The tests that ran, in collection order."""
        done = [r for r in self.results.values() if r.outcome is not None]
        return sorted(done, key=lambda r: (self.order.get(r.id, len(self.order)), r.id))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.workerinput is not None:
            return
        results = self.finished()
        document = self.report(results, int(exitstatus)) if self.report_path or self.html_path else None
        if self.report_path is not None:
            atomic_write(self.report_path, json.dumps(document, indent=2) + "\n")
            self.notes.append(f"report written to {self.report_path}")
        if self.html_path is not None:
            from ._html import render

            atomic_write(self.html_path, render([document]))  # the page is drawn from the report alone
            self.notes.append(f"HTML report written to {self.html_path}")
        if self.write_path is not None:
            if exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
                self.notes.append(f"known failures not written to {self.write_path}: the run did not complete")
            else:
                self._write_known_failures(results)

    def _write_known_failures(self, results: list[TestResult]) -> None:
        assert self.write_path is not None
        entries = merge_known_failures(results, self.previous, self.stale)
        atomic_write(self.write_path, format_known_failures(entries, self.selected.name))
        before = {e.pattern for e in self.previous}
        after = {e.pattern for e in entries}
        self.notes.append(
            f"wrote {len(entries)} known failure{'' if len(entries) == 1 else 's'} to {self.write_path} "
            f"({len(after - before)} added, {len(before - after)} removed)"
        )

    def report(self, results: list[TestResult], exitstatus: int) -> dict[str, Any]:
        """The ``--backendconf-report`` document (schema in docs/ci-gating.md)."""
        import torch

        from ._hypothesis import PROFILES

        available, unavailable_reason = self.selected.availability()
        source = self.selected.source
        hypothesis = getattr(self.config, "_backendconf_hypothesis", None)
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": list(REPORT_SCHEMA_VERSION),
            "backend": {
                "name": self.selected.name,
                "source": source.description,
                "distribution": source.distribution,
                "version": source.version,
                "available": available,
                "unavailable_reason": unavailable_reason or None,
            },
            "environment": {
                "torch": torch.__version__,
                "python": platform.python_version(),
                "python_implementation": platform.python_implementation(),
                "platform": platform.platform(),
                "machine": platform.machine(),
                "pytest": pytest.__version__,
                "pytest_backendconf": _version("pytest-backendconf"),
            },
            "hypothesis": None
            if hypothesis is None
            else {
                "profile": hypothesis[0],
                "seed": hypothesis[1],
                "derandomized": bool(PROFILES[hypothesis[0]].derandomize) if hypothesis[0] in PROFILES else None,
            },
            "run": {
                "started": datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc).isoformat(),
                "duration": round(time.time() - self.started, 3),
                "exit_status": exitstatus,
                "select": list(self.config.getoption("backendconf_select") or []),
                "xdist_workers": self.workers,
            },
            "known_failures": None
            if self.known_path is None
            else {
                "file": str(self.known_path),
                "entries": len(self.known),
                "stale": sorted(p for p in self.stale or () if any(e.pattern == p for e in self.known)),
            },
            "summary": summarize(results),
            "errors": error_statistics(results),
            "ops": self._ops_matrix(results),
            "tests": [r.as_json() for r in results],
        }

    def _ops_matrix(self, results: list[TestResult]) -> dict[str, Any] | None:
        from ._ops_report import ops_matrix

        declared = getattr(self.selected.backend, "capabilities", None)
        return ops_matrix((r.as_json() for r in results), getattr(declared, "supported_ops", None))

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.workerinput is not None:
            return
        results = self.finished()
        if not results and not self.notes:
            return
        tr = terminalreporter
        tr.write_sep("=", f"backendconf: conformance of backend {self.selected.name!r}")
        from ._delegation_summary import delegation_line

        matrix = self._ops_matrix(results)
        for category, counts in summarize(results).items():
            if counts["total"] and not (category == "ops" and matrix is not None):
                # delegation counts nodes, and "not needed" apart from passes.
                tr.write_line((category == "delegation" and delegation_line(results)) or score_line(category, counts))
        if matrix is not None:
            from ._ops_report import flagged_lines, summary_line

            for line in [summary_line(matrix), *flagged_lines(matrix)]:
                tr.write_line(line)
        broken = [r for r in results if r.outcome in ("failed", "error", "unexpected_pass")]
        if len(broken) > 1:
            from ._failure_groups import group_failures, summary_lines

            tr.write_line("")
            tr.write_line("failures grouped by message (numbers and names masked):")
            for line in summary_lines(group_failures(r.as_json() for r in broken)):
                tr.write_line(line)
        if broken:
            tr.write_line("")
            tr.write_line("to reproduce a failure, run its command:")
            for result in broken:
                tr.write_line(f"{result.outcome.upper().replace('_', ' ')} {result.id}: {result.reproduce}")
        for note in self.notes:
            tr.write_line(f"backendconf: {note}")


def _version(distribution: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
