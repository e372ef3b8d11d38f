"""Our passes on the exporter's ONNX IR model (host only): names, handles, dtypes, fault flag.

`ModelBuilder` takes the ``onnx_ir.Model`` that ``torch.onnx`` made of a
program and, in place:

- inlines the exporter's local functions (``torch.cond`` branches);
- traces every ONNX node back to the FX node of the given program it came
  from, names it ``<branch>/<FX node>#<k>`` and records that node's debug
  handle (the blob's node table, and ``backendconf.debug_handle`` metadata);
- makes every tensor output a distinct, node-produced graph output;
- widens float16/bfloat16 to float32, rounding each FX node's results back
  to the program's dtype (``Cast`` there and back), as eager does;
- for a fault injected in a ``torch.cond`` branch, adds an output that says
  whether the branch ran;
- drops the exporter's metadata (stack traces, Python object names) and
  doc strings, for deterministic, compact bytes;

and returns the blob's `blob.Header`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.fx
from torch.export.graph_signature import ConstantArgument, InputKind

from pytest_backendconf import UnsupportedNodeError

from . import blob as blob_format
from ._compat import op_schema

#: Name of the extra model output that says whether the fault node ran.
FAULT_FLAG = "__backendconf_fault_reached__"
PRODUCER = "backendconf-onnxruntime"


class ModelBuilder:
    """Names, handles, low-precision widening and fault flag on the exporter's IR model."""

    def __init__(
        self,
        model: Any,
        program: torch.export.ExportedProgram,
        originals: Any,
        debug_handles: Mapping[torch.fx.Node, int],
    ) -> None:
        """``originals`` is the exporter's index of the program's nodes (``origin``, ``path``, ``output``)."""
        self.model = model
        self.program = program
        self.originals = originals
        self.debug_handles = debug_handles
        # ONNX node -> the given program's FX node it comes from.
        self.origin: dict[Any, torch.fx.Node] = {}
        self.nodes: dict[str, int] = {}  # final ONNX node name -> debug handle
        self.node_by_name: dict[str, torch.fx.Node] = {}
        self._names = 0

    def _fresh(self, base: str | None) -> str:
        """A new value name, unique in the model (ONNX names are single-assignment across subgraphs)."""
        self._names += 1
        return f"{base or 'value'}__bc{self._names}"

    def finish(self, fault_node: torch.fx.Node | None) -> blob_format.Header:
        from . import __version__

        model = self.model
        _inline_functions(model)
        for node in _all_nodes(model):
            found = self.originals.origin(node.meta.get("node"))
            if found is not None:
                self.origin[node] = found
        self._fix_outputs()
        self._name_inputs_by_position()
        widened = self._widen_low_precision()
        flag = self._fault_flag(fault_node) if fault_node is not None else None
        self._name_nodes()
        # Determinism and size: drop what the exporter records about Python
        # objects and files; keep only our handle per node.
        model.producer_name = PRODUCER
        model.producer_version = __version__
        model.doc_string = None
        model.metadata_props.clear()
        for graph in _all_graphs(model):
            graph.metadata_props.clear()
            graph.doc_string = None
            for value in _graph_values(graph):
                value.metadata_props.clear()
                value.doc_string = None
        for node in _all_nodes(model):
            node.metadata_props.clear()
            node.doc_string = None
            if node.name in self.nodes:
                node.metadata_props["backendconf.debug_handle"] = str(self.nodes[node.name])
        fault = None
        if fault_node is not None:
            fault = blob_format.Fault(
                node=fault_node.name,
                op=_op_name(fault_node),
                handle=self.debug_handles[fault_node],
                flag=flag,
            )
        return blob_format.Header(
            inputs=self._input_slots(widened),
            outputs=self._output_slots(widened),
            nodes=dict(self.nodes),
            fault=fault,
        )

    # --- inputs and outputs ------------------------------------------------------------

    def _input_slots(self, widened: set[str]) -> tuple[blob_format.TensorSlot | None, ...]:
        graph_inputs = {value.name for value in self.model.graph.inputs}
        slots: list[blob_format.TensorSlot | None] = []
        placeholders = {n.name: n for n in self.program.graph_module.graph.find_nodes(op="placeholder")}
        for spec in self.program.graph_signature.input_specs:
            if spec.kind != InputKind.USER_INPUT:
                continue
            if isinstance(spec.arg, ConstantArgument):
                slots.append(None)
                continue
            name = spec.arg.name
            node = placeholders.get(name, self.originals.output)
            if name not in graph_inputs:
                # An unused tensor input: the exporter keeps it, but be safe.
                raise UnsupportedNodeError(node, f"input {name!r} is missing from the exported ONNX model")
            slots.append(_slot(name, node.meta.get("val"), name in widened, node))
        return tuple(slots)

    def _name_inputs_by_position(self) -> None:
        """Give the model's inputs the program's names where the exporter's retrace lost them.

        torch.onnx retraces the program and names its inputs after the
        method's parameters; a program with more user inputs than that (a
        stateful method's state made explicit: ``b_acc, x`` for ``forward(x)``)
        comes out as ``arg_0, arg_1``. The order is kept, the user's inputs
        first among the graph's, so the names are given back by position.
        """
        names = [
            spec.arg.name
            for spec in self.program.graph_signature.input_specs
            if spec.kind == InputKind.USER_INPUT and not isinstance(spec.arg, ConstantArgument)
        ]
        inputs = list(self.model.graph.inputs)
        if {value.name for value in inputs} >= set(names) or len(inputs) < len(names):
            return
        # The retrace names the graph's own values after its nodes, which may be the names of the
        # program's inputs (a partition's input `mul_1` beside the retrace's `mul_1`): those values
        # make way, unless one is a graph output (named as the program's outputs are).
        wanted = set(names)
        outputs = {id(value) for value in self.model.graph.outputs}
        clashing = [value for node in self.model.graph for value in node.outputs if value.name in wanted]
        if any(id(value) in outputs for value in clashing):
            return  # leave the inputs as they are: reported missing, below
        for value in clashing:
            value.name = self._fresh(value.name)
        for value, name in zip(inputs, names):
            value.name = name

    def _output_slots(self, widened: set[str]) -> tuple[tuple[str, Any], ...]:
        output_node = self.originals.output
        values = output_node.args[0]
        if not isinstance(values, (list, tuple)):
            values = (values,)
        slots: list[tuple[str, Any]] = []
        tensor_outputs = iter(self._output_names)
        for spec, value in zip(self.program.graph_signature.output_specs, values):
            if isinstance(spec.arg, ConstantArgument):
                constant = spec.arg.value
                if not isinstance(constant, (bool, int, float, str, type(None))):
                    raise UnsupportedNodeError(output_node, f"constant output {constant!r} is not a number or string")
                slots.append(("constant", constant))
                continue
            name = next(tensor_outputs)
            meta = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
            slots.append(("tensor", _slot(name, meta, name in widened, output_node)))
        return tuple(slots)

    def _fix_outputs(self) -> None:
        """One distinct, node-produced graph output per tensor output of the program.

        ONNX forbids an output name twice and an output that is a graph input
        or an initializer needs a node to produce it: an ``Identity`` then.
        """
        import onnx_ir as ir

        graph = self.model.graph
        outputs = list(graph.outputs)
        seen: set[int] = set()
        fixed = []
        for i, value in enumerate(outputs):
            if id(value) in seen or value.producer() is None:
                copy = ir.Value(name=f"{value.name}__output{i}", type=value.type, shape=value.shape)
                identity = ir.Node("", "Identity", [value], outputs=[copy], name=f"output{i}")
                graph.append(identity)
                self.origin[identity] = self.originals.output
                value = copy
            seen.add(id(value))
            fixed.append(value)
        graph.outputs.clear()
        graph.outputs.extend(fixed)
        self._output_names = [value.name for value in fixed]

    # --- float16 and bfloat16 --------------------------------------------------------------

    def _widen_low_precision(self) -> set[str]:
        """Compute float16/bfloat16 in float32, rounding each FX node's results; return widened I/O names."""
        import onnx_ir as ir

        low = {ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
        model = self.model
        widened: set[str] = set()
        originally: dict[int, Any] = {}  # id(value) -> its low-precision dtype
        graphs = list(_all_graphs(model))
        for graph in graphs:
            for value in _graph_values(graph):
                if value.dtype in low:
                    originally[id(value)] = value.dtype
                    value.dtype = ir.DataType.FLOAT
            for name, value in list(graph.initializers.items()):
                tensor = value.const_value
                if tensor is not None and tensor.dtype in low:
                    value.const_value = ir.Tensor(np.asarray(tensor.numpy(), dtype=np.float32), name=name)
        if not originally:
            return widened
        for graph in graphs:
            widened |= {v.name for v in graph.inputs if id(v) in originally}
            widened |= {v.name for v in graph.outputs if id(v) in originally}
        for node in _all_nodes(model):
            self._widen_attributes(node, low)
        for graph in graphs:
            for node in list(graph):
                for value in node.outputs:
                    if id(value) in originally:
                        self._round(graph, node, value, originally[id(value)])
        for function in model.functions.values():
            for node in function:
                self._widen_attributes(node, low)
        return widened

    def _widen_attributes(self, node: Any, low: set) -> None:
        import onnx_ir as ir

        for name, attr in list(node.attributes.items()):
            if attr.type == ir.AttributeType.INT and name in ("to", "dtype") and attr.value in {int(d) for d in low}:
                node.attributes[name] = ir.AttrInt64(name, int(ir.DataType.FLOAT))
            elif attr.type == ir.AttributeType.TENSOR and attr.value.dtype in low:
                array = np.asarray(attr.value.numpy(), dtype=np.float32)
                node.attributes[name] = ir.AttrTensor(name, ir.Tensor(array, name=attr.value.name))

    def _round(self, graph: Any, node: Any, value: Any, dtype: Any) -> None:
        """Round ``value`` to ``dtype`` where it leaves its FX node (for other FX nodes, outputs)."""
        import onnx_ir as ir

        here = self.origin.get(node)
        uses = [(user, i) for user, i in value.uses() if self.origin.get(user) is not here or here is None]
        is_output = value.is_graph_output()
        if not uses and not is_output:
            return
        narrow = ir.Value(name=self._fresh(value.name), type=ir.TensorType(dtype), shape=value.shape)
        rounded = ir.Value(name=self._fresh(value.name), type=ir.TensorType(ir.DataType.FLOAT), shape=value.shape)
        down = ir.Node("", "Cast", [value], [ir.AttrInt64("to", int(dtype))], outputs=[narrow])
        up = ir.Node("", "Cast", [narrow], [ir.AttrInt64("to", int(ir.DataType.FLOAT))], outputs=[rounded])
        graph.insert_after(node, (down, up))
        if here is not None:
            self.origin[down] = self.origin[up] = here
        for user, i in uses:
            user.replace_input_with(i, rounded)
        if is_output:
            for i, output in enumerate(graph.outputs):
                if output is value:
                    graph.outputs[i] = rounded
            # Keep the output's name: the blob and the caller know it by it.
            name = value.name
            value.name = self._fresh(name)
            rounded.name = name

    # --- fault injection -------------------------------------------------------------------

    def _fault_flag(self, fault_node: torch.fx.Node) -> str | None:
        """``None`` if the fault node runs on every call, else the output saying whether it ran."""
        import onnx_ir as ir

        if not self.originals.path[fault_node]:
            return None  # in the main graph: always reached
        target = next((n for n in _all_nodes(self.model) if self.origin.get(n) is fault_node), None)
        if target is None:
            return None  # exported to no ONNX node: report it on every call
        # Walk up from the node's branch: each If passes out whether the branch
        # holding the node ran (true) or its sibling did (false).
        parents = _graph_parents(self.model)
        graph = target.graph
        chain = []
        while graph is not self.model.graph:
            owner, _ = parents[id(graph)]
            if owner.op_type != "If" or owner.domain not in ("", "ai.onnx"):
                return None  # a loop body: no flag to pass out; report it on every call
            chain.append((graph, owner))
            graph = owner.graph
        flag_value = None
        for graph, owner in chain:
            for attr in owner.attributes.values():
                if attr.type != ir.AttributeType.GRAPH:
                    continue
                branch = attr.value
                if branch is graph:
                    source = flag_value if flag_value is not None else self._constant_bool(branch, True)
                else:
                    source = self._constant_bool(branch, False)
                branch.outputs.append(source)
            owner.resize_outputs(len(owner.outputs) + 1)
            flag_value = owner.outputs[-1]
            flag_value.name = self._fresh(FAULT_FLAG)
            flag_value.type = ir.TensorType(ir.DataType.BOOL)
            flag_value.shape = ir.Shape([])
        assert flag_value is not None
        flag_value.name = FAULT_FLAG
        self.model.graph.outputs.append(flag_value)
        return FAULT_FLAG

    def _constant_bool(self, graph: Any, value: bool) -> Any:
        import onnx_ir as ir

        out = ir.Value(name=self._fresh(FAULT_FLAG), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(np.array(value)))], outputs=[out])
        graph.append(node)
        return out

    # --- names -----------------------------------------------------------------------------

    def _name_nodes(self) -> None:
        """Unique, readable names in graph order: ``<subgraph path>/<FX node>#<k>``."""
        counts: dict[str, int] = {}
        for node in _all_nodes(self.model):
            fx_node = self.origin.get(node)
            if fx_node is not None:
                base = f"{self.originals.path[fx_node]}{fx_node.name}"
            else:
                base = "onnx"
            k = counts.get(base, 0)
            counts[base] = k + 1
            node.name = f"{base}#{k}"
            if fx_node is not None:
                self.nodes[node.name] = self.debug_handles[fx_node]
                self.node_by_name[node.name] = fx_node
        for function in self.model.functions.values():
            for node in function:
                base = f"{function.name}/{node.op_type}"
                k = counts.get(base, 0)
                counts[base] = k + 1
                node.name = f"{base}#{k}"


def _inline_functions(model: Any) -> None:
    """Inline the exporter's local functions (``torch.cond`` branches become them).

    Their nodes then sit in the ``If`` branches where ONNX Runtime runs them,
    with their FX provenance (``meta``) kept, so they get names and handles
    like any other node.
    """
    from onnx_ir.passes import common

    if not model.functions:
        return
    common.InlinePass()(model)
    common.RemoveUnusedFunctionsPass()(model)
    common.RemoveUnusedOpsetsPass()(model)


def _slot(name: str, val: Any, widened: bool, node: torch.fx.Node) -> blob_format.TensorSlot:
    if not isinstance(val, torch.Tensor):
        raise UnsupportedNodeError(node, f"value {name!r} is a {type(val).__name__}, not a tensor")
    # A symbolic size (dynamic shapes) is None: the ONNX model has a named
    # dimension there, and the lowered module checks each call's sizes
    # against the program's ranges before execute sees them.
    shape = tuple(dim if isinstance(dim, int) else None for dim in val.shape)
    return blob_format.TensorSlot(name, str(val.dtype).removeprefix("torch."), shape, widened)


def _graph_parents(model: Any) -> dict[int, tuple[Any, str]]:
    import onnx_ir as ir

    parents = {}
    for node in _all_nodes(model):
        for name, attr in node.attributes.items():
            if attr.type == ir.AttributeType.GRAPH:
                parents[id(attr.value)] = (node, name)
            elif attr.type == ir.AttributeType.GRAPHS:
                for graph in attr.value:
                    parents[id(graph)] = (node, name)
    return parents


def _all_nodes(model: Any) -> Iterator[Any]:
    """Every node of the main graph and its subgraphs, in order (not functions)."""
    return iter(list(model.graph.all_nodes()))


def _all_graphs(model: Any) -> Iterator[Any]:
    yield model.graph
    yield from model.graph.subgraphs()


def _graph_values(graph: Any) -> Iterator[Any]:
    seen: set[int] = set()
    for value in (*graph.inputs, *graph.initializers.values(), *(o for n in graph for o in n.outputs), *graph.outputs):
        if id(value) not in seen:
            seen.add(id(value))
            yield value


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    schema = op_schema(target)
    if schema is not None:
        return f"{target.namespace}::{schema.name.split('::')[-1]}"
    return getattr(target, "__name__", str(target))
