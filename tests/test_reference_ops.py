"""The reference backend's op table: declared = delivered, every dtype it declares, old blobs.

- Its ``Capabilities.supported_ops`` and ``dtypes`` come from the op table
  (``pytest_backendconf.reference.ops``); a real ``-m ops`` run (one sample
  of every (overload, dtype) cell of the shipped data) must pass every
  check: nothing declared is rejected or wrong, nothing is left unsupported.
- The dtypes the ops data has no column for (the small integers, float64,
  uint64) run real programs against eager.
- Opcodes are append only: the first table's opcode map and an archive its
  blobs were written in (``tests/data/make_reference_blobs_v1.py``) keep
  their meaning.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from torch import nn

import pytest_backendconf as bc
from backendconf_reference import ReferenceBackend, bytecode, ops
from pytest_backendconf.conformance.ops import discovery

DATA = pathlib.Path(__file__).parent / "data"
SHIPPED = discovery.load(discovery.DATA_DIR, discovery.release())
needs_data = pytest.mark.skipif(SHIPPED is None, reason=f"no ops data shipped for torch {torch.__version__}")


# --- declared = delivered ---------------------------------------------------------------------


def test_capabilities_are_the_op_table():
    capabilities = ReferenceBackend.capabilities
    assert capabilities.supported_ops == {op.name for op in ops.OPS} == ops.SUPPORTED_OPS
    assert capabilities.dtypes == ops.SUPPORTED_DTYPES
    # Every declared dtype can be stored in a blob (constants, dtype arguments).
    assert all(bytecode.can_encode(d) for d in ops.SUPPORTED_DTYPES)


@needs_data
def test_every_overload_of_the_ops_data_is_declared():
    assert SHIPPED is not None
    missing = sorted({s.overload for s in SHIPPED.samples} - ops.SUPPORTED_OPS)
    assert not missing, f"overloads of the ops data the op table lacks: {missing}"
    assert {getattr(torch, s.dtype) for s in SHIPPED.samples} <= ops.SUPPORTED_DTYPES


@pytest.mark.slow
@needs_data
def test_an_ops_run_passes_every_declared_overload_in_every_dtype(pytester):
    # One sample of each (overload, dtype) cell: every cell the data has, a third of the checks.
    pytester.makeini("[pytest]\n")
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        "--backend=reference",
        "-m",
        "ops",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--backendconf-select=backendconf::ops::*-sample0]",
        f"--backendconf-report={report}",
    )
    matrix = json.loads(report.read_text())["ops"]
    assert matrix["checks"]["failed"] == 0, result.stdout.str()[-3000:]
    assert matrix["checks"]["unsupported"] == 0
    assert matrix["declared_but_not_passing"] == []
    passed = {
        (overload, dtype)
        for overload, cells in matrix["overloads"].items()
        for dtype, outcome in cells.items()
        if outcome == "passed"
    }
    assert SHIPPED is not None
    # The quantize/dequantize overloads' own samples (int8, uint8) pass too; they are the suite's, not OpInfo's.
    from pytest_backendconf.conformance.ops import _quantized as _ops_quantized

    qdq = {(s.overload, s.dtype) for s in _ops_quantized.qdq_samples()}
    assert qdq <= passed
    passed -= qdq
    assert passed == {(s.overload, s.dtype) for s in SHIPPED.samples}
    # What passed is what is declared, restricted to what the data holds.
    assert {o for o, _ in passed} == ops.SUPPORTED_OPS & {s.overload for s in SHIPPED.samples}
    assert {getattr(torch, d) for _, d in passed} == ops.SUPPORTED_DTYPES & {
        getattr(torch, d) for d in discovery.DISCOVERY_DTYPES
    }
    result.assert_outcomes(passed=matrix["checks"]["total"])


# --- the dtypes the ops data has no column for ------------------------------------------------


class Dequantize(nn.Module):
    """What a quantized program does with its integers: widen, offset, scale, index, requantize."""

    def forward(self, q, zero_point, index):
        wide = q.to(torch.int32) - zero_point
        picked = torch.index_select(wide, 0, index)
        scaled = picked.to(torch.float32) * 0.05
        return (
            scaled,
            torch.gather(wide, 1, index.to(torch.int64).unsqueeze(0).expand(wide.shape[0], -1)),
            (scaled / 0.05).round().clamp(-128, 127).to(q.dtype),
            wide.sum(1),
            torch.bitwise_and(q, 0x0F),
        )


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_small_integer_programs_run_like_eager(dtype):
    info = torch.iinfo(dtype)
    low, high = max(info.min, -100), min(info.max, 100)
    q = torch.randint(low, high, (5, 6), dtype=dtype)
    zero_point = torch.tensor(3, dtype=torch.int32)
    index = torch.tensor([4, 0, 2], dtype=torch.int32)
    model = Dequantize().eval()
    lowered = bc.to_backend(model, "reference", {"forward": {}}, example_inputs=(q, zero_point, index))
    for got, want in zip(lowered(q, zero_point, index), model(q, zero_point, index)):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


class Float64Math(nn.Module):
    def forward(self, x, y):
        return torch.linalg.vector_norm(x @ y, dim=-1), torch.special.i0e(x).cumprod(0), torch.hash_tensor(x)


def test_float64_and_uint64_run_like_eager():
    x, y = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    model = Float64Math().eval()
    lowered = bc.to_backend(model, "reference", {"forward": {}}, example_inputs=(x, y))
    got, want = lowered(x, y), model(x, y)
    assert [t.dtype for t in got] == [torch.float64, torch.float64, torch.uint64]
    for g, w in zip(got, want):
        assert torch.equal(g, w)


# --- opcodes are append only ------------------------------------------------------------------


def test_the_first_tables_opcodes_keep_their_meaning():
    first = json.loads((DATA / "reference-opcodes-v1.json").read_text())
    changed = {
        int(code): (name, ops.BY_OPCODE[int(code)].name if int(code) in ops.BY_OPCODE else None)
        for code, name in first.items()
        if int(code) not in ops.BY_OPCODE or ops.BY_OPCODE[int(code)].name != name
    }
    assert not changed, f"opcodes renumbered or reused (opcode: (was, now)): {changed}"


def test_an_archive_of_the_first_table_loads_and_runs():
    lowered = bc.load(DATA / "reference-blobs-v1.bcpt")
    got = lowered(*lowered.fixture_args)
    assert len(got) == len(lowered.fixture_expected) == 3
    for g, w in zip(got, lowered.fixture_expected):
        assert g.dtype == w.dtype
        if w.dtype.is_floating_point:
            # The expected outputs were recorded on another CPU: torch's vectorised float kernels
            # (AVX2 here, AVX512 there) may round the last bits differently. A few units in the last
            # place of the largest output, never more; integer outputs stay exact.
            eps = torch.finfo(w.dtype).eps
            torch.testing.assert_close(g, w, rtol=4 * eps, atol=4 * eps * float(w.abs().max()))
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=0)
