"""The HTML report: written by a real run, rebuilt from saved reports, and looked at in headless Chromium.

One small run of a broken backend (four checks: a pass, a known failure, an
unsupported model, a failure) makes the report and the page every test here
reads. The browser test drives Debian's Chromium with Playwright; it skips
where either is missing, except under CI, which installs both (.ci/run).
"""

from __future__ import annotations

import copy
import html
import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_backendconf.report import Report, parse_report
from pytest_backendconf.report._html import check_column, render, root_cause
from report_records import records
from pytest_backendconf.cli._main import main

from test_gating import ARITHMETIC, AVAILABLE, CONFTEST, LINEAR, MLP, select

CHROMIUM = os.environ.get("BACKENDCONF_CHROMIUM", "/usr/bin/chromium")
#: Where the browser test leaves its screenshot (CI keeps the folder as an artifact).
ARTIFACTS = Path(os.environ.get("BACKENDCONF_ARTIFACTS", Path(__file__).parent.parent / "build" / "test-artifacts"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real run of `no_mul_wrong_dtype` writing the JSON report and the page."""
    pytester_dir = tmp_path_factory.mktemp("html-run")
    (pytester_dir / "conftest.py").write_text(CONFTEST)
    (pytester_dir / "known.toml").write_text(f'"{LINEAR}" = {{ reason = "float64 outputs", link = "https://b/7" }}\n')
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--backend=no_mul_wrong_dtype",
            "--backendconf-hypothesis=ci",
            "-p",
            "no:cacheprovider",
            *select(AVAILABLE, LINEAR, ARITHMETIC, MLP),
            "--backendconf-known-failures=known.toml",
            "--backendconf-report=r.json",
            "--backendconf-html=r.html",
        ],
        cwd=pytester_dir,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"backendconf: HTML report written to {pytester_dir / 'r.html'}" in result.stdout
    return pytester_dir


class _Page(HTMLParser):
    """The page's element ids, table headers and text, for checks without a browser."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.th_scopes: list[str | None] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        self.tags.append(tag)
        if "id" in found:
            self.ids.add(found["id"])
        if tag == "th":
            self.th_scopes.append(found.get("scope"))
        for key in ("src", "href"):
            value = found.get(key) or ""
            if tag in ("script", "link", "img") and value:
                self.external.append(value)

    def handle_data(self, data):
        self.text.append(data)


def parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def test_the_run_writes_a_self_contained_accessible_page_from_its_report(run):
    text = (run / "r.html").read_text()
    report = json.loads((run / "r.json").read_text())
    # One source of truth: the page a run writes is the page its saved report gives.
    assert text == render([parse_report(report, "report.json")])
    page = parse(text)
    assert page.external == [] and "http" not in re.sub(r'href="https://b/7"|>https://b/7<', "", text)
    assert page.tags.count("h1") == 1 and "h2" in page.tags
    assert page.th_scopes and all(scope in ("col", "row") for scope in page.th_scopes)
    words = " ".join(page.text)
    for fact in (
        "no_mul_wrong_dtype",
        report["environment"]["torch"],
        report["environment"]["machine"],
        str(report["hypothesis"]["seed"]),
        "profile ci",
    ):
        assert fact in words
    # A failure's details carry its reproduce command and its error.
    mlp = next(t for t in report["tests"] if t["id"] == MLP)
    assert mlp["reproduce"].replace("'", "&#x27;") in text
    assert "OutputSpecError" in words and "float64 outputs" in words


def test_matrix_columns_and_root_causes():
    assert (
        check_column(
            *records([{"id": "backendconf::parity::small_cnn[float16]", "category": "parity", "case": "small_cnn"}])
        )
        == "parity[float16]"
    )
    assert (
        check_column(
            *records([{"id": "backendconf::parity::enc.decode[float32]", "category": "parity", "case": "enc"}])
        )
        == "parity.decode[float32]"
    )
    assert (
        check_column(
            *records(
                [{"id": "backendconf::contract::preprocess_returns_bytes[mlp]", "category": "contract", "case": "mlp"}]
            )
        )
        == "contract: preprocess_returns_bytes"
    )
    assert (
        check_column(
            *records(
                [
                    {
                        "id": "backendconf::symbolication::runtime_fault_is_symbolicated[nested:cos]",
                        "category": "symbolication",
                        "case": "nested",
                    }
                ]
            )
        )
        == "symbolication: runtime_fault_is_symbolicated[*:cos]"
    )
    # Two models failing for one reason share a root cause; another message does not.
    a = {
        "id": "backendconf::parity::a[float32]",
        "outcome": "failed",
        "error": {"type": "OutputSpecError", "message": "output 0: expected a float32[4, 3] tensor, got 'x'"},
    }
    b = {
        "id": "backendconf::parity::b[float32]",
        "outcome": "failed",
        "error": {"type": "OutputSpecError", "message": "output 1: expected a float32[2, 5] tensor, got 'y'"},
    }
    c = {
        "id": "backendconf::parity::c[float32]",
        "outcome": "failed",
        "error": {"type": "OutputSpecError", "message": "method 'f' returned 3 outputs"},
    }
    a, b, c = records([a, b, c])
    assert root_cause(a) == root_cause(b) != root_cause(c)


def test_report_html_puts_several_reports_side_by_side_and_marks_the_flips(run, tmp_path, capsys):
    first = json.loads((run / "r.json").read_text())
    first["environment"]["torch"] = "2.13.0"  # whichever torch this test runs under
    second = copy.deepcopy(first)
    second["environment"]["torch"] = "2.14.1"
    for test in second["tests"]:
        if test["id"] == MLP:  # fixed under the other torch: a flip
            test.update(outcome="passed", verdict="passed", error=None)
        if test["id"] == ARITHMETIC:  # unsupported → skipped: a difference, not a flip
            test["outcome"] = test["verdict"] = "skipped"
    # A check the other torch does not have (its OpInfo samples differ): listed, not compared.
    gone = next(t["id"] for t in reversed(second["tests"]) if t["id"] not in (MLP, ARITHMETIC))
    second["tests"] = [t for t in second["tests"] if t["id"] != gone]
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    assert (
        main(["report", "html", str(tmp_path / "b.json"), str(tmp_path / "a.json"), "-o", str(tmp_path / "index.html")])
        == 0
    )
    assert "HTML report of 2 reports written to" in capsys.readouterr().out
    text = (tmp_path / "index.html").read_text()
    # Columns in torch order, whatever the order given.
    assert text.index("torch 2.13") < text.index("torch 2.14.1")
    assert "Checks that differ (2; 1 flip between passing and failing)" in text
    flip_row = re.search(r'<tr class="flip"[^>]*>(.*?)</tr>', text).group(1)
    assert MLP in flip_row and "failed" in flip_row and "passed" in flip_row
    other = re.search(r'<tr class="difference"[^>]*>(.*?)</tr>', text).group(1)
    assert ARITHMETIC in other
    assert "1 check is in some reports only (not compared)" in text
    only = re.search(rf'<tr data-filter="{re.escape(html.escape(gone.lower()))}">(.*?)</tr>', text).group(1)
    assert "not in this report" in only and "ran" in only
    # Each report in full below, under its own heading.
    assert text.count("<h3>Scores</h3>") == 2
    # Two reports that agree: differences and flips counted in plain words.
    (tmp_path / "a2.json").write_text(json.dumps(first))
    assert (
        main(["report", "html", str(tmp_path / "a.json"), str(tmp_path / "a2.json"), "-o", str(tmp_path / "same.html")])
        == 0
    )
    assert "Checks that differ (0; 0 flips between passing and failing)" in (tmp_path / "same.html").read_text()


def test_report_html_names_a_bad_report_or_output(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something-else"}')
    assert main(["report", "html", str(bad), "-o", str(tmp_path / "x.html")]) == 1
    assert "is not a backendconf report" in capsys.readouterr().err
    assert main(["report", "html", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.html")]) == 1
    assert "cannot read report" in capsys.readouterr().err


def test_report_html_refuses_an_output_in_a_missing_folder(run, tmp_path, capsys):
    assert main(["report", "html", str(run / "r.json"), "-o", str(tmp_path / "no" / "index.html")]) == 1
    assert "does not exist; create it first" in capsys.readouterr().err


def test_an_html_file_in_a_missing_folder_is_a_usage_error(pytester):
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest("--backend=no_mul_wrong_dtype", "--backendconf-html=no/such/r.html")
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        ["ERROR: --backendconf-html 'no/such/r.html': the directory '*/no/such' does not exist; create it first"]
    )


# --- in a real browser ---------------------------------------------------------------------


def _browser():
    """Playwright's sync API and Chromium, or a skip (a failure under CI, which installs both)."""
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the Python package playwright (pip install playwright)")
        sync_playwright = None
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium, or set BACKENDCONF_CHROMIUM)")
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"{message}; .ci/run installs both")
        pytest.skip(message)
    return sync_playwright


@pytest.mark.slow
def test_a_person_sees_the_scores_opens_a_failure_and_filters_the_matrix(run, tmp_path):
    sync_playwright = _browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            # Any request off the file would fail here: the page must need none.
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto((run / "r.html").as_uri())
            assert [u for u in requests if not u.startswith("file:")] == []

            cards = {c.get_attribute("data-category"): c.inner_text() for c in page.locator(".card").all()}
            assert set(cards) == {"contract", "parity"}
            assert "1/1" in cards["contract"] and "100.0%" in cards["contract"]
            assert "0/3" in cards["parity"] and "1 failed" in cards["parity"] and "1 unsupported" in cards["parity"]
            assert "1 known failure" in cards["parity"]

            matrix = page.locator("table.matrix").first
            rows = matrix.locator("tbody tr")
            assert rows.count() == 3  # arithmetic_tensors, linear, mlp
            # The failing cell reads without colour (✗) and opens its failure on click.
            cell = matrix.locator("tbody tr", has_text="mlp").locator("td.failed a")
            assert cell.inner_text() == "✗"
            target = cell.get_attribute("data-open")
            details = page.locator(f"details#{target}")
            assert details.get_attribute("open") is None
            page.screenshot(path=str(tmp_path / "before.png"))
            cell.click()
            assert details.get_attribute("open") is not None
            assert details.locator("pre.repro").is_visible()
            assert "--backendconf-select=" in details.locator("pre.repro").inner_text()
            assert "OutputSpecError" in details.inner_text()

            # The filter narrows the matrix to the rows that match every word.
            page.fill("#filter", "mlp")
            visible = [r for r in rows.all() if r.is_visible()]
            assert [r.locator("th").inner_text() for r in visible] == ["mlp"]
            assert (
                page.locator("#filter-count").inner_text() == "1 of 4 rows shown"
            )  # the three models and the one whole-backend check
            page.fill("#filter", "")
            assert all(r.is_visible() for r in rows.all())

            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.set_viewport_size({"width": 1200, "height": 1400})
            page.goto((run / "r.html").as_uri())
            page.screenshot(path=str(ARTIFACTS / "html-report.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "html-report.png").stat().st_size > 10_000


def test_ops_and_delegation_sections_appear_when_the_report_has_them(run):
    report = json.loads((run / "r.json").read_text())
    assert "Operators × dtypes" not in render(
        [parse_report(report, "report.json")]
    ) and "<h2>Delegation</h2>" not in render([parse_report(report, "report.json")])
    failing = dict(
        report["tests"][0],
        id="backendconf::ops::aten.add.Tensor[float16-sample0]",
        category="ops",
        case=None,
        outcome="failed",
        verdict="failed",
        check_outcome="failed",
        error={"type": "CheckFailed", "module": "m", "message": "mismatch"},
    )
    report["tests"].append(failing)
    report["ops"] = {
        "dtypes": ["float32", "float16"],
        "overloads": {"aten.add.Tensor": {"float32": "passed", "float16": "failed"}},
    }
    report["delegation"] = {"models": {"small_cnn": {"delegated": 7, "total": 9}}}
    text = render([parse_report(report, "report.json")])
    ops = text[text.index("Operators × dtypes") : text.index("<h2>Delegation</h2>")]
    assert re.search(r'<th scope="row">aten.add.Tensor</th><td class="cell passed".*?<td class="cell failed"', ops)
    assert 'data-open="r0-f-' in ops  # the failing cell opens its check's details
    assert "77.8%" in text and "7/9 nodes" in text


#: A report's ``run.target``, as a run with a target command records it (`target.probe`).
DEVICE = {
    "command": "ssh -i /k ci@board /opt/venv/bin/python",
    "machine": "aarch64",
    "python": "3.11.2",
    "torch": "2.10.0",
    "pytest_backendconf": "0.1.0",
    "backends": {"reference": {"distribution": "backendconf-reference", "version": "0.1.0"}},
    "connect_seconds": 1.234,
    "round_trip_ms": 2.51,
}


def test_the_page_shows_the_target_device_and_nothing_without_one(run):
    report = json.loads((run / "r.json").read_text())
    assert "Target device" not in render([parse_report(report, "report.json")])  # a run without a target command
    report["run"]["target"] = DEVICE
    page = parse(render([parse_report(report, "report.json")]))
    text = " ".join(page.text)
    assert "aarch64, Python 3.11.2, torch 2.10.0, pytest-backendconf 0.1.0; backends: reference 0.1.0" in text
    assert "ssh -i /k ci@board /opt/venv/bin/python" in text
    assert "connected in 1.23 s; 2.5 ms round trip per request" in text
    forged = copy.deepcopy(report)
    forged["run"]["target"] = {k: v + PAYLOAD if isinstance(v, str) else v for k, v in DEVICE.items()}
    forged["run"]["target"]["backends"] = {PAYLOAD: {"version": PAYLOAD}}
    shown = render([parse_report(forged, "report.json")])
    assert _injected(parse(shown)) == [] and html.unescape(shown).count("window.__pwned=1") >= 6


# --- hostile reports --------------------------------------------------------------------------

#: Markup that would run if a field reached the page unescaped: each sets a global the browser test reads.
PAYLOAD = '"><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def _forged(report: dict) -> Report:
    """``report`` with every string a check id does not depend on, and every number the page prints, replaced by markup.

    The strings go through the reader (they are strings); the numbers are set past it, on the document it
    read: the page escapes what it prints even where the reader's checks would have refused it. A test's
    outcome and verdict are checked choices of the record, never text that reaches the page as written.
    """
    forged = copy.deepcopy(report)

    def walk(value, key=None):
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str) and key not in ("id", "outcome", "verdict", "check_outcome", "category", "schema"):
            return value + PAYLOAD
        return value

    read = parse_report(walk(forged), "report.json")
    read.document["errors"]["total"] = PAYLOAD  # the field the page once wrote as it was
    read.document["summary"]["parity"]["total"] = PAYLOAD
    read.document["run"]["duration"] = PAYLOAD
    return read


def _injected(page: _Page) -> list[str]:
    found = [t for t in page.tags if t in ("img", "iframe", "object", "embed")]
    return found + (["a second script"] if page.tags.count("script") != 1 else [])


def test_no_field_of_a_report_reaches_the_page_as_markup(run):
    report = json.loads((run / "r.json").read_text())
    text = render([_forged(report)])
    assert _injected(parse(text)) == []
    assert "window.__pwned" in html.unescape(text)  # shown as text, not dropped


def test_report_html_checks_that_numbers_are_numbers(run, tmp_path, capsys):
    report = json.loads((run / "r.json").read_text())
    for field, value, message in [
        (("errors", "total"), "<script>x</script>", "errors.total must be a count (an integer >= 0) or null"),
        (("run", "duration"), "1<img>", "run.duration must be a finite number or null"),
        (("summary", "parity", "failed"), "2", "summary.parity.failed must be a count"),
        (("known_failures",), "x", "known_failures must be an object or null"),
        (("run", "target"), "ssh board", "run.target must be an object or null"),
        (("run", "target", "connect_seconds"), "1.2", "run.target.connect_seconds must be a finite number"),
        (("run", "target", "backends", "reference"), "1.0", "run.target.backends.reference must be an object"),
    ]:
        forged = copy.deepcopy(report)
        forged["run"]["target"] = copy.deepcopy(DEVICE)
        target = forged
        for key in field[:-1]:
            target = target[key]
        target[field[-1]] = value
        path = tmp_path / "forged.json"
        path.write_text(json.dumps(forged))
        assert main(["report", "html", str(path), "-o", str(tmp_path / "x.html")]) == 1
        err = capsys.readouterr().err
        assert f"report {str(path)!r}: {message}" in err, err
        assert not (tmp_path / "x.html").exists()


def test_deeply_nested_json_is_refused_before_it_is_parsed(run, tmp_path, capsys):
    report = json.loads((run / "r.json").read_text())
    deep = json.dumps(report)[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = tmp_path / "deep.json"
    path.write_text(deep)
    for command in (["html", str(path), "-o", str(tmp_path / "x.html")], ["merge", str(path)], ["ops", str(path)]):
        assert main(["report", *command]) == 1
        assert f"report {str(path)!r} nests 100001 levels deep; at most 64 are read" in capsys.readouterr().err


def _sparse_report(report: dict, n: int) -> dict:
    """``n`` checks, each of its own model and its own column: a matrix of n × n cells for n entries."""
    sparse = copy.deepcopy(report)
    template = next(t for t in report["tests"] if t.get("case"))
    sparse["tests"] = [
        dict(
            template, id=f"backendconf::parity::m{i}_case[c{i}]", case=f"m{i}_case", outcome="passed", verdict="passed"
        )
        for i in range(n)
    ]
    return sparse


def test_the_page_grows_linearly_with_many_distinct_models_and_columns(run):
    report = json.loads((run / "r.json").read_text())
    small, large = (len(render([parse_report(_sparse_report(report, n), "report.json")])) for n in (400, 1600))
    # Four times the checks: about four times the page (a matrix would be sixteen times).
    assert large < 5 * small, (small, large)
    text = render([parse_report(_sparse_report(report, 1600), "report.json")])
    assert "1600 entries over 1600 models × 1600 checks would make a matrix of 2560000 cells" in text
    # A dense report still gets its matrix.
    assert 'table class="matrix"' in render([parse_report(report, "report.json")])


@pytest.mark.slow
def test_report_commands_never_end_in_a_traceback_on_mutated_reports(run, tmp_path, capsys):
    """Seeded mutations of a real report: every field replaced by another JSON type or a hostile value."""
    import random

    report = json.loads((run / "r.json").read_text())
    report["ops"] = {"dtypes": ["float32"], "overloads": {"aten.add.Tensor": {"float32": "passed"}}}
    paths = []

    def spots(value, path=()):
        yield path
        if isinstance(value, dict):
            for k, v in value.items():
                yield from spots(v, (*path, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from spots(v, (*path, i))

    every = [p for p in spots(report) if p]
    hostile = [None, True, -1, 1e308, float("nan"), "1", "", PAYLOAD, [], {}, [[1]], {"a": {"b": []}}, 2**70]
    rng = random.Random(25)
    for i in range(150):
        mutated = copy.deepcopy(report)
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(every)
            target = mutated
            try:
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = copy.deepcopy(rng.choice(hostile))
            except (KeyError, IndexError, TypeError):
                continue
        file = tmp_path / f"m{i}.json"
        file.write_text(json.dumps(mutated))
        paths.append(file)
    for file in paths:
        for command in (["html", str(file), "-o", str(tmp_path / "x.html")], ["merge", str(file)], ["ops", str(file)]):
            code = main(["report", *command])  # an exception here is the bug this test is about
            out, err = capsys.readouterr()
            assert code in (0, 1), (command, err)
            assert code == 0 or err.startswith("backendconf: error: "), err
        if (tmp_path / "x.html").exists():
            assert _injected(parse((tmp_path / "x.html").read_text())) == []
            (tmp_path / "x.html").unlink()


def test_no_script_from_a_forged_report_runs_in_a_browser(run, tmp_path):
    sync_playwright = _browser()
    report = json.loads((run / "r.json").read_text())
    page_file = tmp_path / "forged.html"
    page_file.write_text(render([_forged(report)]))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            dialogs = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")
            # Our own script ran (the filter works); none of the report's did.
            page.fill("#filter", "mlp")
            assert page.locator("#filter-count").inner_text().endswith("rows shown")
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert page.locator("img").count() == 0 and dialogs == []
        finally:
            browser.close()


def test_the_page_names_the_machine_features_that_change_kernels_escaped(run):
    report = json.loads((run / "r.json").read_text())
    env = report["environment"]
    page = parse(render([parse_report(report, "report.json")]))
    text = html.unescape(render([parse_report(report, "report.json")]))
    assert f"<dt>torch CPU capability</dt><dd>{html.escape(env['cpu_capability'] or 'unknown')}</dd>" in render(
        [parse_report(report, "report.json")]
    )
    assert f"<dt>CPU</dt><dd>{html.escape(env['cpu_model'] or 'unknown')}</dd>" in render(
        [parse_report(report, "report.json")]
    )
    assert " ".join(env["cpu_flags"]) in text and env["machine"] in text
    # A report from another machine, with markup in its fields: shown as text, never as markup.
    env.update(cpu_model=f"AMD EPYC {PAYLOAD}", cpu_capability="AVX512", cpu_flags=["avx512_fp16", PAYLOAD])
    forged = render([parse_report(report, "report.json")])
    assert _injected(parse(forged)) == [] and page.tags.count("script") == 1
    assert f"<dt>CPU flags (kernel-relevant)</dt><dd>avx512_fp16 {html.escape(PAYLOAD)}</dd>" in forged
    assert f"AMD EPYC {PAYLOAD}" in html.unescape(forged)


@pytest.mark.parametrize(
    "target", ["javascript:alert(1)", " JaVaScRiPt:alert(1)", "data:text/html,<b>x</b>", "//evil/x"]
)
def test_a_link_is_drawn_only_to_a_safe_scheme(target):
    from report_records import report_of

    page = render(
        [
            report_of(
                [
                    {
                        "id": "backendconf::parity::a[float32]",
                        "outcome": "failed",
                        "error": {"type": "CheckFailed", "message": "off"},
                        "reproduction": {"script": target, "nodes": 1, "ops": ["aten::sub"]},
                    },
                    {
                        "id": "backendconf::parity::b[float32]",
                        "outcome": "known_failure",
                        "verdict": "failed",
                        "error": {"type": "CheckFailed", "message": "off"},
                        "known_failure": {"pattern": "parity::b*", "reason": "r", "link": target},
                    },
                ]
            )
        ]
    )
    hrefs = re.findall(r'href="([^"]*)"', page)
    assert hrefs and all(h.startswith("#") for h in hrefs), hrefs  # only the page's own anchors
    assert html.escape(target.strip()) in page  # still shown, as text
    safe = render(
        [
            report_of(
                [
                    {
                        "id": "backendconf::parity::a[float32]",
                        "outcome": "failed",
                        "error": {"type": "CheckFailed", "message": "off"},
                        "reproduction": {"script": "/tmp/repro 1.py", "nodes": 1, "ops": ["aten::sub"]},
                    }
                ]
            )
        ]
    )
    assert 'href="file:///tmp/repro%201.py"' in safe
