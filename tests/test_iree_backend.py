"""The iree backend on its own: import, compile, the three kinds of compile error, target side.

Every model is compiled for real (IREE's FX importer and ``iree-compile`` for
llvm-cpu on the generic CPU) and run by IREE's runtime. The whole
conformance suite runs against this backend with ``make suite-iree`` (see
backends/iree/README.md); these tests pin what the suite does not see: the
node locations the compiler's diagnostics quote, what is "unsupported" and
what is a failure of IREE's compiler, Python constants in the signature, and
a target without the compiler.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

pytest.importorskip("iree.compiler", reason="the iree backend needs iree-base-compiler (make .venv/.installed-iree)")
pytest.importorskip("iree.runtime", reason="the iree backend needs iree-base-runtime (make .venv/.installed-iree)")
pytest.importorskip("backendconf_iree", reason="install the backend: pip install -e backends/iree")

import pytest_backendconf as bc
from pytest_backendconf.provenance import ProgramNodes

from backendconf_iree import IreeBackend, blob
from backendconf_iree.compiler import CompileFailure, compile_error, parse_spec
from engine_setup import assert_cache_write_past_the_end_is_clamped, host_only_imports, line_of
from engine_setup import prepared as _prepared

BACKEND = "iree"


class Lookup(nn.Module):
    def forward(self, table, index):
        return torch.index_select(table, 0, index) * 2  # LOOKUP_LINE


class Gatherer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.lookup = Lookup()

    def forward(self, table, index):
        return torch.sigmoid(self.lookup(self.linear(table), index)) - table.mean()


class Log10(nn.Module):
    def forward(self, x):
        return torch.log10(x + 1) * 2  # LOG10_LINE


def _line_of(marker: str) -> int:
    return line_of(__name__, marker)


TABLE = torch.randn(3, 4)
INDEX = torch.tensor([0, 2])


@pytest.fixture(scope="module")
def gatherer():
    torch.manual_seed(0)
    model = Gatherer().eval()
    return model, bc.to_backend(model, BACKEND, {"forward": {}}, example_inputs=(TABLE, INDEX))


def test_a_model_runs_and_its_blob_is_deterministic_without_source(gatherer):
    model, lowered = gatherer
    torch.testing.assert_close(lowered(TABLE, INDEX), model(TABLE, INDEX), rtol=1e-6, atol=1e-6)
    first = lowered.lowered.blobs["forward"]
    header, vmfb = blob.decode(first)
    assert header.function == "main" and header.inputs == ("float32", "int64")
    assert header.outputs == (("tensor", "float32"),)
    # Another compile of the same program in this process: the same bytes, and no trace of the source.
    assert IreeBackend().preprocess(*_prepared(model, (TABLE, INDEX))) == first
    assert b"test_iree_backend" not in vmfb and b"Gatherer" not in vmfb


def test_python_constants_stay_out_of_the_module():
    class Scaled(nn.Module):
        def forward(self, x, scale: float):
            return x * 2, None, 3

    lowered = bc.to_backend(Scaled(), BACKEND, {"forward": {}}, example_inputs=(TABLE, 1.5))
    header, _ = blob.decode(lowered.lowered.blobs["forward"])
    assert header.inputs == ("float32", None)
    assert header.outputs == (("tensor", "float32"), ("constant", None), ("constant", 3))
    doubled, none, three = lowered(TABLE, 1.5)
    torch.testing.assert_close(doubled, TABLE * 2)
    assert none is None and three == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.bool])
def test_bfloat16_and_bool_tensors_cross_unchanged(dtype):
    class Where(nn.Module):
        def forward(self, x, y):
            return torch.where(y, x, x.flip(0)), y.logical_not()

    x = torch.randn(6).to(dtype)
    y = torch.tensor([True, False, True, True, False, False])
    lowered = bc.to_backend(Where(), BACKEND, {"forward": {}}, example_inputs=(x, y))
    for got, want in zip(lowered(x, y), Where()(x, y)):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_a_dynamic_dimension_runs_every_size_in_its_range():
    class Scores(nn.Module):
        def forward(self, x):
            return (x @ x.transpose(-1, -2)).softmax(-1)

    batch = torch.export.Dim("batch", min=1, max=8)
    lowered = bc.to_backend(
        Scores(), BACKEND, {"forward": {}}, example_inputs=(torch.randn(2, 3, 4),), dynamic_shapes={"x": {0: batch}}
    )
    for size in (1, 5, 8):
        x = torch.randn(size, 3, 4)
        torch.testing.assert_close(lowered(x), Scores()(x))


def test_a_compiler_crash_on_an_op_iree_claims_is_a_compiler_error_at_its_node():
    # IREE lowers log10 to a call of libm's log10f, which the generic CPU's runtime library lacks:
    # the link fails. IREE claims the op, so this is its compiler's failure, not "unsupported".
    program, spec, handles = _prepared(Log10(), (torch.rand(4),))
    with pytest.raises(bc.CompilerError) as caught:
        IreeBackend().preprocess(program, spec, handles)
    # The missing function names its op, although the fused dispatch carries the location of the mul.
    assert caught.value.node.name == "log10"
    assert caught.value.reason == "iree-lld: undefined symbol: log10f"
    assert not isinstance(caught.value, bc.UnsupportedNodeError)
    # Through the lowering: the user's line, led by the compiler-failure verdict.
    with pytest.raises(bc.CompilerError) as lowered:
        bc.to_backend(Log10(), BACKEND, {"forward": {}}, example_inputs=(torch.rand(4),))
    text = str(lowered.value)
    assert text.startswith("The node of aten::log10 failed in this compiler, which claims it")
    assert f"line {_line_of('LOG10_LINE')}" in text and "Diagnostic: iree-lld: undefined symbol: log10f" in text


def test_the_compilers_diagnostics_are_read_by_their_node_locations():
    program, _, _ = _prepared(Gatherer().eval(), (TABLE, INDEX))
    originals = ProgramNodes(program)
    located = originals.call_nodes()  # index i is the location n<i>:<i>
    index_select = next(i for i, n in enumerate(located) if n.name == "index_select")
    legalize = f"n{index_select}:{index_select}:0: error: failed to legalize operation 'torch.aten.index_select'\n"
    rejection = compile_error(legalize, 1, located, originals)
    assert isinstance(rejection, bc.UnsupportedNodeError)
    assert rejection.node is located[index_select]
    assert rejection.reason == "IREE cannot compile it: failed to legalize operation 'torch.aten.index_select'"
    # The same without a location: the op's name finds the node.
    assert compile_error(legalize.split(": ", 1)[1], 1, located, originals).node is located[index_select]
    verifier = (
        "<unknown>:0: error: 'arith.constant' op failed to verify that all of {value, result} have same type\n"
        f"n{index_select}:{index_select}:0: error: failed to run translation of source executable\n"
    )
    failure = compile_error(verifier, 1, located, originals)
    assert isinstance(failure, bc.CompilerError) and failure.node is located[index_select]
    assert failure.reason == "'arith.constant' op failed to verify that all of {value, result} have same type"
    # Naming no node: neither verdict, the harness reports it as undecided.
    silent = compile_error("", -11, located, originals)
    assert isinstance(silent, CompileFailure) and not isinstance(silent, bc.CompilerError)
    assert "exited with status -11 and no message" in str(silent)


def test_an_op_the_importer_cannot_take_is_unsupported_at_its_node():
    class Branches(nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda v: v.cos(), lambda v: v.sin(), (x,)) + 1

    with pytest.raises(bc.UnsupportedNodeError) as caught:
        IreeBackend().preprocess(*_prepared(Branches(), (torch.randn(3),)))
    assert caught.value.node.name == "cond"
    assert caught.value.reason.startswith("IREE's FX importer cannot import it:")


def test_a_cache_write_past_the_end_is_clamped_not_written_past_the_buffer():
    # IREE's scatter has no bounds check: unclamped, position 4 of a 4-row cache wrote past the
    # buffer and aborted the process ("double free or corruption"; repro/scatter_past_end.py).
    assert_cache_write_past_the_end_is_clamped(BACKEND)


def test_compile_spec_mistakes_name_the_key():
    assert parse_spec({}) is None
    with pytest.raises(ValueError, match="unknown compile-spec key 'target_cpu' for the iree backend"):
        parse_spec({"target_cpu": "host"})
    with pytest.raises(ValueError, match="fault injection names node 'nope'"):
        IreeBackend().preprocess(
            *_prepared(Gatherer().eval(), (TABLE, INDEX), {"__backendconf_fault__": {"node": "nope"}})
        )


def test_a_bad_blob_is_refused_by_name(gatherer):
    _, lowered = gatherer
    good = lowered.lowered.blobs["forward"]
    with pytest.raises(ValueError, match=r"method 'forward': iree backend blob is corrupt: CRC-32 checksum mismatch"):
        IreeBackend().compile({"forward": good[:-10] + bytes(10)}, {"forward": {}})
    header, _ = blob.decode(good)
    with pytest.raises(ValueError, match="IREE's runtime cannot load the module"):
        IreeBackend().compile({"forward": blob.encode(header, b"not a vmfb")}, {"forward": {}})


def test_unavailable_without_the_runtime(monkeypatch):
    monkeypatch.setitem(sys.modules, "iree.runtime", None)  # makes `import iree.runtime` fail
    monkeypatch.setattr("backendconf_iree.runtime._config", None)
    backend = IreeBackend()
    assert backend.is_available() is False
    assert "IREE's runtime cannot be used" in backend.unavailable_reason()
    assert "pip install iree-base-compiler==3.13.0 iree-base-runtime==3.13.0" in backend.unavailable_reason()


def test_the_target_runs_the_archive_with_the_compiler_blocked(gatherer, tmp_path):
    model, lowered = gatherer
    path = tmp_path / "gatherer.bcpt"
    bc.save(lowered, path)
    result = bc.run_on_target(path, {"forward": [(TABLE, INDEX)]}, plugins=[])
    assert result["loaded"], result["error"]
    assert "iree.compiler" in result["blocked"]
    torch.testing.assert_close(result["outputs"]["forward"][0], model(TABLE, INDEX), rtol=1e-6, atol=1e-6)


def test_a_fault_on_the_target_shows_the_users_source(tmp_path):
    spec = {"forward": {"__backendconf_fault__": {"node": "index_select"}}}
    lowered = bc.to_backend(Gatherer().eval(), BACKEND, spec, example_inputs=(TABLE, INDEX))
    path = tmp_path / "fault.bcpt"
    bc.save(lowered, path)
    result = bc.run_on_target(path, {"forward": [(TABLE, INDEX)]}, plugins=[])
    error = result["errors"]["forward"][0]
    assert error["type"] == "BackendRuntimeError"
    assert error["message"].startswith("injected fault at node 'index_select' (aten::index_select)")
    assert f"line {_line_of('LOOKUP_LINE')}, in forward" in error["message"]


def test_the_runtime_never_imports_the_compiler():
    # What compile and execute import, in a fresh interpreter.
    done = host_only_imports("backendconf_iree", "IreeBackend", "backendconf_iree.runtime.config()")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
