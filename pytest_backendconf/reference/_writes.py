"""Which tensors a blob's instructions may write to: only those the program created itself.

An in-place operator (``add_``, ``copy_``, an ``out=`` overload) declares in its
schema which arguments it writes (``Tensor(a!) self``). Applied to a tensor the
program made, that is an ordinary step; applied to a block's input (the caller's
tensor), a constant (the program's weights, shared by every call) or anything
that may be a view of them, it changes state outside the call. The compiler
never writes such a blob (it rejects input writes at preprocess); this check
refuses one read from a file, at decode, before anything runs.

A register is "outside" when its value may share memory the program did not
create: block inputs, constants, and results that alias an outside argument
(by the schema's alias sets, ``Tensor(a) self -> Tensor(a)``; for ops without
a schema, such as ``getitem`` or ``cond``, any outside argument counts).

Annotations do not tell the whole story: ``type_as``, ``atleast_1d``, eval-mode
``dropout`` and others return their argument itself although their schema says
nothing. So the load-time check is only the early, named refusal; what decides is
what happens: every instruction that writes is bound with `guard_writes`, which,
before it runs, compares the storage byte ranges of the tensors it will write with
those of the block's inputs and the program's constants, and refuses the write.
Only writing instructions pay for it (exported programs are functional: few do).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from ..allowlist import UNANNOTATED_ALIASES, schema_named
from ..errors import OperatorRefusedError
from .bytecode import Const, Reg

#: overload name -> (written arguments, result sources), each a tuple of (position, name, kwarg_only);
#: result sources None: any argument (no schema).
_PLANS: dict[str, tuple[tuple, tuple | None]] = {}


def plan_of(name: str, schema: torch.FunctionSchema | None = None) -> tuple[tuple, tuple | None]:
    """What an operator writes and what its result may alias, from its schema (cached by name)."""
    found = _PLANS.get(name)
    if found is not None:
        return found
    schema = schema if schema is not None else schema_named(name)
    if schema is None:
        plan: tuple[tuple, tuple | None] = ((), None)
    else:
        positional = 0
        slots = []
        for argument in schema.arguments:
            slots.append((positional if not argument.kwarg_only else None, argument.name, argument))
            positional += not argument.kwarg_only
        writes = tuple((p, n) for p, n, a in slots if a.alias_info is not None and a.alias_info.is_write)
        returned: set[str] = set()
        for r in schema.returns:
            if r.alias_info is not None:
                returned |= set(r.alias_info.before_set)
        if name in UNANNOTATED_ALIASES:
            sources: tuple = ((0, slots[0][1]),)
        else:
            sources = tuple(
                (p, n) for p, n, a in slots if a.alias_info is not None and returned & set(a.alias_info.before_set)
            )
        plan = (writes, sources)
    _PLANS[name] = plan
    return plan


class WriteCheck:
    """Walks one block's instructions in order; refuses a write to memory the program did not create."""

    __slots__ = ("outside", "where", "n_inputs")

    def __init__(self, n_inputs: int, where: str) -> None:
        self.n_inputs = n_inputs  # a block's inputs are the caller's (or the owner's operands): outside
        #: For each instruction's result register (n_inputs + i): whether it is outside.
        self.outside: list[bool] = []
        self.where = where

    def instruction(
        self, name: str, args: list, kwargs: dict, node: str, handle: int, schema: torch.FunctionSchema | None = None
    ) -> tuple:
        """Check one instruction (``args`` without a DISPATCH's leading name) and record its result.

        :returns: the arguments it writes (registers, lists of them), for `guard_writes`."""
        plan = _PLANS.get(name)
        writes, sources = plan if plan is not None else plan_of(name, schema)
        if not writes and not sources and sources is not None:
            self.outside.append(False)  # most ops: a fresh result, no writes
            return ()
        written = []
        for position, arg_name in writes:
            value = _argument(args, kwargs, position, arg_name)
            written.append(value)
            held = self._describe_outside(value)
            if held is not None:
                raise OperatorRefusedError(
                    name,
                    f"{self.where}, node {node!r}, debug handle {handle}",
                    f"it writes to its argument {arg_name!r}, which holds {held}; a blob may only write "
                    "to tensors the program itself created",
                )
        if sources is None:
            outside = any(self._is_outside(v) for v in args) or any(self._is_outside(v) for v in kwargs.values())
        else:
            outside = any(self._is_outside(_argument(args, kwargs, p, n)) for p, n in sources)
        self.outside.append(outside)
        return tuple(written)

    def fresh(self) -> None:
        """Record an instruction that writes nothing and returns a new tensor (an integer kernel)."""
        self.outside.append(False)

    def _is_outside(self, value: object) -> bool:
        if isinstance(value, Reg):
            return value.index < self.n_inputs or self.outside[value.index - self.n_inputs]
        if isinstance(value, Const):
            return True
        if isinstance(value, list):
            return any(self._is_outside(v) for v in value)
        return False

    def _describe_outside(self, value: object) -> str | None:
        if isinstance(value, Const):
            return f"constant {value.index} of the program (its weights, shared by every call)"
        if isinstance(value, Reg):
            if value.index < self.n_inputs:
                return f"input {value.index} of the block (the caller's tensor)"
            if self.outside[value.index - self.n_inputs]:
                return f"register {value.index}, which may share memory with an input or a constant"
            return None
        if isinstance(value, list):
            for item in value:
                held = self._describe_outside(item)
                if held is not None:
                    return held
        return None


def _argument(args: list, kwargs: dict, position: int | None, name: str) -> object:
    if position is not None and position < len(args):
        return args[position]
    return kwargs.get(name)


# --- at run time ----------------------------------------------------------------------


def guard_writes(
    step: Callable[[list], object], written: tuple, n_inputs: int, constants: tuple, name: str
) -> Callable[[list], object]:
    """``step``, refusing to run when a tensor it writes shares memory with a block input or a constant.

    ``written`` are the registers (or lists of them) the instruction writes; ``constants`` the
    program's constant tensors. Judged by storage byte ranges, so a view, the argument itself
    returned by an unannotated op, or a tensor over the same memory all count."""
    targets = tuple(_registers(written))
    if not targets:
        return step
    fixed = tuple(span for c in constants for span in _spans(c))

    def guarded(regs: list) -> object:
        for target in targets:
            for start, end in _spans(regs[target]):
                for i in range(n_inputs):
                    for other in _spans(regs[i]):
                        if start < other[1] and other[0] < end:
                            raise RuntimeError(_refusal(name, target, f"input {i} of the block (the caller's tensor)"))
                for other in fixed:
                    if start < other[1] and other[0] < end:
                        raise RuntimeError(_refusal(name, target, "a constant of the program (its weights)"))
        return step(regs)

    return guarded


def _refusal(name: str, register: int, held: str) -> str:
    return (
        f"{name} would write register {register}, which shares memory with {held}; a call writes only to "
        "tensors the program created, so the write was refused before it ran (the caller's tensor is unchanged)"
    )


def _registers(values: Iterable[object]) -> list[int]:
    found: list[int] = []
    for value in values:
        if isinstance(value, Reg):
            found.append(value.index)
        elif isinstance(value, list):
            found += _registers(value)
    return found


def _spans(value: object) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of the storages of the tensors in ``value`` (a tensor, a list
    or tuple of them, anything else: none); an empty storage has none."""
    if isinstance(value, (list, tuple)):
        return [span for item in value for span in _spans(item)]
    if not isinstance(value, torch.Tensor):
        return []
    storage = value.untyped_storage()
    size = storage.nbytes()
    if size == 0:
        return []
    start = storage.data_ptr()
    return [(start, start + size)]
