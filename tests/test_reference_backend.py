"""The reference backend on its own: compiler, blob format and interpreter.

Every model is exported for real with ``torch.export`` (once per session,
see `compiled`) and run through ``preprocess`` → ``compile`` → ``execute``;
outputs are compared with eager PyTorch. The model zoo below exercises
every op of the op table (`test_model_zoo_covers_every_op`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.metadata
import json
import pathlib
import random
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

import pytest_backendconf as bc
from pytest_backendconf.debuginfo._handles import DebugHandleRecorder

from backendconf_reference import LoadedProgram, ReferenceBackend, bytecode, ops
from pytest_backendconf.reference.bytecode import Block, BlockRef, Const, Instruction, Reg

aten = torch.ops.aten
PACKAGE_DIR = pathlib.Path(ops.__file__).parent


# --- the model zoo -------------------------------------------------------------------


# The nested trio and the small CNN: the zoo's own definitions.
from pytest_backendconf.conformance.zoo import L, M, N, SmallCNN  # noqa: E402,F401


class Arithmetic(nn.Module):
    def forward(self, x, y):
        a = x.abs() + 0.1
        return (
            x + y,
            x + 1.5,
            aten.add.Scalar(x, 2),
            x - y,
            aten.sub.Scalar(x, 1),
            1 - x,
            torch.rsub(x, y),
            x * y,
            aten.mul.Scalar(x, 3),
            x / y,
            aten.div.Scalar(x, 4),
            torch.div(x, y, rounding_mode="floor"),
            x // 0.7,
            torch.remainder(x, 0.5),
            torch.remainder(x, y),
            -x,
            a.log(),
            x.exp(),
            a.sqrt(),
            a.rsqrt(),
            a.reciprocal(),
            x.square(),
            x**2,
            a**y,
            2**x,
            torch.maximum(x, y),
            torch.minimum(x, y),
            x.clamp(-0.5, 0.5),
            x.clamp(min=y),
            torch.where(x > y, x, y),
            torch.erf(x),
            x.sin(),
            x.cos(),
            a.log1p(),
            x.expm1(),
            x.floor(),
            x.ceil(),
            x.round(),
            x.sign(),
        )


class Comparisons(nn.Module):
    def forward(self, x, y):
        a, b = x > 0, y > 0
        return (
            x == y,
            x == 0.5,
            x != y,
            x != 0.5,
            x < y,
            x < 0,
            x <= y,
            x <= 0,
            x > y,
            x > 0.1,
            x >= y,
            x >= 0,
            torch.logical_and(a, b),
            torch.logical_or(a, b),
            torch.logical_xor(a, b),
            torch.logical_not(a),
            torch.bitwise_and(a, b),
            torch.bitwise_or(a, b),
            ~a,
            a & b,
            a | b,
        )


class Activations(nn.Module):
    def forward(self, x):
        return (
            torch.relu(x),
            F.relu6(x * 4),
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
            F.silu(x),
            torch.sigmoid(x),
            torch.tanh(x),
            F.hardtanh(x, -0.5, 0.5),
            F.leaky_relu(x, 0.2),
            F.elu(x, 0.7),
            aten.elu.default(x, 1.0, 2.0, 0.5),
            F.softplus(x, 2.0, 1.0),
            F.hardswish(x * 4),
            F.hardsigmoid(x * 4),
        )


class Reductions(nn.Module):
    def forward(self, x):
        return (
            x.sum(),
            x.sum(1),
            x.sum([0, 1], keepdim=True),
            x.mean(),
            x.mean(-1, keepdim=True),
            x.amax(1),
            x.amin(0),
            x.argmax(),
            x.argmax(1),
            x.argmin(1, keepdim=True),
            x.max(),
            x.min(),
            *x.max(1),
            *x.min(0, keepdim=True),
            x.var(1),
            x.var(),
            torch.var(x, 0, correction=0),
            x.std(0),
            x.std(),
            torch.std(x, 1, unbiased=False),
            x.cumsum(1),
        )


class LinearAlgebra(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("bias", torch.linspace(-1, 1, 5))

    def forward(self, x, y):
        return (
            x @ y,
            torch.mm(x, y),
            torch.bmm(x.unsqueeze(0), y.unsqueeze(0)),
            self.lin(x),
            torch.addmm(self.bias, x, y, beta=0.5, alpha=2.0),
        )


class ConvPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(2, 3, 3)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, image, signal):
        return (
            self.conv1(signal),
            F.avg_pool2d(image, 2),
            F.avg_pool2d(image, 3, stride=1, padding=1, count_include_pad=False),
            F.adaptive_avg_pool2d(image, (3, 3)),
            aten._adaptive_avg_pool2d.default(image, [2, 2]),
            self.gn(image),
            F.max_pool2d(image, 3, stride=2, padding=1),
        )


class NormSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return (
            torch.softmax(x, -1),
            torch.log_softmax(x, 0),
            aten._softmax.default(x, 1, False),
            aten._log_softmax.default(x, 0, False),
            self.ln(x),
            *torch.native_layer_norm(x, [6], None, None, 1e-5),
            self.drop(x),
        )


class Shapes(nn.Module):
    def forward(self, x):
        return (
            x.view(6, 4),
            aten._unsafe_view.default(x, [4, 6]),
            x.reshape(-1),
            x.permute(2, 0, 1),
            x.transpose(0, 2),
            x[0].t(),
            torch.cat([x, x], 1),
            torch.stack([x, x], -1),
            x[:, 1:],
            x[..., ::2],
            x[:, -2:-1],
            x[:, 2],
            x[0:1].squeeze(),
            x.unsqueeze(2).squeeze(2),
            x.view(2, 1, 3, 1, 4).squeeze((1, 3)),
            x.unsqueeze(-1),
            x[:, :1].expand(2, 5, 4),
            x.flatten(1),
            x.transpose(0, 1).contiguous(),
            x.clone(),
            *x.split(2, 2),
            *torch.split(x, [1, 2], 1),
            *x.chunk(2, 2),
            *x.unbind(1),
            x.repeat(1, 2, 1),
            x[0].triu(),
            x[0].tril(-1),
            x.masked_fill(x > 0, -1.0),
            x.masked_fill(x > 0.5, torch.tensor(2.0)),
        )


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, idx):
        return (
            self.emb(idx),
            F.embedding(torch.tensor([1, 0]), self.emb.weight),
            torch.index_select(self.emb.weight, 0, idx.flatten()),
        )


class Creation(nn.Module):
    def forward(self, x):
        return (
            torch.zeros(2, 3),
            torch.ones(4),
            torch.full((2,), 7.0),
            torch.zeros_like(x),
            torch.ones_like(x),
            torch.full_like(x, 3),
            x.new_zeros(2),
            x.new_ones(3),
            torch.arange(5),
            torch.arange(1, 4),
            torch.arange(0, 6, 2),
        )


class Casts(nn.Module):
    def forward(self, x, i):
        return (
            x.to(torch.float16),
            x.to(dtype=torch.bfloat16, copy=True),
            aten._to_copy.default(x, dtype=torch.int64),
            x.to(device="cpu", dtype=torch.float16),
            aten.to.dtype_layout(x, dtype=torch.bool),
            i.float(),
            i.bool(),
            x.half().float(),
        )


class DynamicShapes(nn.Module):
    def forward(self, x, k):
        n = x.shape[0]
        u = k.sum().item()
        torch._check(u >= 0)
        torch._check(u < 10)
        torch._check(u != 7)
        # A symbolic predicate: the branch depends on the runtime batch size.
        y = torch.cond(n > 3, lambda x: x + 1, lambda x: x - 1, (x,))
        return (
            x.view(n * 3) + 1,
            x.new_zeros(n // 2 + 1),
            x.reshape(-1)[n - 1 :],
            torch.zeros(u),
            y,
            x.detach() * 2,
        )


class Cond(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("shift", torch.linspace(0, 1, 4))

    def forward(self, x, flag):
        def true_fn(x):
            return self.lin(x) * 2, x.sum(1)

        def false_fn(x):
            return x - self.shift, x.mean(1)

        a, b = torch.cond(flag.sum() > 0, true_fn, false_fn, (x,))
        return a + 1, b


class MultipleOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        # A dict, a nested tuple, an input returned as is and a parameter.
        return {"a": x + self.w, "b": (x * 2, x.sum())}, x, self.w


class InPlace(nn.Module):
    """A residual block as torchvision writes them: in-place ops on intermediates."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.acts = nn.Sequential(
            nn.ReLU(inplace=True),
            nn.Hardtanh(-2, 2, inplace=True),
            nn.SiLU(inplace=True),
            nn.Hardswish(inplace=True),
            nn.LeakyReLU(0.1, inplace=True),
            nn.Dropout(inplace=True),
            nn.ELU(inplace=True),
            nn.Hardsigmoid(inplace=True),
        )

    def forward(self, x):
        y = self.lin(x)
        y += x
        y -= 0.5
        y *= 2
        y /= 3
        z = self.acts(y * 4)
        y.view(-1)[:2].add_(1)  # through a view of an intermediate: y changes too
        return y, z


class Int64Ops(nn.Module):
    def forward(self, a, b):
        return a + b, a * 3, a // 2, a.sum(), a > b, a.max(), torch.where(a > 0, a, b), a.float()


class SmallIntOps(nn.Module):
    """Integer arithmetic with constants, as quantized programs write it."""

    def forward(self, q):
        return (
            q & 0x0F,
            q | 0x10,
            q ^ 0x03,
            q ^ (q >> 1),
            aten.bitwise_and.Scalar(q, 7),
            aten.bitwise_or.Scalar(q, 8),
            aten.bitwise_xor.Scalar(q, 9),
            aten.bitwise_left_shift.Tensor_Scalar(q, 1),
            aten.bitwise_right_shift.Tensor_Scalar(q, 1),
            q >> 2,
            q << 1,
            torch.fmod(q, 3),
            q.clamp_min(-3),
            q.clamp_max(5),
        )


class BoolOps(nn.Module):
    def forward(self, m, n):
        return m & n, m | n, ~m, m.logical_xor(n), m.sum(), m.long()


class HalfPrecision(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.lin = nn.Linear(4, 3).to(dtype)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2, x.softmax(-1), x.sum(), x + 1


def _cnn_decomposed(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    return ep.run_decompositions()


@dataclasses.dataclass(frozen=True)
class Case:
    """A model, the inputs it is exported with, and more inputs to run it on."""

    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[], list[tuple]]
    dynamic_shapes: Any = None
    transform: Callable | None = None


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _zoo_attention() -> nn.Module:
    # nn.MultiheadAttention: unflatten and scaled_dot_product_attention, as real transformers export.
    from pytest_backendconf.conformance.zoo import MultiheadSelfAttention

    return MultiheadSelfAttention()


CASES = [
    Case("nml", N, lambda: [(torch.randn(2, 3),), (torch.randn(2, 3),)]),
    Case("small_cnn", SmallCNN, lambda: [(torch.randn(2, 3, 8, 8),), (torch.randn(2, 3, 8, 8),)]),
    Case("small_cnn_decomposed", SmallCNN, lambda: [(torch.randn(2, 3, 8, 8),)], transform=_cnn_decomposed),
    Case("arithmetic", Arithmetic, lambda: [(torch.randn(3, 4), torch.randn(3, 4) + 2)]),
    Case("comparisons", Comparisons, lambda: [(x := torch.randn(3, 4), torch.where(torch.rand(3, 4) > 0.5, x, -x))]),
    Case("activations", Activations, lambda: [(torch.randn(3, 5) * 2,)]),
    Case("reductions", Reductions, lambda: [(torch.randn(3, 5),)]),
    Case("linear_algebra", LinearAlgebra, lambda: [(torch.randn(2, 4), torch.randn(4, 5))]),
    Case("conv_pool", ConvPool, lambda: [(torch.randn(1, 4, 6, 6), torch.randn(1, 2, 8))]),
    Case("norm_softmax", NormSoftmax, lambda: [(torch.randn(3, 6),)]),
    Case("shapes", Shapes, lambda: [(torch.randn(2, 3, 4),)]),
    Case("multihead_attention", _zoo_attention, lambda: [(torch.randn(2, 5, 8),)]),
    Case("embedding", Embedding, lambda: [(torch.tensor([[1, 2, 3], [4, 5, 9]]),)]),
    Case("creation", Creation, lambda: [(torch.randn(2, 3),)]),
    Case("casts", Casts, lambda: [(torch.randn(2, 3), torch.tensor([0, 3, -2]))]),
    Case(
        "dynamic_shapes",
        DynamicShapes,
        lambda: [(torch.randn(4, 3), torch.tensor([1, 2])), (torch.randn(3, 3), torch.tensor([4, 5]))],
        dynamic_shapes={"x": {0: torch.export.Dim("batch", min=2, max=64)}, "k": None},
    ),
    Case("cond", Cond, lambda: [(torch.randn(2, 4), torch.tensor([True])), (torch.randn(2, 4), torch.tensor([False]))]),
    Case("in_place", InPlace, lambda: [(torch.randn(2, 4),)]),
    Case("multiple_outputs", MultipleOutputs, lambda: [(torch.randn(2, 3),)]),
    Case("int64", Int64Ops, lambda: [(torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (3, 4)))]),
    Case("int8", SmallIntOps, lambda: [(torch.randint(-20, 20, (3, 4), dtype=torch.int8),)]),
    Case("bool", BoolOps, lambda: [(torch.rand(3, 4) > 0.5, torch.rand(3, 4) > 0.5)]),
    Case("float16", functools.partial(HalfPrecision, torch.float16), lambda: [(_randn(2, 4, dtype=torch.float16),)]),
    Case("bfloat16", functools.partial(HalfPrecision, torch.bfloat16), lambda: [(_randn(2, 4, dtype=torch.bfloat16),)]),
]
CASES_BY_NAME = {case.name: case for case in CASES}


@dataclasses.dataclass
class Compiled:
    case: Case
    module: nn.Module
    inputs: list[tuple]
    program: torch.export.ExportedProgram
    handles: Any
    blob: bytes
    handle: LoadedProgram


@functools.cache
def compiled(name: str) -> Compiled:
    """Export, preprocess and compile one zoo model, once per session."""
    case = CASES_BY_NAME[name]
    torch.manual_seed(0)
    module = case.make().eval()
    inputs = case.inputs()
    program = torch.export.export(module, inputs[0], dynamic_shapes=case.dynamic_shapes)
    if case.transform is not None:
        program = case.transform(program)
    handles = DebugHandleRecorder().assign(program.graph_module)
    backend = ReferenceBackend()
    blob = backend.preprocess(program, {}, handles)
    handle = backend.compile({"forward": blob}, {"forward": {}})["forward"]
    return Compiled(case, module, inputs, program, handles, blob, handle)


def eager_outputs(module: nn.Module, inputs: tuple) -> list:
    with torch.no_grad():
        return pytree.tree_leaves(module(*inputs))


def assert_outputs_equal(actual: list, expected: list) -> None:
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"output {i} is a {type(a).__name__}"
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m: f"output {i}: {m}")
        else:
            assert a == e, f"output {i}: {a!r} != {e!r}"


def node_named(graph_module: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    return next(n for n in graph_module.graph.nodes if n.name == name)


def opcodes_of(blob: bytes) -> set[int]:
    return {ins.opcode for block in bytecode.decode(blob).blocks for ins in block.instructions}


# --- parity with eager ------------------------------------------------------------------


@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_outputs_match_eager(name):
    c = compiled(name)
    for inputs in c.inputs:
        actual = ReferenceBackend().execute(c.handle, list(inputs))
        assert_outputs_equal(actual, eager_outputs(c.module, inputs))


def test_cond_takes_both_branches():
    c = compiled("cond")
    # The branches differ in the second output: sum vs mean over dim 1.
    x = torch.ones(2, 4)
    _, taken = c.handle.run([x, torch.tensor([True])])
    _, not_taken = c.handle.run([x, torch.tensor([False])])
    assert taken.tolist() == [4.0, 4.0] and not_taken.tolist() == [1.0, 1.0]


@pytest.mark.slow
def test_model_zoo_covers_every_op():
    # The zoo exercises the ops of real models; the rest of the table are overloads of the ops
    # category's shipped data (of any torch release), which `-m ops` runs one by one
    # (tests/test_reference_ops.py checks that run against the declared ops).
    used = set().union(*(opcodes_of(compiled(case.name).blob) for case in CASES))
    used |= _stateful_opcodes()
    from pytest_backendconf.conformance.ops import discovery

    in_data = {
        sample["overload"]
        for path in discovery.DATA_DIR.glob("torch-*.json")
        for sample in json.loads(path.read_text())["samples"]
    }
    # The quantize/dequantize ops of PT2E programs: tests/test_quantized.py lowers the quantized
    # category's programs (they need torchao) and checks that they use each of them; torchao's affine
    # ops are lowered by tests/test_torchao_lowering.py (the 8da4w program uses all three).
    # aten.alias (transformers' static cache), aten.index.Tensor (a cache written by slice assignment)
    # and the other forms of a state write and a mask: tests/test_state.py lowers the programs that use
    # them and checks them against eager.
    by_state_tests = {
        "aten.alias.default",
        "aten.index.Tensor",
        "aten.copy.default",
        "aten.select_scatter.default",
        "aten.where.Scalar",
        "aten.where.ScalarOther",
        "aten.where.ScalarSelf",
        "aten.scalar_tensor.default",
    }
    missing = sorted(
        op.name
        for op in ops.OPS
        if op.opcode not in used
        and op.name not in in_data
        and op.name not in by_state_tests
        and not op.name.startswith(("quantized_decomposed.", "torchao."))
    )
    assert not missing, f"ops neither a zoo model nor the ops data exercises: {missing}"


def _stateful_opcodes() -> set[int]:
    """The opcodes of the stateful category's models (each method lowered whole in float32)."""
    from pytest_backendconf.conformance import stateful
    from pytest_backendconf.lowering import export_method, lower_programs

    used: set[int] = set()
    for model in stateful.models():
        module = model.module("float32")
        shapes = model.dynamic_shapes() or {}
        programs = {
            m: export_method(module, m, model.example_inputs("float32")[m], {}, dynamic_shapes=shapes.get(m))
            for m in model.methods
        }
        lowered = lower_programs(programs, ReferenceBackend(), {m: {} for m in model.methods}, module_type=type(module))
        used |= set().union(*(opcodes_of(blob) for blob in lowered.lowered.blobs.values()))
    return used


def test_op_table_is_well_formed():
    assert len(ops.OPS) >= 40
    assert ReferenceBackend.capabilities.problems() == []
    assert ReferenceBackend.capabilities.supported_ops == {op.name for op in ops.OPS}
    assert ops.BY_NAME["aten.mul.Tensor"].qualified_name == "aten::mul"
    assert ops.BY_NAME["higher_order.cond"].qualified_name == "higher_order::cond"


# --- determinism and round trips ----------------------------------------------------------


def test_preprocess_is_deterministic_for_one_program():
    c = compiled("small_cnn")
    again = ReferenceBackend().preprocess(c.program, {}, c.handles)
    assert again == c.blob


def test_two_exports_of_one_model_give_equal_bytes():
    module = SmallCNN().eval()
    x = torch.randn(1, 3, 8, 8)
    blobs = []
    for _ in range(2):
        program = torch.export.export(module, (x,))
        # A fresh recorder starting at the same number issues the same handles.
        handles = DebugHandleRecorder(first=1000).assign(program.graph_module)
        blobs.append(ReferenceBackend().preprocess(program, {}, handles))
    assert blobs[0] == blobs[1]
    other = DebugHandleRecorder(first=2000).assign(program.graph_module)
    assert ReferenceBackend().preprocess(program, {}, other) != blobs[0]


def test_blob_round_trips_through_compile_on_a_fresh_backend():
    c = compiled("small_cnn")
    fresh = ReferenceBackend()
    handles = fresh.compile({"forward": bytes(c.blob), "other": c.blob}, {"forward": {}, "other": {}})
    assert set(handles) == {"forward", "other"}
    for inputs in c.inputs:
        expected = eager_outputs(c.module, inputs)
        assert_outputs_equal(fresh.execute(handles["forward"], list(inputs)), expected)
        assert_outputs_equal(fresh.execute(handles["other"], list(inputs)), expected)


def test_encode_decode_round_trip_preserves_the_program():
    program = bytecode.decode(compiled("cond").blob)
    assert bytecode.encode(program) == compiled("cond").blob
    assert len(program.blocks) == 3  # the forward graph and the two branches


def test_constants_keep_dtype_shape_and_values():
    tensors = [
        torch.randn(2, 3),
        torch.randn(3, 2).t(),
        torch.arange(10)[2:7:2],
        torch.tensor(1.5, dtype=torch.bfloat16),
        torch.randn(4).half(),
        torch.tensor([True, False]),
        torch.empty(0, 3),
        torch.randint(-9, 9, (2, 2, 2)),
    ]
    program = bytecode.Program(tensors, [Block(0, [], [Const(i) for i in range(len(tensors))])])
    decoded = bytecode.decode(bytecode.encode(program)).constants
    for original, back in zip(tensors, decoded):
        assert back.dtype == original.dtype and back.shape == original.shape
        assert torch.equal(back, original)


def test_large_constants_are_copied_in_bulk():
    # A regression guard: copying tensor bytes element by element through
    # Python takes seconds per megabyte.
    weight = torch.randn(1024, 1024)  # 4 MiB
    program = bytecode.Program([weight], [Block(0, [], [Const(0)])])
    start = time.perf_counter()
    (back,) = bytecode.decode(bytecode.encode(program)).constants
    assert time.perf_counter() - start < 2.0
    assert torch.equal(back, weight)


# --- execution --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["small_cnn", "in_place", "cond"])
def test_execute_is_thread_safe(name):
    c = compiled(name)
    backend = ReferenceBackend()
    inputs = []
    for i in range(8):  # different inputs per thread, both cond branches among them
        torch.manual_seed(100 + i)
        choices = c.case.inputs()
        inputs.append(list(choices[i % len(choices)]))
    expected = [eager_outputs(c.module, tuple(x)) for x in inputs]
    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            start.wait()
            for _ in range(25):
                assert_outputs_equal(backend.execute(c.handle, inputs[i]), expected[i])
        except BaseException as exc:  # reported below: pytest sees only the main thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]


def test_execute_does_not_mutate_inputs():
    c = compiled("arithmetic")
    inputs = [t.clone() for t in c.inputs[0]]
    c.handle.run(inputs)
    for before, after in zip(c.inputs[0], inputs):
        assert torch.equal(before, after)


def test_kernel_failure_raises_backend_error_with_the_node_handle():
    c = compiled("small_cnn")
    with pytest.raises(bc.BackendError) as info:
        c.handle.run([torch.randn(2, 3, 6, 6)])  # fc expects 8*4*4 features, gets 8*3*3
    linear = node_named(c.program.graph_module, "linear")
    assert info.value.debug_handle == c.handles[linear]
    assert info.value.message.startswith("aten::linear at node 'linear' failed: RuntimeError")


def test_failed_runtime_assert_is_a_backend_error():
    c = compiled("dynamic_shapes")
    with pytest.raises(bc.BackendError, match="runtime assertion failed") as info:
        c.handle.run([torch.randn(4, 3), torch.tensor([10, 5])])  # u = 15 breaks u < 10
    node = next(
        n for n in c.handles if n.target is aten._assert_scalar.default and c.handles[n] == info.value.debug_handle
    )
    assert "u0 <= 9" in node.args[1] or "u0 < 10" in node.args[1]


def test_wrong_number_of_inputs_is_a_clear_error():
    with pytest.raises(ValueError, match="takes 2 inputs, got 1"):
        compiled("arithmetic").handle.run([torch.randn(3, 4)])


def test_execute_rejects_a_foreign_handle():
    with pytest.raises(TypeError, match="handle returned by ReferenceBackend.compile"):
        ReferenceBackend().execute(object(), [])


# --- fault injection (§3.5) -----------------------------------------------------------------


def _preprocess_with(name: str, spec: dict) -> tuple[Compiled, LoadedProgram]:
    c = compiled(name)
    blob = ReferenceBackend().preprocess(c.program, spec, c.handles)
    return c, ReferenceBackend().compile({"forward": blob}, {"forward": spec})["forward"]


def test_injected_fault_raises_with_the_node_handle():
    c, handle = _preprocess_with("nml", {"__backendconf_fault__": {"node": "mul"}})
    with pytest.raises(bc.BackendError) as info:
        handle.run([torch.randn(2, 3)])
    assert info.value.message == "injected fault at node 'mul' (aten::mul)"
    assert info.value.debug_handle == c.handles[node_named(c.program.graph_module, "mul")]


def test_injected_fault_inside_a_cond_branch():
    c, handle = _preprocess_with("cond", {"__backendconf_fault__": {"node": "mul"}})
    branch = c.program.graph_module.true_graph_0
    assert all(n.name != "mul" for n in c.program.graph_module.graph.nodes)
    x = torch.randn(2, 4)
    with pytest.raises(bc.BackendError) as info:
        handle.run([x, torch.tensor([True])])
    assert info.value.message == "injected fault at node 'mul' (aten::mul)"
    assert info.value.debug_handle == c.handles[node_named(branch, "mul")]
    # The other branch does not reach the node.
    assert_outputs_equal(handle.run([x, torch.tensor([False])]), eager_outputs(c.module, (x, torch.tensor([False]))))


def test_fault_at_an_unknown_node_names_the_valid_ones():
    c = compiled("nml")
    with pytest.raises(ValueError, match=r"'nope'.*op nodes are 'mul', 'sub', 'add'"):
        ReferenceBackend().preprocess(c.program, {"__backendconf_fault__": {"node": "nope"}}, c.handles)


def test_fault_at_a_placeholder_is_rejected():
    c = compiled("nml")
    with pytest.raises(ValueError, match="'x', which is not an op node"):
        ReferenceBackend().preprocess(c.program, {"__backendconf_fault__": {"node": "x"}}, c.handles)


@pytest.mark.parametrize("value", ["mul", {"node": 3}, {"node": "mul", "when": 1}])
def test_malformed_fault_spec_is_rejected(value):
    c = compiled("nml")
    with pytest.raises(ValueError, match="must be {'node': '<FX node name>'}"):
        ReferenceBackend().preprocess(c.program, {"__backendconf_fault__": value}, c.handles)


def test_unknown_compile_spec_key_is_rejected():
    c = compiled("nml")
    with pytest.raises(ValueError, match="unknown compile-spec key 'optimise'.*'__backendconf_fault__'"):
        ReferenceBackend().preprocess(c.program, {"optimise": True}, c.handles)


def test_positional_argument_given_by_name_is_normalized():
    # Export writes schema-positional arguments by position, but FX passes may
    # name them; the compiler must still call the kernel correctly.
    program = torch.export.export(L(), (torch.randn(2, 3),))
    mul = node_named(program.graph_module, "mul")
    mul.args, mul.kwargs = (mul.args[0],), {"other": 5}
    handles = DebugHandleRecorder().assign(program.graph_module)
    blob = ReferenceBackend().preprocess(program, {}, handles)
    x = torch.randn(2, 3)
    (out,) = ReferenceBackend().compile({"f": blob}, {"f": {}})["f"].run([x])
    torch.testing.assert_close(out, x * 5)


# --- what preprocess rejects -------------------------------------------------------------------


def _preprocess_model(module: nn.Module, inputs: tuple):
    program = torch.export.export(module.eval(), inputs)
    handles = DebugHandleRecorder().assign(program.graph_module)
    return program, lambda: ReferenceBackend().preprocess(program, {}, handles)


class Logit(nn.Module):
    def forward(self, x):
        return torch.logit(x + 1)


def test_unsupported_op_names_the_node_and_overload():
    program, preprocess = _preprocess_model(Logit(), (torch.randn(3),))
    with pytest.raises(bc.UnsupportedNodeError) as info:
        preprocess()
    assert info.value.node is next(n for n in program.graph.nodes if n.target is aten.logit.default)
    assert "aten.logit.default is not in the reference backend's op table" in info.value.reason


class PlusOne(nn.Module):
    def forward(self, x):
        return x + 1


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float8_e4m3fn])
def test_unsupported_dtype_is_rejected(dtype):
    program, preprocess = _preprocess_model(PlusOne(), (torch.ones(3, dtype=dtype),))
    with pytest.raises(bc.UnsupportedNodeError) as info:
        preprocess()
    assert info.value.node is node_named(program.graph_module, "x")
    assert f"has dtype {dtype}" in info.value.reason


class BufferUpdate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


def test_buffer_mutation_is_rejected():
    _, preprocess = _preprocess_model(BufferUpdate(), (torch.randn(3),))
    with pytest.raises(bc.UnsupportedNodeError) as info:
        preprocess()
    assert "updates buffer 'count' in place" in info.value.reason


class InputUpdate(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


def test_input_mutation_is_rejected():
    _, preprocess = _preprocess_model(InputUpdate(), (torch.randn(3),))
    with pytest.raises(bc.UnsupportedNodeError) as info:
        preprocess()
    assert "mutates its input 'x'" in info.value.reason


class WriteThroughView(nn.Module):
    def forward(self, x):
        y = x.view(-1)[1:]  # a view of the caller's tensor
        y.relu_()
        return y * 2


class WriteThroughDropout(nn.Module):
    def forward(self, x):
        # Eval-mode dropout returns x itself, so relu_ would write to the input.
        return F.relu(F.dropout(x, 0.5, training=False), inplace=True)


class WriteToBufferView(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(2, 3))

    def forward(self, x):
        self.count[0].add_(1)
        return x * self.count


class WriteUnderNoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        with torch.no_grad():  # becomes a wrap_with_set_grad_enabled subgraph
            self.w.mul_(0.5)
        return x * self.w


@pytest.mark.parametrize(
    "module, reason",
    [
        (WriteThroughView(), "aten.relu_.default mutates its input 'x'"),
        (WriteThroughDropout(), "aten.relu_.default mutates its input 'x'"),
        (WriteToBufferView(), "aten.add_.Tensor updates buffer 'count' in place"),
        (WriteUnderNoGrad(), "higher_order.wrap_with_set_grad_enabled is not in the reference"),
    ],
    ids=["input view", "dropout", "buffer view", "no_grad"],
)
def test_in_place_writes_to_inputs_and_state_are_rejected(module, reason):
    _, preprocess = _preprocess_model(module, (torch.randn(3),))
    with pytest.raises(bc.UnsupportedNodeError) as info:
        preprocess()
    assert reason in info.value.reason


class TrainingDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, training=True)


def test_training_mode_dropout_is_rejected():
    program, preprocess = _preprocess_model(TrainingDropout(), (torch.randn(3),))
    with pytest.raises(bc.UnsupportedNodeError) as info:
        preprocess()
    assert info.value.node.target is aten.dropout.default
    assert "train=True (training mode) is not supported" in info.value.reason


# --- bad blobs ----------------------------------------------------------------------------


def _with_header(payload: bytes, version: int = bytecode.FORMAT_VERSION) -> bytes:
    return struct.pack("<8sIIQ", bytecode.MAGIC, version, zlib.crc32(payload), len(payload)) + payload


def _payload(blob: bytes) -> bytes:
    return blob[24:]


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1 :]


BAD_BLOBS = {
    "empty": (lambda b: b"", "not a reference-backend blob"),
    "wrong magic": (lambda b: b"PK\x03\x04" + b[4:], r"not a reference-backend blob: it starts with b'PK"),
    "truncated header": (lambda b: b[:12], "truncated: 12 bytes, shorter than the 24-byte header"),
    "truncated payload": (lambda b: b[:-3], "truncated: the header announces"),
    "trailing bytes": (lambda b: b + b"\0\0", "2 unexpected bytes after"),
    "newer version": (
        lambda b: _with_header(_payload(b), version=99),
        "format version 99, newer than this interpreter's version 2",
    ),
    "unknown older version": (lambda b: _with_header(_payload(b), version=0), "unknown format version 0"),
    "corrupt payload": (lambda b: _flip(b, len(b) - 5), "fails the CRC-32 check"),
    "not bytes": (lambda b: "a string", "must be bytes, not str"),
}


@pytest.mark.parametrize("kind", list(BAD_BLOBS))
def test_bad_blob_is_a_clear_value_error(kind):
    mutate, message = BAD_BLOBS[kind]
    with pytest.raises(ValueError, match=message) as info:
        ReferenceBackend().compile({"forward": mutate(compiled("nml").blob)}, {"forward": {}})
    assert str(info.value).startswith("method 'forward': ")


def _program(instructions, n_inputs=1, outputs=None, constants=(), blocks=()):
    main = Block(n_inputs, instructions, outputs if outputs is not None else [Reg(0)])
    return bytecode.encode(bytecode.Program(list(constants), [main, *blocks]))


MALFORMED = {
    "future register": (_program([Instruction(7, [Reg(0), Reg(5)], {}, 1, "mul")]), "reads register 5"),
    "unknown opcode": (_program([Instruction(9999, [Reg(0)], {}, 1, "mystery")]), "unknown opcode 9999"),
    "missing constant": (_program([], outputs=[Const(3)]), "names constant 3 of 0"),
    "block cycle": (
        _program([Instruction(251, [True, BlockRef(0), BlockRef(0), [Reg(0)]], {}, 1, "cond")]),
        "names block 0; block 0 may only use blocks",
    ),
    "no blocks": (_with_header(struct.pack("<II", 0, 0)), "has no code block"),
    "huge count": (
        _with_header(struct.pack("<IIII", 0, 1, 0, 2**31) + bytes(4)),
        "instruction count of block 0 is 2147483648, more than the rest",
    ),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_program_is_a_clear_value_error(kind):
    blob, message = MALFORMED[kind]
    with pytest.raises(ValueError, match=message):
        ReferenceBackend().compile({"forward": blob}, {"forward": {}})


def test_every_truncation_of_a_payload_is_a_value_error():
    # Re-headed with a valid CRC, so that the structural reader itself must
    # notice each cut, wherever it falls.
    payload = _payload(compiled("cond").blob)
    for cut in range(len(payload)):
        with pytest.raises(ValueError, match="malformed|truncated|no code block"):
            bytecode.decode(_with_header(payload[:cut]))


def test_random_corruptions_never_escape_as_other_errors():
    payload = _payload(compiled("cond").blob)
    rng = random.Random(0)
    for _ in range(300):
        corrupt = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        try:
            ReferenceBackend().compile({"f": _with_header(bytes(corrupt))}, {"f": {}})
        except ValueError:
            pass  # anything else propagates and fails the test


# --- host / target split ---------------------------------------------------------------------


TARGET_SCRIPT = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class BlockHostOnly(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "backendconf_reference.compiler":
                raise ImportError(name + " is host-only and blocked on this target")
            return None

    sys.meta_path.insert(0, BlockHostOnly())
    import torch
    from backendconf_reference import ReferenceBackend

    backend = ReferenceBackend()
    with open(sys.argv[1], "rb") as f:
        handle = backend.compile({"forward": f.read()}, {"forward": {}})["forward"]
    (out,) = backend.execute(handle, [torch.arange(6.0).reshape(2, 3)])
    try:
        backend.preprocess(None, {}, {})
    except ImportError as exc:
        blocked = str(exc)
    print(json.dumps({"out": out.tolist(), "blocked": blocked,
                      "compiler_loaded": "backendconf_reference.compiler" in sys.modules}))
    """
)


def test_target_without_the_compiler_loads_and_runs_a_blob(tmp_path):
    blob_path = tmp_path / "forward.blob"
    blob_path.write_bytes(compiled("nml").blob)
    result = subprocess.run(
        [sys.executable, "-c", TARGET_SCRIPT, str(blob_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    x = torch.arange(6.0).reshape(2, 3)
    assert report["out"] == (x * 5 - 2 + 3).tolist()
    assert "blocked on this target" in report["blocked"]
    assert report["compiler_loaded"] is False


@pytest.mark.parametrize(
    "module",
    ["backend/__init__", "backend/plugin", "engine/ops", "engine/bytecode", "engine/interpreter"],
)
def test_target_side_modules_do_not_import_the_compiler(module):
    # The backend package, and the engine it shares with the core's fallback.
    where, name = module.split("/")
    folder = pathlib.Path(ReferenceBackend.__module__ and sys.modules["backendconf_reference"].__file__).parent
    tree = ast.parse(((folder if where == "backend" else PACKAGE_DIR) / f"{name}.py").read_text())
    # Module-level imports only: __init__ imports the compiler inside preprocess.
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(f"{node.module or ''}.{alias.name}" for alias in node.names)
    host_only = {n for n in imported if "compiler" in n or n.startswith("torch.export")}
    assert not host_only, f"{module}.py imports {host_only} at module level"


def test_capabilities_declare_the_compiler_host_only():
    caps = ReferenceBackend.capabilities
    assert caps.host_only_modules == ("backendconf_reference.compiler",)
    assert caps.thread_safe and caps.fault_injection
    assert caps.dtypes == {
        *(torch.float32, torch.float16, torch.bfloat16, torch.float64),
        *(torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint64, torch.bool),
    }
    backend = ReferenceBackend()
    assert backend.is_available() is True and backend.unavailable_reason() == ""


def test_entry_point_registers_the_backend():
    (entry,) = [ep for ep in importlib.metadata.entry_points(group="backendconf") if ep.name == "reference"]
    plugin = entry.load()
    registered = []
    plugin.backendconf_register_backends(register=registered.append)
    assert [type(b) for b in registered] == [ReferenceBackend]
    assert registered[0].name == "reference"
