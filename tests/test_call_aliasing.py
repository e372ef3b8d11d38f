"""A call of a loaded archive never changes the caller's tensors: aliasing judged by what happens.

The campaign set a caller's input to another value through four routes, each
an operator that returns its argument itself without saying so in its schema
(``type_as``, ``atleast_1d``, eval-mode ``alpha_dropout``, ``_cast_Float``,
``broadcast_tensors``, …) followed by an in-place write, or ``set_data``
rebinding a fresh tensor onto an input. Each route here ends in a clear error
(at ``load()`` when the allowlist or the load-time check refuses the program, at
the call when only the run-time storage check can tell) and the caller's
tensor unchanged. The segment is a fallback segment of a real archive whose
hashes, sizes and CRCs fit, so only the content is hostile.
"""

from __future__ import annotations

import pytest
import torch
from partition_models import scale  # noqa: F401  (registers bcpartition::scale)
from test_archive import entries_of, repack

import pytest_backendconf as bc
from pytest_backendconf.errors import BackendError
from pytest_backendconf.lowering import _saving
from pytest_backendconf.reference import bytecode, interpreter, ops
from pytest_backendconf.reference.bytecode import Block, Const, Instruction, Program, Reg

# An operator of the test's own namespace (a custom operator, so outside the closed namespaces)
# that returns its argument itself with a schema that does not say so: only run time can tell.
_LIBRARY = torch.library.Library("bcaliasing", "DEF")
_LIBRARY.define("same(Tensor x) -> Tensor")
_LIBRARY.impl("same", lambda x: x, "CPU")


class FallbackFirst(torch.nn.Module):
    """The fallback segment reads the caller's input itself (value 0 of the plan)."""

    def forward(self, x):
        return torch.relu(torch.ops.bcpartition.scale(x, 2.0)) + 1


@pytest.fixture(scope="module")
def archive_entries():
    lowered = bc.to_backend(
        FallbackFirst(), "reference", {"forward": {}}, example_inputs=(torch.randn(2, 4),), partition="supported"
    )
    entries = entries_of(_saving.to_bytes(lowered))
    assert "fallback/forward.fallback0.bin" in entries
    return entries


def _dispatch(name, *args, **kwargs) -> Instruction:
    return Instruction(ops.DISPATCH_OPCODE, [name, *args], kwargs, 7, "alias")


def _write(register: int) -> Instruction:
    """``aten.add_.Tensor(r, r)``: an admitted in-place op, writing its first argument."""
    return Instruction(ops.DISPATCH_OPCODE, ["aten.add_.Tensor", Reg(register), Reg(register)], {}, 8, "write")


def _segment(*instructions: Instruction, constants=()) -> bytes:
    return bytecode.encode(Program(list(constants), [Block(1, list(instructions), [Reg(len(instructions))])]))


# route -> (the segment, the operator the load-time refusal names)
REFUSED_AT_LOAD = {
    "type_as": (_segment(_dispatch("aten.type_as.default", Reg(0), Reg(0)), _write(1)), "aten.type_as.default"),
    "atleast_1d": (_segment(_dispatch("aten.atleast_1d.default", Reg(0)), _write(1)), "aten.atleast_1d.default"),
    "alpha_dropout": (
        _segment(_dispatch("aten.alpha_dropout.default", Reg(0), 0.5, False), _write(1)),
        "aten.alpha_dropout.default",
    ),
    "_cast_Float": (_segment(_dispatch("aten._cast_Float.default", Reg(0)), _write(1)), "aten._cast_Float.default"),
    "broadcast_tensors": (
        _segment(
            _dispatch("aten.broadcast_tensors.default", [Reg(0)]),
            Instruction(ops.BY_NAME["_operator.getitem"].opcode, [Reg(1), 0], {}, 9, "item"),
            _write(2),
        ),
        "aten.broadcast_tensors.default",
    ),
    "set_data": (
        _segment(
            _dispatch("aten.clone.default", Reg(0)),
            _dispatch("aten.set_data.default", Reg(0), Reg(1)),
        ),
        "aten.set_data.default",
    ),
    # An admitted op the load-time check knows returns its argument in eval mode.
    "dropout_eval": (
        _segment(_dispatch("aten.dropout.default", Reg(0), 0.5, False), _write(1)),
        "aten.add_.Tensor",
    ),
}


@pytest.mark.parametrize("route", sorted(REFUSED_AT_LOAD))
def test_a_route_to_the_callers_tensor_is_refused_at_load(archive_entries, route):
    segment, operator = REFUSED_AT_LOAD[route]
    archive = repack({**archive_entries, "fallback/forward.fallback0.bin": segment})
    with pytest.raises(bc.OperatorRefusedError) as info:
        bc.load(archive)
    text = str(info.value)
    assert f"operator {operator!r}" in text and "fallback/forward.fallback0.bin" in text


def test_an_unannotated_alias_then_a_write_is_refused_at_the_call(archive_entries):
    """Nothing at load can know ``bcaliasing::same`` returns its argument: the call refuses the write."""
    segment = _segment(_dispatch("bcaliasing.same.default", Reg(0)), _write(1))
    module = bc.load(repack({**archive_entries, "fallback/forward.fallback0.bin": segment}))
    x = torch.full((2, 4), 3.0)
    with pytest.raises(
        bc.BackendRuntimeError, match=r"shares memory with input 0 of the block \(the caller's tensor\)"
    ):
        module(x)
    assert torch.equal(x, torch.full((2, 4), 3.0))


def test_a_view_of_the_input_through_an_unannotated_op_is_caught_by_its_byte_range():
    """``same`` of a slice: another tensor object over part of the caller's storage."""
    slice_ = ops.BY_NAME["aten.slice.Tensor"].opcode
    program = _segment(
        _dispatch("bcaliasing.same.default", Reg(0)),
        Instruction(slice_, [Reg(1), 0, 1, 2], {}, 9, "s"),  # the static check sees a view of a fresh tensor
        _write(2),
    )
    loaded = interpreter.load(program, dispatch=True)
    x = torch.full((2, 4), 3.0)
    with pytest.raises(BackendError, match="shares memory with input 0"):
        loaded.run([x])
    assert torch.equal(x, torch.full((2, 4), 3.0))


def test_a_write_to_memory_shared_with_a_constant_is_refused_and_every_later_call_sees_the_same_weights():
    weights = torch.ones(2, 4)
    program = _segment(
        _dispatch("bcaliasing.same.default", Const(0)),
        _write(1),
        constants=[weights],
    )
    loaded = interpreter.load(program, dispatch=True)
    for _ in range(2):
        with pytest.raises(BackendError, match="a constant of the program"):
            loaded.run([torch.zeros(1)])
    assert torch.equal(loaded.main.steps[0][0]([None]), torch.ones(2, 4))


def test_writes_to_tensors_the_program_made_still_run():
    """The run-time check refuses only shared memory: a fresh tensor's in-place op runs as before."""
    program = _segment(_dispatch("aten.clone.default", Reg(0)), _write(1))
    x = torch.full((2, 4), 3.0)
    out = interpreter.load(program, dispatch=True).run([x])[0]
    assert torch.equal(out, torch.full((2, 4), 6.0)) and torch.equal(x, torch.full((2, 4), 3.0))


def test_a_constant_no_instruction_reads_stays_alive_so_fresh_tensors_never_take_its_memory():
    """The guard's byte ranges come from load: were an unread constant freed, the allocator would
    hand its memory to the next tensor of its size, whose in-place op would then be refused."""
    unread = [torch.ones(64, 64) for _ in range(8)]
    program = _segment(_dispatch("aten.clone.default", Reg(0)), _write(1), constants=unread)
    del unread
    loaded = interpreter.load(program, dispatch=True)
    for _ in range(20):
        x = torch.full((64, 64), 3.0)
        out = loaded.run([x])[0]
        assert torch.equal(out, torch.full((64, 64), 6.0)) and torch.equal(x, torch.full((64, 64), 3.0))
