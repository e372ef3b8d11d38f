"""Ops checks that share one lowering (``Capabilities(batch_ops=True)``, ``--backendconf-batch``) keep the
outcome each has alone, check by check.

A real engine (ONNX Runtime) runs the same selection batched and unbatched:
passes, rejections at the op's own node and at an input, and failed
comparisons must come out the same. Backends with defects inside a batch
(``broken_backends_batching``) show each defect blamed on its own checks
only: a rejection, an execute error that names no node (the batch is split),
a wrong kernel, and a crash of the backend host.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import re

import pytest

from pytest_backendconf.suite._batching import Batcher

# torchao registers operators when first imported, and pytester's in-process runs forget the modules each
# imported: import it once here, before them (the quantized category imports it), or a second run fails.
try:
    importlib.import_module("torchao.quantization.pt2e.quantize_pt2e")
except ImportError:
    pass

# passes, rejections (amax names its input), the avg_pool divisor_override failure, in two dtypes
ONNX_SELECTION = [
    "backendconf::ops::aten.a[bc]*[[]float32-sample0]",  # not amax/amin: compiler failures split a batch
    "backendconf::ops::aten.avg_pool2d*[[]float32-sample0]",
    "backendconf::ops::aten.special_chebyshev_polynomial_t*[[]float32-sample0]",
    "backendconf::ops::aten.[cn]e*[[]float16-sample0]",
    # its rejection names a node the exporter numbered across the program: it must run alone
    "backendconf::ops::aten.amax*[[]float16-sample0]",
    # cummax and cummin, both samples: rejected together in one error, before decomposing
    "backendconf::ops::aten.cumm*[[]float32-*",
]


def _run(pytester, backend, selection, *extra, subprocess=False):
    report = pytester.path / f"report-{len(list(pytester.path.glob('report-*')))}.json"
    args = ["-p", "no:cacheprovider", "-p", "no:randomly", f"--backend={backend}", f"--backendconf-report={report}"]
    args += [f"--backendconf-select={s}" for s in selection] + list(extra)
    result = pytester.runpytest_subprocess(*args) if subprocess else pytester.runpytest(*args)
    return result, {t["id"]: t for t in json.loads(report.read_text())["tests"]}


def _same(record):
    """What must not change between a batched and an unbatched run: everything but time and temp paths."""
    text = json.dumps({k: v for k, v in record.items() if k != "duration"}, sort_keys=True)
    # torchlib prints a type constraint's members in set order, which differs from process to process
    text = re.sub(r"[A-Z][A-Z0-9]*(?: \| [A-Z][A-Z0-9]*)+", lambda m: " | ".join(sorted(m[0].split(" | "))), text)
    return re.sub(r"/tmp/\S*?/(pytest-\d+|ops-inputs[^/]*)/", "/TMP/", re.sub(r"pytest-\d+", "pytest-N", text))


def _agree(batched, alone):
    assert batched.keys() == alone.keys()
    different = [i for i in batched if _same(batched[i]) != _same(alone[i])]
    assert not different, [(batched[i], alone[i]) for i in different[:2]]


@pytest.fixture
def batch_pytester(pytester):
    pytester.syspathinsert(pathlib.Path(__file__).parent)
    pytester.makeini("[pytest]\n")
    return pytester


@pytest.mark.slow
def test_onnxruntime_batched_and_unbatched_give_every_check_the_same_outcome(batch_pytester):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("backendconf_onnxruntime")
    # Imported before pytester's in-process runs, each of which forgets the modules it imported:
    # onnx's native extension aborts a process that imports it a second time.
    for module in ("onnx", "onnx_ir", "onnxscript", "torch.onnx", "backendconf_onnxruntime.exporter"):
        importlib.import_module(module)
    result, batched = _run(batch_pytester, "onnxruntime", ONNX_SELECTION, "--backendconf-batch=auto")
    # declared batch_ops=True: auto batches, in fewer lowerings than checks
    shared = re.search(r"batched: (\d+) checks? decided in (\d+) shared lowerings?", result.stdout.str())
    assert shared is not None and int(shared[1]) > int(shared[2]) >= 1, result.stdout.str()[-2000:]
    result, alone = _run(batch_pytester, "onnxruntime", ONNX_SELECTION, "--backendconf-batch=off")
    assert "shared lowerings" not in result.stdout.str()
    _agree(batched, alone)
    outcomes = {t["outcome"] for t in alone.values()}
    assert {"passed", "unsupported", "failed"} <= outcomes


def test_defects_inside_a_batch_are_blamed_on_their_own_checks(batch_pytester, monkeypatch):
    selection = [f"backendconf::ops::aten.{op}[[]float16-*" for op in ("abs.*", "add.*", "mul.*", "neg.*", "sub.*")]
    counted = []
    resolve = Batcher._resolve
    monkeypatch.setattr(Batcher, "_resolve", lambda self, checks: (counted.append(len(checks)), resolve(self, checks)))
    result, batched = _run(batch_pytester, "troubled_batches", selection, "-p", "broken_backends_batching")
    assert counted[0] >= 5  # the first batch held every overload (and was then split for neg)
    _, alone = _run(
        batch_pytester, "troubled_batches", selection, "-p", "broken_backends_batching", "--backendconf-batch=off"
    )
    _agree(batched, alone)
    by_op = {}
    for check_id, record in batched.items():
        by_op.setdefault(check_id.split("::")[2].split("[")[0], set()).add(record["outcome"])
    assert by_op["aten.mul.Tensor"] == {"unsupported"}
    assert by_op["aten.neg.default"] == {"failed"}
    assert by_op["aten.sub.Tensor"] == {"failed"}
    assert by_op["aten.abs.default"] == {"passed"} and by_op["aten.add.Tensor"] == {"passed"}
    assert "no multiplier" in next(r["reason"] for i, r in batched.items() if "mul.Tensor" in i)
    assert "negation unit" in next(r["error"]["message"] for i, r in batched.items() if "neg.default" in i)


# abs, add, mul and div in float16: two samples of each, so that each op's second check may meet its first's rejection
BULK_SELECTION = [
    f"backendconf::ops::aten.{op}[[]float16-*" for op in ("abs.default", "add.Tensor", "mul.Tensor", "div.Tensor")
]


def test_a_backend_naming_every_rejected_node_at_once_keeps_each_outcome(batch_pytester):
    result, batched = _run(batch_pytester, "bulk_rejects", BULK_SELECTION, "-p", "broken_backends_batching")
    _, alone = _run(
        batch_pytester, "bulk_rejects", BULK_SELECTION, "-p", "broken_backends_batching", "--backendconf-batch=off"
    )
    _agree(batched, alone)
    outcomes = {i.split("::")[2].split("[")[0]: r["outcome"] for i, r in batched.items()}
    assert outcomes["aten.mul.Tensor"] == outcomes["aten.div.Tensor"] == "unsupported"
    assert outcomes["aten.abs.default"] == outcomes["aten.add.Tensor"] == "passed"
    assert "no divider" in next(r["reason"] for i, r in batched.items() if "div.Tensor" in i)
    # The first rejection of each op is confirmed alone; its second check's is then taken from the batch.
    shared = re.search(r"batched: (\d+) checks? decided in (\d+) shared lowerings?", result.stdout.str())
    assert shared is not None and int(shared[1]) > 2, result.stdout.str()[-2000:]
    assert "rejection list is wrong" not in result.stdout.str()


def test_a_wrong_or_partial_rejection_list_does_not_change_any_outcome(batch_pytester):
    result, batched = _run(batch_pytester, "wrong_rejection_list", BULK_SELECTION, "-p", "broken_backends_batching")
    _, alone = _run(
        batch_pytester,
        "wrong_rejection_list",
        BULK_SELECTION,
        "-p",
        "broken_backends_batching",
        "--backendconf-batch=off",
    )
    _agree(batched, alone)
    assert {r["outcome"] for i, r in batched.items() if "abs.default" in i} == {"passed"}
    assert {r["outcome"] for i, r in batched.items() if "div.Tensor" in i} == {"unsupported"}
    # the abs checks ran alone and contradicted the batch: said loudly
    assert re.search(
        r"the backend named \d+ nodes? as rejected in a batch that it judged otherwise alone", result.stdout.str()
    )
    assert "its rejection list is wrong" in result.stdout.str()
    # ... naming each check and the node the batch's rejection named
    abs_checks = sorted(i for i in batched if "abs.default" in i)
    for check in abs_checks:
        short = check.removeprefix("backendconf::")
        assert re.search(
            rf"  {re.escape(short)}: the batch's rejection named '.*aten::abs.*'; alone it passed", result.stdout.str()
        ), result.stdout.str()


@pytest.mark.slow
def test_a_crash_inside_a_batch_is_blamed_on_the_crashing_check_only(batch_pytester, monkeypatch):
    monkeypatch.delenv("BACKENDCONF_IN_PROCESS", raising=False)  # the backend host, which a crash takes down
    selection = [f"backendconf::ops::aten.{op}[[]float32-sample0]" for op in ("abs.*", "add.*", "cos.*", "neg.*")]
    result, batched = _run(batch_pytester, "crashing_cos", selection, "-p", "broken_backends_batching")
    failed = sorted(i for i, r in batched.items() if r["outcome"] == "failed")
    assert failed == ["backendconf::ops::aten.cos.default[float32-sample0]"], result.stdout.str()[-3000:]
    assert "took down the process running ops::aten.cos.default[float32-sample0]" in result.stdout.str()
    assert {r["outcome"] for i, r in batched.items() if "cos" not in i} == {"passed"}
    assert len(batched) >= 4


def test_batching_choice_reads_the_option_then_the_ini_then_the_capabilities(batch_pytester):
    batch_pytester.makeini("[pytest]\nbackendconf_batch = sometimes\n")
    result = batch_pytester.runpytest("--backend=reference", "--backendconf-select=ops::aten.abs.default[[]float32-*")
    assert result.ret == 4 or "backendconf_batch = 'sometimes'" in result.stdout.str() + result.stderr.str()
    assert "write one of auto, on, off" in result.stdout.str() + result.stderr.str()


def test_batch_ops_must_be_a_bool_or_none():
    import pytest_backendconf as bc

    assert bc.Capabilities(batch_ops=True).problems() == []
    assert bc.Capabilities().batch_ops is None
    assert bc.Capabilities(batch_ops="yes").problems() == ["batch_ops is 'yes': write True, False or None"]


@pytest.mark.slow  # three runs, two with two workers each: `make test-slow`
def test_under_xdist_each_worker_batches_its_own_groups(batch_pytester):
    pytest.importorskip("xdist")
    tests = str(pathlib.Path(__file__).parent)
    # the workers find the backends through the conftest, as a vendor's would register its own
    batch_pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {tests!r})\nfrom broken_backends_batching import backendconf_register_backends\n"
    )
    # enough overloads that each worker's groups hold several
    selection = [f"backendconf::ops::aten.{op}[[]float16-*" for op in ("a*", "c*", "mul.*", "neg.*", "sub.*")]
    result, batched = _run(batch_pytester, "troubled_batches", selection, "-n", "2")
    shared = re.search(r"batched: (\d+) checks? decided in (\d+) shared lowerings?", result.stdout.str())
    assert shared is not None and int(shared[1]) > int(shared[2]), result.stdout.str()[-2000:]
    _, alone = _run(batch_pytester, "troubled_batches", selection, "--backendconf-batch=off")
    _agree(batched, alone)
    # without the suite's grouping a worker cannot know which checks it runs: no batches
    result, _ = _run(batch_pytester, "troubled_batches", selection, "-n", "2", "-p", "no:backendconf_xdist")
    assert "shared lowerings" not in result.stdout.str()
