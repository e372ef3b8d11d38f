"""Run reference-backend blobs: decode once into closures, then execute (target side).

``load`` turns a blob into a `LoadedProgram` whose instructions are
pre-bound closures (kernel resolved, constant arguments in place, register
reads compiled into fast paths), so the execute loop does one call per
instruction. ``LoadedProgram.run`` keeps all per-call state in a fresh
register list, so one program may run from many threads at once.

This module must work where the compiler is absent: it imports neither
``compiler`` nor ``torch.export``. An instruction that calls an operator
through the dispatcher (``DISPATCH``: partial delegation's fallback, for
operators the op table lacks) is allowed only in a fallback segment
(``load(blob, dispatch=True)``) and resolved once, at load, through
`pytest_backendconf.allowlist.resolve_operator`: an operator not registered
in this process is an `UnregisteredOperatorError` naming it, one outside the
allowlist an `OperatorRefusedError`. Every instruction's writes are checked at
load (``_writes``: the named refusal) and, for the instructions that write,
again at run time by storage byte ranges (``guard_writes``): a blob writes only
to tensors it created, whatever an operator's schema says about aliasing.
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Sequence
from typing import Callable, NoReturn, cast

import torch

from ..allowlist import argument_check, resolve_operator
from ..errors import BackendError, OperatorRefusedError

from . import bytecode, ops
from ._writes import WriteCheck, guard_writes
from .bytecode import BlockRef, Const, Reg

#: A bound instruction: reads its arguments from the registers, returns its result.
Step = Callable[[list], object]


def load(blob: bytes, *, dispatch: bool = False, where: str = "reference-backend blob") -> "LoadedProgram":
    """Decode and check a blob; raise ``ValueError`` if it is malformed.

    :param dispatch: whether the blob may call operators through the dispatcher (``DISPATCH``
        instructions): true only for partial delegation's fallback segments; a whole-method
        blob of the reference backend never does, so one that does is refused.
    :param where: what the blob is, for errors ("fallback segment 'forward.fallback0'").
    :raises OperatorRefusedError: (a ``ValueError``) the blob names an operator that is refused,
        or writes to a tensor it did not create.
    """
    program = bytecode.decode(blob)
    fixed = tuple(c for c in program.constants if isinstance(c, torch.Tensor))  # what no call may write
    blocks: list[CodeBlock | None] = [None] * len(program.blocks)
    # Nested blocks have higher indices than their users: build them first.
    for index in reversed(range(len(program.blocks))):
        blocks[index] = _build_block(index, program.blocks[index], program.constants, blocks, dispatch, where, fixed)
    return LoadedProgram(cast(CodeBlock, blocks[0]), fixed)  # every block is built now


class LoadedProgram:
    """A decoded blob, ready to run: what ``ReferenceBackend.compile`` returns."""

    __slots__ = ("main", "_constants")

    def __init__(self, main: "CodeBlock", constants: tuple = ()) -> None:
        self.main = main
        # The program owns its constant tensors, those no instruction reads included: the write
        # guard compares byte ranges taken at load, and a freed constant's range would be handed
        # to the next tensor allocated, which the guard would then refuse to write.
        self._constants = constants

    @property
    def n_inputs(self) -> int:
        return self.main.n_inputs

    def run(self, inputs: Sequence[object]) -> list:
        """Run the program on the flat user inputs; return the flat outputs."""
        return self.main.run(inputs)

    def run_profiled(self, inputs: Sequence[object]) -> tuple[list, list[tuple[int | list[int], int, int]]]:
        """`run`, timing each instruction: ``(outputs, [(debug_handle, start_ns, end_ns), ...])``."""
        return self.main.run_profiled(inputs)

    def __repr__(self) -> str:
        return f"<LoadedProgram {self.main.n_inputs} inputs, {len(self.main.steps)} steps>"


class CodeBlock:
    """One decoded code block: bound steps, register layout and outputs."""

    __slots__ = ("n_inputs", "steps", "outputs", "_tail", "_instructions", "_timed")

    def __init__(
        self,
        n_inputs: int,
        steps: tuple[tuple[Step, int], ...],
        tail: list,
        outputs: tuple[int, ...],
        instructions: list[bytecode.Instruction],
    ) -> None:
        self.n_inputs = n_inputs
        #: (bound instruction, output register) pairs, in program order.
        self.steps = steps
        #: Registers to return, in order.
        self.outputs = outputs
        # Initial contents of the registers after the inputs: None for
        # instruction results, then any constant the block returns.
        self._tail = tail
        self._instructions = instructions
        # (bound instruction, output register, debug handle): the steps as run_profiled walks them. A fused
        # kernel's event carries its range, a list: the profile shares its time among the nodes.
        self._timed = tuple((call, out, _event_handle(instructions[out - n_inputs])) for call, out in steps)

    def run(self, inputs: Sequence[object]) -> list:
        """Run the block on ``inputs``; raise `BackendError` naming a failing node."""
        if len(inputs) != self.n_inputs:
            raise ValueError(f"the reference-backend program takes {self.n_inputs} inputs, got {len(inputs)}")
        regs = [*inputs, *self._tail]  # per call: nothing shared between threads
        try:
            for call, out in self.steps:
                regs[out] = call(regs)
        except BackendError:
            raise  # an injected fault, or a failure already tied to a nested node
        except Exception as exc:
            raise self._error(out, exc) from exc
        return [regs[i] for i in self.outputs]

    def run_profiled(self, inputs: Sequence[object]) -> tuple[list, list[tuple[int | list[int], int, int]]]:
        """`run`, with one ``(debug_handle, start_ns, end_ns)`` event per instruction (nested blocks
        inside their owner's event, e.g. a ``cond`` node's). Kept apart from `run` so that the
        unprofiled loop pays nothing for it."""
        if len(inputs) != self.n_inputs:
            raise ValueError(f"the reference-backend program takes {self.n_inputs} inputs, got {len(inputs)}")
        regs = [*inputs, *self._tail]
        events: list[tuple[int | list[int], int, int]] = []
        clock, record = time.perf_counter_ns, events.append
        try:
            for call, out, handle in self._timed:
                start = clock()
                regs[out] = call(regs)
                record((handle, start, clock()))
        except BackendError:
            raise
        except Exception as exc:
            raise self._error(out, exc) from exc
        return [regs[i] for i in self.outputs], events

    def _error(self, out: int, exc: Exception) -> BackendError:
        ins = self._instructions[out - self.n_inputs]
        op = ops.BY_OPCODE.get(ins.opcode)
        name = op.qualified_name if op is not None else _qualified(str(ins.args[0]))
        message = f"{name} at node '{ins.node}' failed: {type(exc).__name__}: {exc}"
        if ins.handles:  # a fused kernel: the error belongs to every node it covers
            return BackendError(message, debug_handles=list(ins.handles))
        return BackendError(message, debug_handle=ins.debug_handle)


def _event_handle(ins: bytecode.Instruction) -> int | list[int]:
    return list(ins.handles) if ins.handles else ins.debug_handle


# --- building blocks ----------------------------------------------------------------


def _build_block(
    index: int, block: bytecode.Block, constants: list, blocks: list, dispatch: bool, where: str, fixed: tuple
) -> CodeBlock:
    steps = []
    writes = WriteCheck(block.n_inputs, f"{where}, block {index}")
    for i, ins in enumerate(block.instructions):
        if ins.opcode == ops.DISPATCH_OPCODE:
            step = _dispatch_step(ins, constants, blocks, dispatch, where, writes, fixed)
            steps.append((step, block.n_inputs + i))
            continue
        op = ops.BY_OPCODE.get(ins.opcode)
        if op is None:
            raise ValueError(
                f"reference-backend blob: instruction {i} of block {index} (node {ins.node!r}) "
                f"has unknown opcode {ins.opcode}; it was written by a newer backendconf-reference"
            )
        written: tuple = ()
        if ins.opcode in ops.INTEGER_OPCODES:
            writes.fresh()  # reads its arguments, returns a new tensor
        else:
            written = writes.instruction(op.name, ins.args, ins.kwargs, ins.node, ins.debug_handle)
        if ins.fault:
            steps.append((_fault_step(ins, op), block.n_inputs + i))
        elif op.kernel is not None:  # no-op asserts are dropped; their register stays None
            args = [_resolve(a, constants, blocks) for a in ins.args]
            kwargs = {k: _resolve(v, constants, blocks) for k, v in ins.kwargs.items()}
            step = _bind(_checked(op.kernel, op.name), args, kwargs)
            if written:
                step = guard_writes(step, written, block.n_inputs, fixed, op.name)
            steps.append((step, block.n_inputs + i))

    tail: list = [None] * len(block.instructions)
    outputs = []
    for k, output in enumerate(block.outputs):
        value = _resolve(output, constants, blocks)
        if isinstance(value, Reg):
            outputs.append(value.index)
        elif _is_dynamic(value):
            raise ValueError(
                f"reference-backend blob: output {k} of block {index} is a list of registers; "
                "outputs must be single values"
            )
        else:
            # A constant output (a returned parameter, say) gets a register of its own.
            outputs.append(block.n_inputs + len(tail))
            tail.append(value)
    return CodeBlock(block.n_inputs, tuple(steps), tail, tuple(outputs), block.instructions)


def _resolve(value: object, constants: list, blocks: list) -> object:
    """Replace constant and block references by the objects; keep register refs."""
    if isinstance(value, Const):
        return constants[value.index]
    if isinstance(value, BlockRef):
        return blocks[value.index]
    if isinstance(value, list):
        return [_resolve(v, constants, blocks) for v in value]
    return value


def _is_dynamic(value: object) -> bool:
    """Whether a resolved argument reads registers (so is known only at run time)."""
    if isinstance(value, Reg):
        return True
    return isinstance(value, list) and any(_is_dynamic(v) for v in value)


class UnregisteredOperatorError(ValueError):
    """A blob calls an operator through the dispatcher that this process has not registered."""

    def __init__(self, operator: str, node: str, debug_handle: int) -> None:
        super().__init__(
            f"operator {_qualified(operator)} ({operator}, node {_short(node)}) is not registered in "
            "this process; import the module that defines it (its torch.library registration) "
            "before loading"
        )
        self.operator = operator
        self.node = node
        self.debug_handle = debug_handle


def _qualified(overload: str) -> str:
    """ "mylib::scale" for "mylib.scale.default", as debug info names ops."""
    namespace, _, rest = overload.partition(".")
    return f"{namespace}::{rest.split('.')[0]}"


def _dispatch_step(
    ins: bytecode.Instruction,
    constants: list,
    blocks: list,
    dispatch: bool,
    where: str,
    writes: WriteCheck,
    fixed: tuple,
) -> Step:
    """An operator the op table lacks, called through torch's dispatcher by overload name.

    Resolved here, once per blob load, through the allowlist (never per call)."""
    name = ins.args[0] if ins.args else None
    at = f"{where}, node {_short(ins.node)}, debug handle {ins.debug_handle}"
    if not dispatch:
        raise OperatorRefusedError(
            name,
            at,
            "a whole-method reference-backend blob never calls operators through the dispatcher "
            "(only partial delegation's fallback segments do); the blob was not written by the "
            "reference compiler",
        )
    try:
        kernel = resolve_operator(name, where=at)
    except OperatorRefusedError as exc:
        if exc.unregistered:
            raise UnregisteredOperatorError(str(name), ins.node, ins.debug_handle) from None
        raise
    written = writes.instruction(str(name), ins.args[1:], ins.kwargs, ins.node, ins.debug_handle)
    if ins.fault:
        return _fault_step(ins, None)
    args = [_resolve(a, constants, blocks) for a in ins.args[1:]]
    kwargs = {k: _resolve(v, constants, blocks) for k, v in ins.kwargs.items()}
    return guard_writes(_bind(_checked(kernel, str(name)), args, kwargs), written, writes.n_inputs, fixed, str(name))


def _checked(kernel: Callable, name: str) -> Callable:
    """``kernel``, behind the allowlist's run-time argument check of ``name`` when it has one."""
    check = argument_check(name)
    if check is None:
        return kernel

    def checked(*args: object, **kwargs: object) -> object:
        check(*args, **kwargs)
        return kernel(*args, **kwargs)

    return checked


def _short(text: str, limit: int = 80) -> str:
    """``repr(text)`` cut to ``limit`` characters: names from a blob go into messages."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def _fault_step(ins: bytecode.Instruction, op: ops.Op | None) -> Step:
    name = op.qualified_name if op is not None else _qualified(str(ins.args[0]))
    message = f"injected fault at node '{ins.node}' ({name})"
    handle = ins.debug_handle

    def fault(regs: list) -> NoReturn:
        raise BackendError(message, debug_handle=handle)

    return fault


def _bind(kernel: Callable, args: list, kwargs: dict) -> Step:
    """Pre-bind a kernel to its arguments as a function of the registers.

    Most instructions read one to three registers followed by constants
    (``conv2d(x, w, b, stride, ...)``); those get a closure without any
    per-call argument building. Anything else takes the general path.
    """
    if kwargs:
        if any(_is_dynamic(v) for v in kwargs.values()):
            return _bind_general(kernel, args, kwargs)
        kernel = functools.partial(kernel, **kwargs)
    if any(isinstance(a, list) and _is_dynamic(a) for a in args):
        return _bind_general(kernel, args, {})
    n_regs = 0
    while n_regs < len(args) and isinstance(args[n_regs], Reg):
        n_regs += 1
    rest = tuple(args[n_regs:])
    if any(isinstance(a, Reg) for a in rest) or n_regs > 3:
        return _bind_general(kernel, args, {})
    regs = [a.index for a in args[:n_regs]]
    return _LEADING_REGISTERS[n_regs, bool(rest)](kernel, *regs, rest)


def _regs0(k, rest):
    return lambda r: k(*rest)


def _regs1(k, a, rest):
    return lambda r: k(r[a])


def _regs1_rest(k, a, rest):
    return lambda r: k(r[a], *rest)


def _regs2(k, a, b, rest):
    return lambda r: k(r[a], r[b])


def _regs2_rest(k, a, b, rest):
    return lambda r: k(r[a], r[b], *rest)


def _regs3(k, a, b, c, rest):
    return lambda r: k(r[a], r[b], r[c])


def _regs3_rest(k, a, b, c, rest):
    return lambda r: k(r[a], r[b], r[c], *rest)


# (number of leading register arguments, any constants after them) -> closure factory
_LEADING_REGISTERS: dict[tuple[int, bool], Callable[..., Step]] = {
    (0, False): _regs0,
    (0, True): _regs0,
    (1, False): _regs1,
    (1, True): _regs1_rest,
    (2, False): _regs2,
    (2, True): _regs2_rest,
    (3, False): _regs3,
    (3, True): _regs3_rest,
}


def _bind_general(kernel: Callable, args: list, kwargs: dict) -> Step:
    getters = [_getter(a) for a in args]
    if not kwargs:
        return lambda r: kernel(*[g(r) for g in getters])
    kw_getters = [(name, _getter(v)) for name, v in kwargs.items()]
    return lambda r: kernel(*[g(r) for g in getters], **{n: g(r) for n, g in kw_getters})


def _getter(value: object) -> Step:
    if isinstance(value, Reg):
        return operator.itemgetter(value.index)
    if isinstance(value, list) and _is_dynamic(value):
        items = [_getter(v) for v in value]
        return lambda r: [g(r) for g in items]
    return lambda r: value
