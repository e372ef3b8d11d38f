"""Report records for the tests: a report's tests, or a whole report, from the few fields a test cares about."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from pytest_backendconf.report import REPORT_SCHEMA, REPORT_SCHEMA_VERSION, Report, ReportTest, parse_report


def records(tests: Iterable[Mapping[str, Any]]) -> list[ReportTest]:
    """`ReportTest`s of report entries; an entry without a category takes its id's (``backendconf::ops::…``),
    one without an outcome failed."""
    return [
        ReportTest.from_json(
            {
                "category": ([*str(t["id"]).split("::"), "?"] * 2)[-2 if "::" in t["id"] else -1],
                "outcome": "failed",
                **t,
            },
            f"tests[{i}]",
        )
        for i, t in enumerate(tests)
    ]


def document_of(tests: Iterable[Mapping[str, Any]], backend: str = "x", **sections: Any) -> dict[str, Any]:
    """A report document holding ``tests`` (entries, as `records` takes them), with the sections a report needs."""
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": list(REPORT_SCHEMA_VERSION),
        "backend": {"name": backend},
        "environment": {"torch": "2.13.0"},
        "run": {},
        "summary": {},
        "tests": [t.to_json() for t in records(tests)],
        **sections,
    }


def report_of(tests: Iterable[Mapping[str, Any]], backend: str = "x", **sections: Any) -> Report:
    """`document_of`, read as a `Report`."""
    return parse_report(document_of(tests, backend, **sections), "report.json")
