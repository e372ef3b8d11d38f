"""A report's test as one record: its serializer pair, its checks, and the report room's layering."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pytest_backendconf.cli._main import main
from pytest_backendconf.report import OUTCOMES, VERDICTS, ReportTest, combined, gated_outcome, read_report

from report_records import document_of

REPORT_ROOM = Path(__file__).parent.parent / "pytest_backendconf" / "report"
ID = "backendconf::parity::linear[float32]"


def test_every_outcome_comes_from_one_verdict_and_the_pair_round_trips():
    made = set()
    for verdict in VERDICTS:
        for listed in (False, True):
            for strict in (True, False):
                outcome = gated_outcome(verdict, listed, strict)
                made.add(outcome)
                test = ReportTest(ID, "parity", outcome, verdict, error=None, details={"numerics": {"closeness": 0.5}})
                data = test.to_json()
                assert data["numerics"] == {"closeness": 0.5} and "details" not in data  # kept apart in the report
                assert ReportTest.from_json(json.loads(json.dumps(data))) == test
    assert made == set(OUTCOMES)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"outcome": "failed", "verdict": "passed"},
            "tests[0]: " + ID + ": outcome failed cannot come from verdict passed",
        ),
        ({"outcome": "passed", "verdict": "failed"}, "outcome passed cannot come from verdict failed"),
        ({"outcome": "known_failure", "verdict": "passed"}, "outcome known_failure cannot come from verdict passed"),
        ({"verdict": "known_failure"}, 'tests[0].verdict is "known_failure", not one of passed, skipped'),
        ({"duration": -1}, "tests[0].duration must be a number of seconds >= 0 or null, got -1"),
        ({"error": {"type": "X"}}, "tests[0].error.message must be a string, got null or nothing"),
        ({"check_outcome": "maybe"}, 'tests[0].check_outcome is "maybe", not one of passed, failed'),
        ({"known_failure": {"pattern": 3}}, "tests[0].known_failure.pattern must be a string or null, got 3"),
        ({"category": None}, "tests[0].category must be a string, got null or nothing"),
    ],
)
def test_a_test_entry_that_no_run_wrote_is_refused_naming_the_field(change, says):
    entry = {**ReportTest(ID, "parity", "passed", "passed").to_json(), **change}
    with pytest.raises(ValueError) as info:
        ReportTest.from_json(entry, "tests[0]")
    assert says in str(info.value)


def test_an_edited_outcome_does_not_pass_the_gate(tmp_path, capsys):
    # A failure rewritten as a pass, the verdict left as the run wrote it: the reader refuses it.
    document = document_of([{"id": ID, "outcome": "failed", "verdict": "failed", "check_outcome": "failed"}])
    document["tests"][0]["outcome"] = "passed"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(document))
    assert main(["report", "gate", str(path)]) == 4
    err = capsys.readouterr().err
    assert f"report {str(path)!r}: tests[0]: {ID}: outcome passed cannot come from verdict failed" in err
    assert "pass the file --backendconf-report wrote" in err


def test_the_gate_judges_the_verdict_not_the_gated_outcome(tmp_path, capsys):
    # A known failure of the run, gated with a file that no longer lists it: a failure, from its verdict.
    entry = {"pattern": ID, "reason": "float64 outputs", "link": ""}
    document = document_of(
        [{"id": ID, "outcome": "known_failure", "verdict": "failed", "check_outcome": "failed", "known_failure": entry}]
    )
    path = tmp_path / "report.json"
    path.write_text(json.dumps(document))
    assert main(["report", "gate", str(path)]) == 0  # as the run applied its file
    empty = tmp_path / "known.toml"
    empty.write_text("")
    assert main(["report", "gate", str(path), f"--known-failures={empty}"]) == 1
    assert "gate failed (exit status 1): 1 failed" in capsys.readouterr().out
    assert read_report(path).tests[0].verdict == "failed"


def test_phases_combine_into_the_worst_with_their_records_kept():
    call = ReportTest(ID, "parity", "passed", "passed", duration=1.0, details={"x": 1}, check_outcome="passed")
    teardown = ReportTest(ID, "parity", "error", "error", duration=0.5, error={"type": "E", "message": "m"})
    both = combined(combined(None, call), teardown)
    assert (both.outcome, both.verdict, both.error, both.duration) == ("error", "error", teardown.error, 1.5)
    assert both.details == {"x": 1} and both.check_outcome == "passed"


def _imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports, at the top, in a function or under TYPE_CHECKING alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return found


def _circle(folder: Path) -> list[str] | None:
    """An import circle among the modules of ``folder`` (as a path ending where it starts), or None."""
    modules = {p.stem: p for p in folder.glob("*.py")}
    graph = {name: _imports(path) & set(modules) for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return path[path.index(name) :] + [name]
        if name in done:
            return None
        for imported in sorted(graph[name]):
            found = visit(imported, path + [name])
            if found:
                return found
        done.add(name)
        return None

    return next((c for c in (visit(name, []) for name in sorted(graph)) if c), None)


def test_the_report_room_has_no_import_circle():
    assert _circle(REPORT_ROOM) is None


def test_the_import_circle_check_can_fail(tmp_path):
    (tmp_path / "_a.py").write_text("from ._b import x\n")
    (tmp_path / "_b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import y\n")
    (tmp_path / "_c.py").write_text("def f():\n    from ._a import z\n")
    assert _circle(tmp_path) == ["_a", "_b", "_a"]
