"""Compile a ``torch.export`` program into a reference-backend blob (host only).

This is the backend's ``preprocess``: it walks the exported graph, checks
every node against the op table and the supported dtypes, embeds
parameters, buffers and lifted constants in the constant pool, and writes
the bytecode of ``bytecode.py``. The target never imports this module: it
is listed in ``capabilities.host_only_modules``, and the suite checks that
loading and running a blob works without it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Sequence, cast

import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind

from .. import _compat
from ..allowlist import UNANNOTATED_ALIASES, resolve_operator
from ..backend import fault_node_name
from ..errors import OperatorRefusedError, UnsupportedNodeError
from ..provenance import named_op_node
from ..vendor import check_compile_spec_keys

from . import _qpatterns, bytecode, ops
from .bytecode import Block, BlockRef, Const, Instruction, Reg

if TYPE_CHECKING:
    from torch.export.graph_signature import InputSpec

#: Compile-spec key asking for an injected fault (docs/backend-contract.md, fault injection).
FAULT_KEY = "__backendconf_fault__"
#: Every compile-spec key the reference backend understands.
KNOWN_KEYS = (FAULT_KEY,)

# Binary arithmetic whose second operand may be a Python number (``x * 0.5``).
_SCALAR_ARITHMETIC = frozenset({"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor"})

_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)

# Ops that may return their input itself although their schema does not say
# so (eval-mode dropout is the identity; _unsafe_view is a view by design).
_UNANNOTATED_ALIASES = UNANNOTATED_ALIASES


def compile_program(
    program: torch.export.ExportedProgram,
    compile_spec: Mapping[str, Any] | None,
    debug_handles: Mapping[torch.fx.Node, int],
    *,
    fallback: bool = False,
) -> bytes:
    """Compile one method's exported program; the same inputs give the same bytes.

    Raises ``UnsupportedNodeError`` for a node the backend cannot run and
    ``ValueError`` for a bad compile spec. With ``fallback=True`` (partial
    delegation's CPU fallback) any dtype the blob can hold is accepted, and
    an operator the table lacks is called through torch's dispatcher.
    """
    fault_name = fault_node_name(check_compile_spec_keys(compile_spec, KNOWN_KEYS, "reference"))
    fault_node = _find_fault_node(program.graph_module, fault_name) if fault_name else None
    return bytecode.encode(_Compiler(program, debug_handles, fault_node, fallback).program())


def _find_fault_node(graph_module: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    """The op node called ``name``, searched in graph order, subgraphs after their use."""
    return named_op_node([node for node in _walk(graph_module) if node.op == "call_function"], name)


def _walk(graph_module: torch.fx.GraphModule) -> Iterator[torch.fx.Node]:
    for node in graph_module.graph.nodes:
        yield node
        if node.op == "get_attr":
            sub = _attribute(graph_module, node.target)
            if isinstance(sub, torch.fx.GraphModule):
                yield from _walk(sub)


# --- the compiler --------------------------------------------------------------------


class _Compiler:
    """Turns one exported program into a `bytecode.Program`."""

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        debug_handles: Mapping[torch.fx.Node, int],
        fault_node: torch.fx.Node | None,
        fallback: bool = False,
    ) -> None:
        self.fallback = fallback
        self.exported = program
        self.debug_handles = debug_handles
        self.fault_node = fault_node
        self.constants: list[torch.Tensor] = []
        self.blocks: list[Block | None] = []
        # Placeholder node -> its input spec, for the forward graph's placeholders.
        self.input_specs: dict[torch.fx.Node, InputSpec] = {}
        # Node -> the placeholders whose memory its value may share (views,
        # in-place results): what an in-place op on it would write to.
        self.aliases: dict[torch.fx.Node, frozenset[torch.fx.Node]] = {}

    def program(self) -> bytecode.Program:
        self._reject_mutations()
        self._block(self.exported.graph_module, is_main=True)
        return bytecode.Program(self.constants, cast("list[Block]", self.blocks))  # every block compiled now

    def _reject_mutations(self) -> None:
        """Reject a program whose signature writes back to a buffer or input.

        Such outputs appear once a program is functionalized (for instance by
        ``run_decompositions``); in-place ops left in the graph are checked
        node by node in `_reject_input_writes`.
        """
        graph = self.exported.graph_module.graph
        by_name = {node.name: node for node in graph.nodes}
        for spec in self.exported.graph_signature.output_specs:
            if spec.kind == OutputKind.USER_OUTPUT:
                continue
            node = by_name.get(getattr(spec.arg, "name", None)) or graph.output_node()
            if spec.kind == OutputKind.BUFFER_MUTATION:
                reason = (
                    f"the program updates buffer {spec.target!r} in place; the reference "
                    "backend runs functional programs only (export in eval mode)"
                )
            elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                reason = (
                    f"the program mutates its input {spec.target!r}; the reference backend "
                    "runs functional programs only"
                )
            else:
                reason = f"output kind {spec.kind.name} is not supported by the reference backend"
            raise UnsupportedNodeError(node, reason)

    def _block(self, graph_module: torch.fx.GraphModule, is_main: bool) -> BlockRef:
        """Compile one graph into a code block; nested graphs get later indices."""
        index = len(self.blocks)
        self.blocks.append(None)  # reserve the index before nested blocks take theirs
        input_specs = {}
        if is_main:
            input_specs = {
                spec.arg.name: spec for spec in self.exported.graph_signature.input_specs if hasattr(spec.arg, "name")
            }
        env: dict[torch.fx.Node, Any] = {}
        n_inputs = 0
        for node in graph_module.graph.find_nodes(op="placeholder"):
            spec = input_specs.get(node.name)
            if spec is not None:
                self.input_specs[node] = spec
            self.aliases[node] = frozenset({node})
            if spec is not None and spec.kind in _CONSTANT_KINDS:
                env[node] = self._constant(node, spec)
            elif spec is not None and spec.kind != InputKind.USER_INPUT:
                raise UnsupportedNodeError(
                    node, f"input kind {spec.kind.name} is not supported by the reference backend"
                )
            else:
                self._check_dtypes(node, f"input {node.name!r}")
                env[node] = Reg(n_inputs)
                n_inputs += 1

        # Quantized chains run as integer kernels; partial delegation's fallback runs what eager runs.
        plan = None
        if not self.fallback:
            plan = _qpatterns.find_chains(
                graph_module.graph, lambda n: self._constant_tensor(graph_module, n), self.fault_node
            )
        instructions: list[Instruction] = []
        outputs: list = []
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                env[node] = self._get_attr(graph_module, node)
            elif node.op == "call_function":
                if plan is not None and node in plan.skipped:
                    continue  # inside an integer kernel, written at its quantize node
                self._reject_input_writes(node)
                chain = plan.chains.get(node) if plan is not None else None
                instructions.append(self._instruction(node, env) if chain is None else self._kernel(chain, env))
                env[node] = Reg(n_inputs + len(instructions) - 1)
                self.aliases[node] = self._aliased_inputs(node)
            elif node.op == "output":
                outputs = self._outputs(node, env, is_main)
            else:
                raise UnsupportedNodeError(node, f"{node.op} nodes are not supported (torch.export does not make them)")
        self.blocks[index] = Block(n_inputs, instructions, outputs)
        return BlockRef(index)

    def _aliased_inputs(self, node: torch.fx.Node) -> frozenset[torch.fx.Node]:
        """The placeholders whose memory the result of ``node`` may share."""
        target = node.target
        sources: Sequence[object]
        if target is operator.getitem or _compat.is_higher_order_op(target):
            # An item of a view list (split), or a branch output that is an operand.
            sources = node.all_input_nodes
        elif _compat.is_op_overload(target) and (
            any(r.alias_info is not None for r in _compat.op_schema(target).returns)
            or str(target) in _UNANNOTATED_ALIASES
        ):
            sources = node.args[:1]  # views and in-place ops alias their first argument
        else:
            return frozenset()
        found: set[torch.fx.Node] = set()
        for source in sources:
            if isinstance(source, torch.fx.Node):
                found |= self.aliases.get(source, frozenset())
        return frozenset(found)

    def _reject_input_writes(self, node: torch.fx.Node) -> None:
        """Reject an in-place op that writes to (a view of) an input, parameter or buffer.

        In-place ops on the program's own intermediates are fine: they are
        fresh per call. Writing to anything else would change the caller's
        tensors or the program's state, from one call to the next.
        """
        target = node.target
        schema = _compat.op_schema(target)
        if schema is None or not schema.is_mutable:
            return
        for i, param in enumerate(schema.arguments):
            if param.alias_info is None or not param.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(param.name)
            written = value if isinstance(value, (list, tuple)) else (value,)
            bases: set[torch.fx.Node] = set()
            for v in written:
                if isinstance(v, torch.fx.Node):
                    bases |= self.aliases.get(v, frozenset())
            if bases:
                base = min(bases, key=lambda n: n.name)  # deterministic choice of culprit
                raise UnsupportedNodeError(node, self._write_reason(str(target), base))

    def _write_reason(self, name: str, base: torch.fx.Node) -> str:
        spec = self.input_specs.get(base)
        functional = "the reference backend runs programs that leave their inputs and state unchanged"
        if spec is None:
            return f"{name} writes to {base.name!r}, an input of a subgraph; {functional}"
        if spec.kind == InputKind.USER_INPUT:
            return f"{name} mutates its input {base.name!r}; {functional}"
        kind = spec.kind.name.lower().replace("_", " ")
        return f"{name} updates {kind} {spec.target!r} in place; {functional} (export in eval mode)"

    def _constant(self, node: torch.fx.Node, spec: InputSpec) -> Const:
        """Put a parameter, buffer or lifted constant into the constant pool."""
        target = spec.target
        if target in self.exported.state_dict:
            tensor = self.exported.state_dict[target]
        else:
            tensor = self.exported.constants.get(target)
        if not isinstance(tensor, torch.Tensor):
            raise UnsupportedNodeError(node, f"constant {target!r} is a {type(tensor).__name__}, not a tensor")
        self._check_dtype(node, tensor.dtype, f"constant {target!r}")
        self.constants.append(tensor)
        return Const(len(self.constants) - 1)

    def _get_attr(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> object:
        value = _attribute(graph_module, str(node.target))
        if isinstance(value, torch.fx.GraphModule):
            # Compiled when an op that takes it is (see _value): a subgraph of
            # an unsupported higher-order op is then reported as that op.
            return value
        if isinstance(value, torch.Tensor):
            self._check_dtype(node, value.dtype, f"attribute {node.target!r}")
            self.constants.append(value)
            return Const(len(self.constants) - 1)
        raise UnsupportedNodeError(
            node, f"attribute {node.target!r} is a {type(value).__name__}, not a tensor or subgraph"
        )

    def _instruction(self, node: torch.fx.Node, env: dict) -> Instruction:
        name = overload_name(node.target)
        op = ops.BY_NAME.get(name)
        if op is None and self.fallback and _compat.is_op_overload(node.target):
            return self._dispatch_instruction(node, name, env)
        if op is None:
            raise UnsupportedNodeError(
                node,
                f"{name} is not in the reference backend's op table (pytest_backendconf.reference.ops)",
            )
        self._check_dtypes(node, name)
        args, kwargs = _schema_arguments(node)
        if op.check is not None:
            reason = op.check(args, kwargs)
            if reason:
                raise UnsupportedNodeError(node, f"{name}: {reason}")
        values = [self._value(node, a, env) for a in args]
        if name in _SCALAR_ARITHMETIC and not kwargs:
            values = self._scalar_as_tensor(node, values)
        return Instruction(
            opcode=op.opcode,
            args=values,
            kwargs={k: self._value(node, v, env) for k, v in kwargs.items()},
            debug_handle=self.debug_handles[node],
            node=node.name,
            fault=node is self.fault_node,
        )

    def _kernel(self, chain: _qpatterns.Chain, env: dict) -> Instruction:
        """An integer kernel for a quantized chain; it keeps the debug handles of every node it covers."""
        args = []
        for value in chain.args:
            if isinstance(value, torch.Tensor):  # a requantization parameter or int32 bias: a new constant
                self.constants.append(value)
                value = Const(len(self.constants) - 1)
            elif isinstance(value, torch.fx.Node):
                value = env[value]
            args.append(value)
        return Instruction(
            opcode=chain.opcode,
            args=args,
            kwargs={},
            debug_handle=self.debug_handles[chain.anchor],
            node=chain.anchor.name,
            handles=tuple(self.debug_handles[n] for n in chain.nodes),
        )

    def _constant_tensor(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor | None:
        """The tensor of a parameter, buffer, lifted constant or tensor attribute; None for anything else."""
        if node.op == "get_attr":
            value = _attribute(graph_module, str(node.target))
            return value if isinstance(value, torch.Tensor) else None
        spec = self.input_specs.get(node)
        if node.op != "placeholder" or spec is None or spec.kind not in _CONSTANT_KINDS:
            return None
        found = self.exported.state_dict.get(spec.target)
        if found is None:
            found = self.exported.constants.get(spec.target)
        return found if isinstance(found, torch.Tensor) else None

    def _scalar_as_tensor(self, node: torch.fx.Node, values: list) -> list:
        """``x + 1.0`` as ``x + tensor(1.0)``: a 0-dim constant of ``x``'s dtype, made once here.

        A Python number costs each call about two microseconds of conversion
        (most of a small elementwise op); a 0-dim CPU tensor takes the same
        kernel path as the number (both are "CPU scalars" to the kernel). It is
        used only where nothing can change: the number is exact in ``x``'s
        dtype, of the same kind (float with floating, int with integer), and
        the result keeps that dtype, so type promotion, the value the kernel
        reads and the result are the number's to the bit.
        """
        tensor, scalar = node.args[0] if node.args else None, values[1] if len(values) == 2 else None
        if not isinstance(tensor, torch.fx.Node) or isinstance(scalar, bool):
            return values
        val, out = tensor.meta.get("val"), node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dtype != val.dtype:
            return values
        dtype = val.dtype
        if dtype.is_floating_point and isinstance(scalar, float):
            pass
        elif not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool and isinstance(scalar, int):
            pass
        else:
            return values
        try:
            constant = torch.tensor(scalar, dtype=dtype)
        except (OverflowError, RuntimeError):
            return values  # out of the dtype's range: keep the number's own semantics
        if constant.item() != scalar:
            return values
        self.constants.append(constant)
        return [values[0], Const(len(self.constants) - 1)]

    def _dispatch_instruction(self, node: torch.fx.Node, name: str, env: dict) -> Instruction:
        """Call an operator the table lacks by name; the interpreter resolves it at load.

        The same allowlist as at load decides here, so that a refused operator is reported at
        lowering, on the node, rather than by every later load."""
        try:
            resolve_operator(name, where=f"node {node.name!r}")
        except OperatorRefusedError as exc:
            raise UnsupportedNodeError(node, f"the CPU fallback does not run {name}: {exc.reason}") from None
        args, kwargs = _schema_arguments(node)
        return Instruction(
            opcode=ops.DISPATCH_OPCODE,
            args=[name, *(self._value(node, a, env) for a in args)],
            kwargs={k: self._value(node, v, env) for k, v in kwargs.items()},
            debug_handle=self.debug_handles[node],
            node=node.name,
            fault=node is self.fault_node,
        )

    def _outputs(self, node: torch.fx.Node, env: dict, is_main: bool) -> list:
        values = node.args[0]
        if not isinstance(values, (list, tuple)):
            values = (values,)
        if is_main:
            # Mutation outputs were rejected before; the rest are user outputs.
            kinds = [spec.kind for spec in self.exported.graph_signature.output_specs]
            values = [v for v, kind in zip(values, kinds) if kind == OutputKind.USER_OUTPUT]
        return [self._value(node, v, env) for v in values]

    def _value(self, node: torch.fx.Node, arg: object, env: dict) -> bytecode.Value:
        """An FX argument as a blob value: nodes become register/constant/block refs."""
        if isinstance(arg, torch.fx.Node):
            if isinstance(env[arg], torch.fx.GraphModule):
                env[arg] = self._block(env[arg], is_main=False)
            return env[arg]
        if isinstance(arg, (list, tuple)):
            return [self._value(node, a, env) for a in arg]
        if not bytecode.can_encode(arg):
            raise UnsupportedNodeError(
                node,
                f"{overload_name(node.target)}: argument {arg!r} of type {type(arg).__name__} "
                "cannot be stored in a reference-backend blob",
            )
        return cast(bytecode.Value, arg)  # can_encode took it

    def _check_dtypes(self, node: torch.fx.Node, what: str) -> None:
        for tensor in _tensors(node.meta.get("val")):
            self._check_dtype(node, tensor.dtype, what)

    def _check_dtype(self, node: torch.fx.Node, dtype: torch.dtype, what: str) -> None:
        if self.fallback and bytecode.can_encode(dtype):
            return  # the fallback runs eager kernels: any dtype the blob can name
        if dtype not in ops.SUPPORTED_DTYPES:
            supported = ", ".join(sorted(str(d) for d in ops.SUPPORTED_DTYPES))
            raise UnsupportedNodeError(node, f"{what} has dtype {dtype}; the reference backend supports {supported}")


# --- helpers ---------------------------------------------------------------------


def overload_name(target: object) -> str:
    """The table name of a call target: "aten.mul.Tensor", "_operator.getitem", …"""
    if _compat.is_op_overload(target):
        return str(target)
    if _compat.is_higher_order_op(target):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or "<unknown>"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


def _schema_arguments(node: torch.fx.Node) -> tuple[tuple, dict]:
    """The node's arguments as kernels take them: schema-positional ones by position.

    Export writes keyword-only schema arguments as kwargs, but may also name
    a positional one; kernels are only promised to match the schema's order.
    """
    args, kwargs = list(node.args), dict(node.kwargs)
    target = node.target
    if not _compat.is_op_overload(target) or not kwargs:
        return tuple(args), kwargs
    positional = [a for a in _compat.op_schema(target).arguments if not a.kwarg_only]
    for i in range(len(args), len(positional)):
        if not any(p.name in kwargs for p in positional[i:]):
            break
        param = positional[i]
        if param.name in kwargs:
            args.append(kwargs.pop(param.name))
        elif param.has_default_value():
            args.append(param.default_value)
        else:
            raise UnsupportedNodeError(node, f"{target}: argument {param.name!r} is missing")
    return tuple(args), kwargs


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _attribute(graph_module: torch.nn.Module, target: str) -> object:
    obj: object = graph_module
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj
