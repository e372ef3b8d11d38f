"""Tensor-subclass weights (torchao's quantized tensors) unwrapped into plain tensors before partitioning.

``torchao.quantization.quantize_`` replaces a linear layer's weight with a
tensor subclass (``Int8Tensor``, ``IntxUnpackedToInt8Tensor``) holding the
integer values, the scales and the zero points. ``torch.export`` keeps such
a weight as one parameter and reads its parts through
``export.access_subclass_inner_tensor(weight, "qdata")`` nodes, which no
backend can run. This pass does what torchao's ``unwrap_tensor_subclass``
does for export, on the program rather than the module (so it also serves a
program exported elsewhere, and imports nothing of torchao): each part
becomes a parameter of its own, named ``<weight>.<part>`` (``l.weight.qdata``,
``l.weight.scale``, ``l.weight.zero_point``), and each access node the
placeholder of that parameter. The ops that use the parts
(``torchao.dequantize_affine``, or plain ``aten`` ops for int8 weights) stay
as export wrote them. A program without subclass state is returned as is.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from .._compat import is_tensor_subclass
from ..errors import LoweringError

if TYPE_CHECKING:
    from torch.export import ExportedProgram

#: The node torch.export writes to read one part of a tensor subclass.
ACCESS = "export.access_subclass_inner_tensor.default"
_STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _state(program: ExportedProgram, spec: InputSpec) -> object:
    if spec.target in program.state_dict:
        return program.state_dict[spec.target]
    return program.constants.get(spec.target)


def has_subclass_state(program: ExportedProgram) -> bool:
    """Whether a parameter, buffer or constant of ``program`` is a tensor subclass (a quantized weight)."""
    return any(
        spec.kind in _STATE_KINDS and is_tensor_subclass(_state(program, spec))
        for spec in program.graph_signature.input_specs
    )


def unwrap_tensor_subclasses(program: ExportedProgram, method: str = "forward") -> ExportedProgram:
    """``program`` with every tensor-subclass parameter, buffer or constant split into plain tensors.

    The caller's program is left unchanged (the suite lowers one program many times). A
    `LoweringError` names a subclass the program uses other than by its parts.
    """
    if not has_subclass_state(program):
        return program
    graph_module = copy.deepcopy(program.graph_module)
    graph = graph_module.graph
    # A copied graph may rename a node whose name shadows a builtin (a user input called ``input``).
    renamed = {old.name: new.name for old, new in zip(program.graph.nodes, graph.nodes)}
    placeholders = {node.name: node for node in graph.find_nodes(op="placeholder")}
    state_dict = dict(program.state_dict)
    constants = dict(program.constants)
    specs: list[InputSpec] = []
    work = [_renamed(spec, renamed) for spec in program.graph_signature.input_specs]
    while work:
        spec = work.pop(0)
        value: Any = state_dict[spec.target] if spec.target in state_dict else constants.get(spec.target)
        if spec.kind not in _STATE_KINDS or not is_tensor_subclass(value):
            specs.append(spec)
            continue
        node = placeholders[spec.arg.name]
        parts, _ = value.__tensor_flatten__()
        users = list(node.users)
        whole = [u for u in users if not (str(u.target) == ACCESS and len(u.args) == 2 and u.args[1] in parts)]
        if whole:
            raise LoweringError(
                f"method {method!r}: {spec.kind.name.lower()} {spec.target!r} is a {type(value).__name__} (a tensor "
                f"subclass) that node {whole[0].name!r} ({whole[0].target}) uses as a whole; a backend receives plain "
                "tensors only, so the program must read the subclass's parts (torch.export does for torchao's "
                "quantized tensors of `quantize_`); run the program's run_decompositions() first, or quantize with "
                "a torchao config whose tensors export to plain ops"
            )
        inner: list[InputSpec] = []
        for part in parts:
            tensor = getattr(value, part)
            target = f"{spec.target}.{part}"
            with graph.inserting_before(node):
                placeholder = graph.placeholder(f"{node.name}_{part}")
            accesses = [u for u in users if u.args[1] == part]
            placeholder.meta.update(accesses[0].meta if accesses else node.meta)
            for access in accesses:
                access.replace_all_uses_with(placeholder)
                graph.erase_node(access)
            placeholders[placeholder.name] = placeholder
            if spec.kind == InputKind.PARAMETER:
                state_dict[target] = torch.nn.Parameter(tensor, requires_grad=False)
            elif spec.kind == InputKind.BUFFER and spec.persistent:
                state_dict[target] = tensor
            else:
                constants[target] = tensor
            inner.append(InputSpec(spec.kind, TensorArgument(placeholder.name), target, spec.persistent))
        graph.erase_node(node)
        state_dict.pop(spec.target, None)
        constants.pop(spec.target, None)
        work[:0] = inner  # a part may itself be a subclass (nested)
    graph.lint()
    graph_module.recompile()
    outputs = [_renamed(spec, renamed) for spec in program.graph_signature.output_specs]
    return _rebuilt(program, graph_module, specs, outputs, state_dict, constants)


def _renamed(spec: Any, renamed: dict[str, str]) -> Any:
    name = getattr(spec.arg, "name", None)
    if name is None or renamed.get(name, name) == name:
        return spec
    return dataclasses.replace(spec, arg=dataclasses.replace(spec.arg, name=renamed[name]))


def _rebuilt(
    program: ExportedProgram,
    graph_module: torch.fx.GraphModule,
    input_specs: list[InputSpec],
    output_specs: list,
    state_dict: dict,
    constants: dict,
) -> ExportedProgram:
    from torch.export.graph_signature import ExportGraphSignature

    signature = ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)
    return torch.export.ExportedProgram(
        graph_module,
        graph_module.graph,
        signature,
        state_dict,
        program.range_constraints,
        program.module_call_graph,
        program.example_inputs,
        constants,
        verifiers=list(program.verifiers),  # export's IR (not core ATen's): the program's own ops stay as they are
    )
