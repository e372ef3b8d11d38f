"""The ops matrix says "known failure" where every failure of a cell is listed: in the JSON report's
``ops.overloads``, in ``backendconf report ops`` and on the HTML page (its cells and its filter).

One real run of a backend whose float16 subtraction is wrong, with that check listed as a known failure.
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from pathlib import Path

from pytest_backendconf.cli._main import main
from pytest_backendconf.report._ops import matrix_text, ops_matrix
from report_records import records
from pytest_backendconf.report import ReportTest

TESTS = Path(__file__).parent
SUB = "backendconf::ops::aten.sub.Tensor[float16-sample0]"
ADD = "backendconf::ops::aten.add.Tensor[float32-sample0]"


def test_a_listed_failure_is_a_known_failure_in_the_json_the_table_and_the_page(pytester, capsys):
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(
        textwrap.dedent("""
        from broken_backends_ops import WrongHalfSub

        def backendconf_register_backends(register):
            register(WrongHalfSub())
        """)
    )
    (pytester.path / "known.toml").write_text(f'"{SUB}" = {{ reason = "fp16 sub", link = "" }}\n')
    result = pytester.runpytest(
        "--backend=wrong_half_sub",
        "-p",
        "no:cacheprovider",
        "--backendconf-known-failures=known.toml",
        "--backendconf-report=report.json",
        "--backendconf-html=report.html",
        *(f"--backendconf-select={i.replace('[', '[[]')}" for i in (SUB, ADD)),
    )
    assert result.ret == 0, result.stdout.str()  # a green run
    result.assert_outcomes(passed=1, xfailed=1)

    # JSON: the cell says what the run said.
    overloads = json.loads((pytester.path / "report.json").read_text())["ops"]["overloads"]
    assert overloads["aten.sub.Tensor"]["float16"] == "known failure"
    assert overloads["aten.add.Tensor"]["float32"] == "passed"

    # backendconf report ops: the row says it in words, the columns still line up.
    capsys.readouterr()
    assert main(["report", "ops", str(pytester.path / "report.json")]) == 0
    table = capsys.readouterr().out.splitlines()
    (row,) = [line for line in table if line.startswith("aten.sub.Tensor")]
    assert "known failure" in row and "FAIL" not in row
    assert len(row) == len(table[0])

    # HTML: the cell is a known failure's, opens its check, and the filter finds it by those words.
    page = html.unescape((pytester.path / "report.html").read_text())
    ops = page[page.index("Operators × dtypes") :]
    (sub_row,) = re.findall(r'<tr data-filter="[^"]*"><th scope="row">aten.sub.Tensor</th>.*?</tr>', ops)
    assert 'data-filter="aten.sub.tensor' in sub_row and "known failure" in sub_row.split(">", 1)[0]
    assert '<td class="cell known_failure"' in sub_row and "data-open=" in sub_row
    assert '<td class="cell failed"' not in sub_row


def test_a_cell_with_an_unlisted_failure_is_failed_and_a_known_failure_is_never_fully_supported():
    def test(sample: int, outcome: str) -> ReportTest:
        [record] = records([{"id": f"backendconf::ops::aten.sub.Tensor[float16-sample{sample}]", "outcome": outcome}])
        return record

    listed = ops_matrix([test(0, "known_failure"), test(1, "passed")], declared=["aten.sub.Tensor"])
    assert listed is not None and listed["overloads"]["aten.sub.Tensor"]["float16"] == "known failure"
    assert listed["fully_supported"] == []
    assert listed["declared_but_not_passing"] == ["aten.sub.Tensor"]
    assert "known failure" in matrix_text(listed)
    mixed = ops_matrix([test(0, "known_failure"), test(1, "failed")])
    assert mixed is not None and mixed["overloads"]["aten.sub.Tensor"]["float16"] == "failed"
    stale = ops_matrix([test(0, "unexpected_pass")])  # an entry that is out of date fails the run and the cell
    assert stale is not None and stale["overloads"]["aten.sub.Tensor"]["float16"] == "failed"
