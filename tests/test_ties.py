"""Index outputs whose ties PyTorch leaves open are judged valid or not in parity and delegation, as in ops.

The model is tied_models.py's ``tied_indices`` (values rounded to 0 … 4, so
every row has ties); the backends are eager_backends.py's: ``other_ties``
breaks every tie the other way (valid), ``smallest_topk`` returns topk's
values with the indices of the k smallest (invalid), and their
``*_no_sigmoid`` twins are partitioned around the model's sigmoid so that
the delegation category runs them. The zoo's models with index outputs
(``reductions``, ``statistics``, ``dict_output``) are run too.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from eager_backends import OtherTies, SmallestTopk, _smallest_topk, _topk
from pytest_backendconf.diagnostics import locate_in_program
from pytest_backendconf.numerics import InvalidIndices, settle_program_ties, tie_open_outputs
from tied_models import TiedIndices

TESTS = pathlib.Path(__file__).parent


def _tied():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    program = torch.export.export(TiedIndices().eval(), (x,))
    return program, x, list(TiedIndices()(x))


def test_the_graph_says_which_outputs_are_tie_open_indices():
    program, _, _ = _tied()
    found = {
        at: (node.name, call.overload, call.dim, call.keepdim) for at, (node, call) in tie_open_outputs(program).items()
    }
    # topk's and sort's indices through getitem, max.dim's second item, argmin itself; not the values, not y * 2
    assert found == {
        1: ("topk", "aten.topk.default", -1, True),
        2: ("sort", "aten.sort.default", -1, True),
        4: ("max_1", "aten.max.dim", 0, False),
        5: ("argmin", "aten.argmin.default", -1, False),
    }


class _NotTieOpen(torch.nn.Module):
    def forward(self, x):
        _, stable = torch.sort(x, stable=True)
        return stable, torch.argmax(x, dim=0) + 1, torch.topk(x, 2).indices.flatten()


def test_a_stable_sort_and_outputs_computed_from_indices_are_compared_exactly():
    x = torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    program = torch.export.export(_NotTieOpen(), (x,))
    assert tie_open_outputs(program) == {}
    expected = list(_NotTieOpen()(x))
    other = [expected[0].flip(-1), expected[1], expected[2]]
    assert settle_program_ties(program, [x], other, expected) == (other, [])


def test_a_valid_order_of_ties_is_settled_and_other_values_are_not():
    program, x, expected = _tied()
    y = torch.round(torch.sigmoid(x) * 4)
    other = list(expected)
    other[1] = _topk(y, 3)[1]
    assert not torch.equal(other[1], expected[1])  # the ties are there, broken the other way
    settled, at = settle_program_ties(program, [x], other, expected)
    assert at == [1] and torch.equal(settled[1], expected[1])
    wrong = list(expected)
    wrong[1] = _smallest_topk(y, 3)[1]
    with pytest.raises(
        InvalidIndices, match=r"output 1 \(indices of aten.topk.default\) at \[0, 0\]: index \d selects"
    ):
        settle_program_ties(program, [x], wrong, expected)
    out_of_range = list(expected)
    out_of_range[5] = expected[5] + 8
    with pytest.raises(InvalidIndices, match="out of range for dimension 1 of size 8"):
        settle_program_ties(program, [x], out_of_range, expected)


def test_the_divergence_locator_blames_wrong_indices_not_other_ties():
    program, x, _ = _tied()
    assert locate_in_program(program, OtherTies(), [x], top_class="TiedIndices") is None
    found = locate_in_program(program, SmallestTopk(), [x], top_class="TiedIndices")
    assert found is not None and found.node == "topk"


# --- real runs --------------------------------------------------------------------------------


def _run(pytester, backend, *selects):
    pytester.syspathinsert(TESTS)
    pytester.makeini("[pytest]\n")
    report = pytester.path / f"report-{backend}.json"
    args = ["-p", "eager_backends", "-p", "tied_models", f"--backend={backend}", "-p", "no:cacheprovider"]
    args += ["-p", "no:randomly", f"--backendconf-report={report}", "--backendconf-hypothesis=ci"]
    args += [f"--backendconf-select={s}" for s in selects]
    result = pytester.runpytest(*args)
    return result, {t["id"]: t for t in json.loads(report.read_text())["tests"]}


def _rerun(path, backend):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    command = [sys.executable, "-m", "pytest_backendconf.rerun", path, f"--backend={backend}"]
    command += ["-p", "eager_backends", "-p", "tied_models"]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_parity_passes_other_ties_and_fails_other_values(pytester):
    with_indices = ("tied_indices", "reductions", "statistics", "dict_output")
    result, tests = _run(pytester, "other_ties", *(f"backendconf::parity::{m}[[]*" for m in with_indices))
    assert len(tests) >= 10 and {t["outcome"] for t in tests.values()} == {"passed"}, result.stdout.str()[-3000:]
    assert {"backendconf::parity::tied_indices[float32-dynamic]", "backendconf::parity::reductions[float32]"} <= set(
        tests
    )
    result, tests = _run(pytester, "smallest_topk", "backendconf::parity::tied_indices[[]*")
    assert len(tests) == 6 and {t["outcome"] for t in tests.values()} == {"failed"}, result.stdout.str()[-3000:]
    message = tests["backendconf::parity::tied_indices[float32]"]["error"]["message"]
    assert "the backend's indices select other values than eager PyTorch's" in message
    assert re.search(r"output 1 \(indices of aten.topk.default\) at \[\d+, \d+\]: index \d selects", message)
    assert "(ties may be broken either way, other values may not)" in message
    dynamic = tests["backendconf::parity::tied_indices[float32-dynamic]"]["error"]["message"]
    assert "lowered once with dynamic shapes" in dynamic and "indices of aten.topk.default" in dynamic
    # The saved inputs rerun with the same judgement: the other order of ties passes, other values fail.
    saved = re.search(r"inputs: (\S+tied_indices\.forward-float32\.safetensors)", result.stdout.str())
    assert saved, result.stdout.str()[-3000:]
    saved = saved.group(1)
    ok = _rerun(saved, "other_ties")
    assert ok.returncode == 0 and "against eager: passed" in ok.stdout, ok.stdout + ok.stderr
    bad = _rerun(saved, "smallest_topk")
    assert bad.returncode == 1 and "indices of aten.topk.default" in bad.stdout, bad.stdout + bad.stderr


def test_delegation_passes_other_ties_and_fails_other_values(pytester):
    result, tests = _run(pytester, "other_ties_no_sigmoid", "backendconf::delegation::tied_indices[[]*")
    assert len(tests) == 3 and {t["outcome"] for t in tests.values()} == {"passed"}, result.stdout.str()[-3000:]
    assert all(t["details"]["delegation"]["delegated"] > 0 for t in tests.values())  # partitioned, not lowered whole
    result, tests = _run(pytester, "smallest_topk_no_sigmoid", "backendconf::delegation::tied_indices[[]*")
    assert len(tests) == 3 and {t["outcome"] for t in tests.values()} == {"failed"}, result.stdout.str()[-3000:]
    message = tests["backendconf::delegation::tied_indices[float32]"]["error"]["message"]
    assert "partially delegated" in message and "indices of aten.topk.default" in message
