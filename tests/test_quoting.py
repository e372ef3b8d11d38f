"""Files written from foreign text keep their structure: hostile texts through each writer, parsed back.

Each text below is one a model, an archive, an engine's error or someone
else's report may hold. Each writer (`_quoting`'s function for its language,
then the real writer that uses it) is fed all of them, and its output is
parsed with that language's own parser: the structure is what the writer
laid out, the text comes back as data, and nothing in it runs.
"""

from __future__ import annotations

import ast
import io
import json
import re
import shlex
import subprocess
import sys
import tokenize
import tomllib
from html.parser import HTMLParser
from pathlib import Path
from xml.dom import minidom

import pytest

from pytest_backendconf._quoting import (
    html_text,
    markdown_code,
    python_comment,
    python_literal,
    shell_command,
    toml_comment,
    toml_string,
    visible,
    xml_text,
)

#: Would create a file named PWNED in the working folder if it ever ran as Python.
PAYLOAD = 'import pathlib; pathlib.Path("PWNED").write_text("ran")'
HOSTILE = [
    f'"""\n{PAYLOAD}\n"""',
    f"'''\n{PAYLOAD}\n'''",
    f"x\n{PAYLOAD}",
    f"x\r{PAYLOAD}",
    f"x\r\n{PAYLOAD}",
    f"x\u2028{PAYLOAD}",
    f"x\x0c{PAYLOAD}",
    f"x\x85{PAYLOAD}",
    "# -*- coding: latin-1 -*-",
    "nul\x00byte",
    "`code` and ``two`` and ```three```",
    "`",
    "a | b || c \\| d \\",
    "]]> <![CDATA[ x ]]>",
    "<script>alert(1)</script> & \"quotes\" 'single'",
    "\x1b[2J\x1b[31mred\u202e",
    "lone \ud800 surrogate",
    "tab\there",
    '" = { reason = "forged" }\n"backendconf::*" = { reason = "all',
    "",
    " spaced ",
]


def _toml_expected(text: str) -> str:
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


# --- the quoting functions, language by language -----------------------------------------------


@pytest.mark.parametrize("text", HOSTILE)
def test_python_literal_and_comment_keep_the_text_data(text):
    assert ast.literal_eval(python_literal(text)) == text
    assert ast.literal_eval(python_literal([text, (1.5, -2, None)])) == [text, (1.5, -2, None)]
    source = f'"""Doc."""\n{python_comment(text)}\nDONE = 1\n'
    tree = ast.parse(source)  # NUL, a stray quote or a coding line would break this or change the file
    assert ast.get_docstring(tree) == "Doc."
    assert [type(node).__name__ for node in tree.body] == ["Expr", "Assign"]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    assert comments == [f"# {visible(line)}" if line else "#" for line in (text.splitlines() or [""])]


def test_a_comment_prefix_must_be_a_comment():
    with pytest.raises(ValueError, match="a comment prefix starts with '#'"):
        python_comment("x", prefix="  ")


@pytest.mark.parametrize("text", HOSTILE)
def test_shell_command_gives_back_each_argument(text):
    parts = ["python", "-m", "pytest_backendconf.rerun", text, f"--backend={text}"]
    assert shlex.split(shell_command(parts)) == parts


@pytest.mark.parametrize("text", HOSTILE)
def test_toml_strings_and_comments_parse_back(text):
    document = f"{toml_comment(text)}\n{toml_string(text)} = {{ reason = {toml_string(text)} }}\nlast = 1\n"
    assert "\n" not in toml_string(text)
    parsed = tomllib.loads(document)
    assert parsed == {_toml_expected(text): {"reason": _toml_expected(text)}, "last": 1}


@pytest.mark.parametrize("text", HOSTILE)
def test_xml_text_is_well_formed_in_text_and_attributes(text):
    document = minidom.parseString(f'<a b="{xml_text(text)}">{xml_text(text)}</a><!-- end -->'.join(["<r>", "</r>"]))
    (element,) = document.documentElement.getElementsByTagName("a")
    shown = re.sub("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]", lambda m: repr(m.group())[1:-1], text)
    assert element.getAttribute("b") == shown
    assert "".join(n.data for n in element.childNodes) == shown


def _cells(row: str) -> list[str]:
    """A GitHub-flavoured Markdown table row's cells: split at every ``|`` not escaped by a backslash."""
    assert row.startswith("|") and row.endswith("|"), row
    return re.split(r"(?<!\\)\|", row[1:-1])


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_code_spans_stay_in_their_cell(text):
    span = markdown_code(text)
    row = f"| {span} | {span} |"
    assert "\n" not in row and len(row.splitlines()) == 1
    assert len(_cells(row)) == 2
    fence = re.match("`+", span).group()
    inner = span[len(fence) : -len(fence)]
    assert span.endswith(fence) and fence not in inner  # no run of backticks as long as the fence inside


@pytest.mark.parametrize("text", HOSTILE)
def test_html_text_adds_no_element(text):
    tags = _Tags()
    tags.feed(f'<p title="{html_text(text)}">{html_text(text)}</p>')
    tags.close()
    assert tags.starts == ["p"] and tags.title == re.sub("[\ud800-\udfff]", lambda m: repr(m.group())[1:-1], text)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: list[str] = []
        self.title: str | None = None

    def handle_starttag(self, tag, attrs):
        self.starts.append(tag)
        self.title = dict(attrs).get("title", self.title)


# --- the writers ------------------------------------------------------------------------------


def test_a_known_failures_file_of_hostile_entries_reads_back_entry_for_entry(tmp_path):
    from pytest_backendconf.report._known_failures import KnownFailure, format_known_failures, load_known_failures

    entries = [KnownFailure(f"backendconf::parity::x{i}{text}", text or "r", text) for i, text in enumerate(HOSTILE)]
    path = tmp_path / "known.toml"
    path.write_text(format_known_failures(entries, backend='be\nvil = 1 \'"""'), encoding="utf-8")
    loaded = load_known_failures(path, "--backendconf-known-failures")
    assert [(e.pattern, e.reason, e.link) for e in loaded] == sorted(
        (_toml_expected(e.pattern), _toml_expected(e.reason), _toml_expected(e.link)) for e in entries
    )
    assert set(tomllib.loads(path.read_text(encoding="utf-8"))) == {e.pattern for e in loaded}


def test_replay_junit_xml_of_hostile_names_and_messages_parses_with_one_case_each():
    from pytest_backendconf.cli._replay import junit_xml
    from pytest_backendconf.target import BundleResult

    results = [
        BundleResult(f"/tmp/{i}{text}.bcpt", f"m{text}", i, "failed" if i % 2 else "error", text, {"type": text})
        for i, text in enumerate(HOSTILE)
    ]
    document = minidom.parseString(junit_xml(results, 1.0).encode("utf-8"))
    cases = document.getElementsByTagName("testcase")
    assert len(cases) == len(HOSTILE)
    assert len(document.getElementsByTagName("failure")) + len(document.getElementsByTagName("error")) == len(HOSTILE)
    for case, text in zip(cases, HOSTILE):
        shown = xml_text(text, markup=False)
        (verdict,) = [n for n in case.childNodes if n.nodeType == n.ELEMENT_NODE]
        assert verdict.getAttribute("type") == shown
        assert "".join(n.data for n in verdict.childNodes) == shown.replace("\r\n", "\n").replace("\r", "\n")


def _hostile_reports(tmp_path):
    from test_report_merge import SMALL_CNN, make_report

    ids = {f"backendconf::parity::m{i}[{text}]": "failed" for i, text in enumerate(HOSTILE)}
    ours = make_report(outcomes={SMALL_CNN: "passed", **dict.fromkeys(ids, "passed")}, backend="be|`x`\nvil")
    theirs = make_report(torch="2.14\n| forged | row |", outcomes={SMALL_CNN: "passed", **ids}, backend="be|`x`\nvil")
    for i, test in enumerate(t for t in theirs["tests"] if t["id"] in ids):
        test["error"]["message"] = HOSTILE[i]
        test["error"]["type"] = HOSTILE[-3 - i % 3] or "E"
    paths = []
    for name, document in (("ours.json", ours), ("theirs.json", theirs)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(document), encoding="utf-8")
    return paths, ids


def test_the_markdown_matrix_of_hostile_reports_keeps_its_rows_and_columns(tmp_path, capsys):
    from pytest_backendconf.cli._main import main

    paths, ids = _hostile_reports(tmp_path)
    target = tmp_path / "matrix.md"
    assert main(["report", "merge", *map(str, paths), "--markdown", str(target)]) == 0
    capsys.readouterr()
    tables: list[list[str]] = []
    previous = ""
    for line in target.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        else:
            assert "PWNED" not in line or line.startswith("- ")  # prose lines hold it only inside code spans
        previous = line
    matrix, flips, reports = tables
    assert len(matrix) == 2 + 2 and len(reports) == 2 + 2  # header, rule, one row per report
    assert len(flips) == 2 + len(ids)  # one row per flipped check, none forged
    for table in tables:
        assert {len(_cells(row)) for row in table} == {len(_cells(table[0]))}, table


def test_the_html_page_of_hostile_reports_adds_no_element(tmp_path, capsys):
    from pytest_backendconf.cli._main import main

    paths, ids = _hostile_reports(tmp_path)
    page = tmp_path / "page.html"
    assert main(["report", "html", *map(str, paths), "-o", str(page)]) == 0
    capsys.readouterr()
    tags = _Tags()
    tags.feed(page.read_text(encoding="utf-8"))
    assert tags.starts.count("script") == 1  # the page's own filter script, nothing from the reports
    assert tags.starts.count("details") >= len(ids)


@pytest.fixture
def hostile_reproduction():
    """A `Reproduction` of a real exported program whose every foreign text is hostile."""
    import torch

    from pytest_backendconf.diagnostics import Candidate, Outcome, Reproduction

    class Small(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    x = torch.randn(2, 3)
    program = torch.export.export(Small(), (x,))
    nodes = tuple(n.name for n in program.graph_module.graph.nodes if n.op == "call_function")
    message = "\n".join(HOSTILE)
    outcome = Outcome("raised", error_type=HOSTILE[0], message=HOSTILE[0] + "\n" + message)
    candidate = Candidate(nodes, tuple(HOSTILE[i] for i in range(len(nodes))), outcome)
    return Reproduction(program, [x], candidate, len(nodes), 1, 0.1, output_ops=list(HOSTILE[:1]))


@pytest.mark.slow
def test_a_repro_script_holds_hostile_texts_as_comments_and_literals_only(hostile_reproduction, tmp_path):
    from pytest_backendconf.diagnostics import write_script

    hostile = "\n".join(HOSTILE)
    script = write_script(
        hostile_reproduction,
        tmp_path,
        "repro_hostile",
        backend="reference",
        plugins=[],
        title=f"backendconf::parity::x[{hostile}] on backend 'reference'",
        subject=hostile,
    )
    source = script.read_text(encoding="utf-8")
    tree = ast.parse(source)
    assert ast.get_docstring(tree) == (
        "Minimal reproduction of a backend's failure, cut by pytest-backendconf: what fails is said below."
    )
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for text in HOSTILE:
        for line in text.splitlines():
            assert any(visible(line) in comment for comment in comments), line
    # The module's statements are the template's: imports, constants, the class, the functions, the main guard.
    assigned = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    assert assigned == ["HERE", "BACKEND", "PLUGINS", "PLUGIN_PATHS", "FAILURE", "OUTPUT_OPS", "TOLERANCES"]
    constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets}
    assert ast.literal_eval(constants["OUTPUT_OPS"]) == HOSTILE[:1]
    # And it runs as the template says: it lowers and calls the program, and nothing of the texts runs.
    work = tmp_path / "cwd"
    work.mkdir()
    done = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no failure: backend 'reference' ran this program" in done.stdout
    assert list(work.iterdir()) == [] and not (tmp_path / "PWNED").exists()


def test_the_writers_use_the_quoting_functions():
    # One function per language: the writers name them, and hold no quoting of their own.
    root = Path(__file__).resolve().parent.parent / "pytest_backendconf"
    uses = {
        "diagnostics/_repro_script.py": ("python_comment", "python_literal"),
        "report/_known_failures.py": ("toml_string", "toml_comment"),
        "cli/_replay.py": ("xml_text",),
        "report/_merge.py": ("markdown_code",),
        "report/_html.py": ("html_text", "shell_command"),
        "suite/_suite.py": ("shell_command",),
        "suite/_context.py": ("shell_command",),
    }
    for module, names in uses.items():
        text = (root / module).read_text(encoding="utf-8")
        for name in names:
            assert name in text, f"{module} does not use {name}"
        assert "shlex" not in text and "json.dumps(text" not in text and "html.escape" not in text, module


def test_visible_escapes_exactly_the_hidden_categories_on_its_fast_path_too():
    # visible() returns a printable text as it is (str.isprintable, in C) and walks the rest: every
    # character of the first planes, alone and inside printable text, gets the per-character answer.
    import unicodedata

    hidden = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}

    def one_by_one(text: str) -> str:
        return "".join(repr(c)[1:-1] if c != "\t" and unicodedata.category(c) in hidden else c for c in text)

    for code in [*range(0x3000), 0xFEFF, 0x202E, 0x2028, 0x2029, 0xD800, 0xE000, 0x10FFFF, 0xE0001]:
        ch = chr(code)
        assert visible(ch) == one_by_one(ch), hex(code)
        assert visible(f"a {ch} b") == one_by_one(f"a {ch} b"), hex(code)
    assert visible("tab\tand\nline") == "tab\tand\\nline"
