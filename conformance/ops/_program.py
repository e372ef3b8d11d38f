"""The single-op program of one ops sample, rebuilt from data without tracing.

Discovery (``ops.discovery``) exported every sample once, with
``torch.export`` and the default decompositions, and recorded the one node
the program came down to. Tracing again costs about 50 ms per sample, a
thousand samples per run; rebuilding that program costs about 1 ms: the same
placeholders, the same ``call_function`` node (overload, arguments), the same
outputs, with ``meta["val"]`` from fake-tensor propagation as ``torch.export``
sets it. ``tests/test_ops.py`` checks that the rebuilt program matches a
fresh ``torch.export`` of the same call.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from pytest_backendconf import _compat

from .discovery import OpSample, decode_arg, decode_arg_dict, resolve_overload


class OpCall(torch.nn.Module):
    """Eager PyTorch for one sample: the overload called with the sample's arguments.

    It is also the lowered module's type: its ``forward`` takes the sample's
    tensors positionally (``input0``, ``input1`` …).
    """

    def __init__(self, sample: OpSample) -> None:
        super().__init__()
        self.sample = sample
        self.op = resolve_overload(sample.overload)

    def forward(self, *inputs: torch.Tensor) -> Any:
        args = decode_arg(self.sample.args, list(inputs))
        kwargs = decode_arg_dict(self.sample.kwargs, list(inputs))
        result = self.op(*args, **kwargs)
        if self.sample.outputs is None:
            return result
        return tuple(result[i] for i in self.sample.outputs)


def op_call_class(arity: int) -> type:
    """`OpCall` with a ``forward`` of ``arity`` named positional parameters (the lowered signature)."""
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(f"input{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(arity)
    ]

    def forward(self: OpCall, *inputs: torch.Tensor) -> Any:
        return OpCall.forward(self, *inputs)

    forward.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return type("OpCall", (OpCall,), {"forward": forward, "__module__": __name__})


def build_program(sample: OpSample, inputs: list[torch.Tensor]) -> ExportedProgram:
    """The ``ExportedProgram`` that ``torch.export`` makes of ``sample`` with these inputs."""
    return _program([(sample, inputs, "")])


def build_batch_program(samples: list[OpSample]) -> tuple[ExportedProgram, list[tuple[int, int]]]:
    """One program computing every sample side by side (``ops.run_batch``), and each sample's outputs.

    Sample ``k``'s placeholders are ``b<k>_input0`` …, fed in order; its call
    node keeps the name it has alone (``add``), so a rejection of that node
    reads as it would alone, which is why the samples' op names must differ.
    The second value gives, per sample, the ``(start, stop)`` of its outputs
    among the program's.
    """
    names = [s.overload.split(".")[1] for s in samples]
    if len(set(names)) != len(names):
        raise ValueError(f"a batch needs distinct op names, got {sorted(names)}")
    program = _program([(s, s.inputs, f"b{k}_") for k, s in enumerate(samples)])
    spans, start = [], 0
    for s in samples:
        count = 1 if s.outputs is None else len(s.outputs)
        spans.append((start, start + count))
        start += count
    return program, spans


def _program(parts: list[tuple[OpSample, list[torch.Tensor], str]]) -> ExportedProgram:
    graph = torch.fx.Graph()
    placeholders: list[torch.fx.Node] = []
    outputs: list[torch.fx.Node] = []
    every_input: list[torch.Tensor] = []
    with _compat.fake_tensor_mode(allow_non_fake_inputs=False) as mode:
        for sample, inputs, prefix in parts:
            fakes = [mode.from_tensor(t) for t in inputs]
            own = []
            for i, fake in enumerate(fakes):
                node = graph.placeholder(f"{prefix}input{i}")
                node.meta["val"] = fake
                node.meta["tensor_meta"] = _compat.tensor_metadata(fake)
                own.append(node)
            op = resolve_overload(sample.overload)
            result = op(*decode_arg(sample.args, fakes), **decode_arg_dict(sample.kwargs, fakes))
            placeholders += own
            every_input += inputs
            outputs += _add_call(graph, sample, op, own, result)
    graph.output(tuple(outputs))
    signature = ExportGraphSignature(
        input_specs=[InputSpec(InputKind.USER_INPUT, TensorArgument(p.name), None) for p in placeholders],
        output_specs=[OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(o.name), None) for o in outputs],
    )
    in_spec = _compat.tree_flatten((tuple(every_input), {}))[1]
    out_spec = _compat.tree_flatten(tuple(o.meta["val"] for o in outputs))[1]
    return ExportedProgram(
        root=torch.nn.Module(),  # ExportedProgram makes the one GraphModule of root and graph
        graph=graph,
        graph_signature=signature,
        state_dict={},
        range_constraints={},
        # forward_arg_names: a program re-traced from this one (run_decompositions, as
        # torch.onnx does) keeps the placeholders' names instead of arg_0, arg_1 …
        module_call_graph=[ModuleCallEntry("", _call_signature(in_spec, out_spec, [p.name for p in placeholders]))],
        example_inputs=(tuple(every_input), {}),
        constants={},
    )


def _add_call(
    graph: torch.fx.Graph, sample: OpSample, op: Any, placeholders: list[torch.fx.Node], result: Any
) -> list[torch.fx.Node]:
    """The sample's call node (and its ``getitem`` nodes); returns the nodes the program outputs."""
    args = decode_arg(sample.args, placeholders)
    kwargs = decode_arg_dict(sample.kwargs, placeholders)
    call = graph.call_function(op, tuple(args), kwargs)
    call.name = sample.overload.split(".")[1]
    call.meta["val"] = result
    if isinstance(result, torch.Tensor):
        call.meta["tensor_meta"] = _compat.tensor_metadata(result)
    call.meta["stack_trace"] = _stack_trace()
    if sample.outputs is None:
        return [call]
    outputs = []
    for i in sample.outputs:
        item = graph.call_function(_getitem(), (call, i))
        item.meta["val"] = result[i]
        item.meta["tensor_meta"] = _compat.tensor_metadata(result[i])
        outputs.append(item)
    return outputs


def _call_signature(in_spec: Any, out_spec: Any, names: list[str]) -> ModuleCallSignature:
    signature = ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec)
    if hasattr(signature, "forward_arg_names"):  # not in older torch releases
        signature.forward_arg_names = names
    return signature


def _stack_trace() -> str:
    """The frame of `OpCall.forward` that calls the op, as ``torch.export`` records one."""
    lines, first = inspect.getsourcelines(OpCall.forward)
    offset = next(i for i, line in enumerate(lines) if "self.op(" in line)
    return f'  File "{inspect.getsourcefile(OpCall)}", line {first + offset}, in forward\n    {lines[offset].strip()}\n'


def _getitem() -> Any:
    import operator

    return operator.getitem
