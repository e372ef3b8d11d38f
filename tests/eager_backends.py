"""Backends that are eager PyTorch, one with a numerical defect or a virtue each (the numerics verdict's proof).

``EagerBackend`` runs every node of the exported program through
``torch.ops`` in the program's own dtypes: numerically it *is* eager
PyTorch, so every ``parity``, ``ops`` and ``delegation`` check must pass it.
Its blob is the program's graph as plain data (`_encode`: each node's
kind, name, overload name and arguments), pickled with the state tensors:
``torch.export.load`` imports ``torch._dynamo``, which the suite's target
simulation rightly blocks. The others change one thing:

- ``HalfAccumulator``: ``aten.sum``/``aten.mean`` in float16/bfloat16
  accumulate in that dtype, one element at a time (a classic accelerator
  defect, invisible below a few thousand elements).
- ``Float32Compute``: float16/bfloat16 programs run in float32 and round
  once at the end: more accurate than eager.
- ``OtherTies``: ``sort``/``topk``/``max.dim``/``min.dim``/``argmax``/
  ``argmin`` break ties the other way (the last of equal values first).
- ``WrongTopkIndex``: ``topk``'s first index points at the next element.
- ``SmallestTopk``: ``topk`` returns the right values but the indices of
  the k smallest (other values, not another order of ties).
- ``CorruptRunningMean``: ``native_batch_norm`` in training mode writes
  its running mean plus one.
- ``EagerRejectsSigmoid``: rejects ``aten.sigmoid`` so that models with a
  sigmoid are partitioned (the ``delegation`` category runs);
  ``OtherTiesNoSigmoid`` and ``SmallestTopkNoSigmoid`` are the two above
  rejecting it too.
"""

from __future__ import annotations

import operator
import pickle

import torch
from torch.export.graph_signature import InputKind, OutputKind

import pytest_backendconf as bc

aten = torch.ops.aten


class _Interpreter(torch.fx.Interpreter):
    """The graph's nodes through torch.ops; ``calls`` may replace some overloads."""

    def __init__(self, module, calls):
        super().__init__(module)
        self.calls = calls

    def call_function(self, target, args, kwargs):
        replacement = self.calls.get(target)
        if replacement is not None:
            found = replacement(*args, **kwargs)
            if found is not NotImplemented:
                return found
        return super().call_function(target, args, kwargs)


class EagerBackend:
    name = "eager"
    capabilities = bc.Capabilities()
    #: overload -> function called instead (returns NotImplemented to fall back to the overload).
    calls: dict = {}

    def is_available(self):
        return True

    def preprocess(self, program, compile_spec, debug_handles):
        state = {**program.state_dict, **program.constants}
        inputs = [
            None if spec.kind == InputKind.USER_INPUT else state[spec.target]
            for spec in program.graph_signature.input_specs
        ]
        user = [spec.kind == OutputKind.USER_OUTPUT for spec in program.graph_signature.output_specs]
        return pickle.dumps((_encode(program.graph_module), inputs, user), protocol=4)

    def compile(self, processed, method_compile_spec):
        handles = {}
        for method, blob in processed.items():
            graph, inputs, user = pickle.loads(blob)
            handles[method] = (_decode(graph), inputs, user)
        return handles

    def execute(self, handle, inputs):
        module, fixed, user = handle
        given = iter(inputs)
        args = [next(given) if value is None else value for value in fixed]
        wide = self.widen(args)
        with torch.no_grad():
            outputs = _Interpreter(module, self.calls).run(*wide)
            for arg, used in zip(args, wide):  # what the program wrote to a widened input, written back
                if used is not arg:
                    arg.copy_(used)
        return [self.narrow(o) for o, keep in zip(outputs, user) if keep]

    def widen(self, args):
        return args

    def narrow(self, output):
        return output


def _encode(module):
    """A graph module as plain data: nodes (op, name, target, args, kwargs) and its subgraphs."""

    def value(v):
        if isinstance(v, torch.fx.Node):
            return ("$node", v.name)
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, [value(x) for x in v])
        if isinstance(v, dict):
            return ("dict", {k: value(x) for k, x in v.items()})
        return ("$value", v)

    def target(t):
        if t is operator.getitem:
            return ("getitem",)
        if isinstance(t, torch._ops.OpOverload):
            return ("op", t.namespace, t._opname, t._overloadname)
        if isinstance(t, torch._ops.HigherOrderOperator):
            return ("hop", t.__name__)
        return ("name", t)

    nodes = [(n.op, n.name, target(n.target), value(n.args), value(n.kwargs)) for n in module.graph.nodes]
    subgraphs = {name: _encode(child) for name, child in module.named_children()}
    return nodes, subgraphs


def _decode(data):
    nodes, subgraphs = data
    graph = torch.fx.Graph()
    made = {}

    def value(v):
        kind, item = v
        if kind == "$node":
            return made[item]
        if kind == "$value":
            return item
        if kind == "dict":
            return {k: value(x) for k, x in item.items()}
        items = [value(x) for x in item]
        return tuple(items) if kind == "tuple" else items

    def target(t):
        if t[0] == "getitem":
            return operator.getitem
        if t[0] == "op":
            return getattr(getattr(getattr(torch.ops, t[1]), t[2]), t[3])
        if t[0] == "hop":
            return getattr(torch.ops.higher_order, t[1])
        return t[1]

    for op, name, tgt, args, kwargs in nodes:
        if op == "output":
            graph.output(value(args)[0])
            continue
        node = graph.create_node(op, target(tgt), value(args), value(kwargs), name=name)
        made[name] = node
    root = torch.nn.Module()
    for name, child in subgraphs.items():
        setattr(root, name, _decode(child))
    return torch.fx.GraphModule(root, graph)


def _accumulate(x, dims, keepdim, mean):
    if x.dtype not in (torch.float16, torch.bfloat16):
        return NotImplemented
    dims = list(range(x.dim())) if dims is None or dims == [] else [d % max(x.dim(), 1) for d in dims]
    if x.dim() == 0:
        return x.clone()
    rest = [d for d in range(x.dim()) if d not in dims]
    moved = x.permute(*rest, *dims)
    n = 1
    for d in dims:
        n *= x.shape[d]
    flat = moved.reshape(*[x.shape[d] for d in rest], n)
    total = torch.zeros(flat.shape[:-1], dtype=x.dtype)
    for i in range(n):  # one rounding to the dtype per element: a float16 accumulator
        total = total + flat[..., i]
    if mean:
        total = total / n
    if keepdim:
        total = total.reshape([1 if d in dims else x.shape[d] for d in range(x.dim())])
    return total


def _sum(x, dims=None, keepdim=False, *, dtype=None):
    return NotImplemented if dtype is not None else _accumulate(x, dims, keepdim, mean=False)


def _mean(x, dims=None, keepdim=False, *, dtype=None):
    return NotImplemented if dtype is not None else _accumulate(x, dims, keepdim, mean=True)


def _whole(x, *, dtype=None):
    return NotImplemented if dtype is not None else _accumulate(x, None, False, mean=x is None)


class HalfAccumulator(EagerBackend):
    name = "half_accumulator"
    calls = {
        aten.sum.dim_IntList: _sum,
        aten.mean.dim: _mean,
        aten.sum.default: lambda x, *, dtype=None: _sum(x, None, False, dtype=dtype),
        aten.mean.default: lambda x, *, dtype=None: _mean(x, None, False, dtype=dtype),
    }


class Float32Compute(EagerBackend):
    name = "float32_compute"

    def execute(self, handle, inputs):
        self.low = next(
            (x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16)),
            None,
        )
        return super().execute(handle, inputs)

    def widen(self, args):
        if self.low is None:
            return args
        return [a.float() if isinstance(a, torch.Tensor) and a.dtype == self.low else a for a in args]

    def narrow(self, output):
        if self.low is not None and isinstance(output, torch.Tensor) and output.dtype == torch.float32:
            return output.to(self.low)
        return output


def _flipped_sort(x, dim=-1, descending=False, *, stable=None):
    # Sort the input reversed along dim, stably: among equal values the last comes first.
    values, indices = aten.sort.stable(x.flip(dim), stable=True, dim=dim, descending=descending)
    return values, x.shape[dim] - 1 - indices if x.dim() else indices


def _sort(x, dim=-1, descending=False):
    return _flipped_sort(x, dim, descending)


def _sort_stable(x, *, stable=None, dim=-1, descending=False):
    return NotImplemented if stable else _flipped_sort(x, dim, descending)


def _topk(x, k, dim=-1, largest=True, sorted=True):
    if x.dim() == 0:
        return NotImplemented
    values, indices = aten.topk.default(x.flip(dim), k, dim, largest, sorted)
    return values, x.shape[dim] - 1 - indices


def _reduce_with_dim(overload):
    def call(x, dim, keepdim=False):
        if x.dim() == 0:
            return NotImplemented
        values, indices = overload(x.flip(dim), dim, keepdim)
        return values, x.shape[dim] - 1 - indices

    return call


def _arg(overload):
    def call(x, dim=None, keepdim=False):
        if dim is None or x.dim() == 0:
            return NotImplemented
        return x.shape[dim] - 1 - overload(x.flip(dim), dim, keepdim)

    return call


class OtherTies(EagerBackend):
    name = "other_ties"
    calls = {
        aten.sort.default: _sort,
        aten.sort.stable: _sort_stable,
        aten.topk.default: _topk,
        aten.max.dim: _reduce_with_dim(aten.max.dim),
        aten.min.dim: _reduce_with_dim(aten.min.dim),
        aten.argmax.default: _arg(aten.argmax.default),
        aten.argmin.default: _arg(aten.argmin.default),
    }


def _wrong_topk(x, k, dim=-1, largest=True, sorted=True):
    values, indices = aten.topk.default(x, k, dim, largest, sorted)
    if indices.numel() == 0 or x.dim() == 0:
        return values, indices
    wrong = indices.clone()
    wrong.view(-1)[0] = (wrong.view(-1)[0] + 1) % x.shape[dim]
    return values, wrong


class WrongTopkIndex(EagerBackend):
    name = "wrong_topk_index"
    calls = {aten.topk.default: _wrong_topk}


def _corrupt_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    out = aten.native_batch_norm.default(x, weight, bias, running_mean, running_var, training, momentum, eps)
    if training and running_mean is not None:
        running_mean.add_(1)
    return out


def _smallest_topk(x, k, dim=-1, largest=True, sorted=True):
    values, _ = aten.topk.default(x, k, dim, largest, sorted)
    _, indices = aten.topk.default(x, k, dim, not largest, sorted)
    return values, indices


class SmallestTopk(EagerBackend):
    name = "smallest_topk"
    calls = {aten.topk.default: _smallest_topk}


class CorruptRunningMean(EagerBackend):
    name = "corrupt_running_mean"
    calls = {aten.native_batch_norm.default: _corrupt_batch_norm}


class EagerRejectsSigmoid(EagerBackend):
    name = "eager_no_sigmoid"

    def preprocess(self, program, compile_spec, debug_handles):
        for node in program.graph_module.graph.nodes:
            if node.op == "call_function" and node.target is aten.sigmoid.default:
                raise bc.UnsupportedNodeError(node, "this backend has no sigmoid")
        return super().preprocess(program, compile_spec, debug_handles)


class OtherTiesNoSigmoid(EagerRejectsSigmoid, OtherTies):
    name = "other_ties_no_sigmoid"


class SmallestTopkNoSigmoid(EagerRejectsSigmoid, SmallestTopk):
    name = "smallest_topk_no_sigmoid"


class FusedPairsDrift(EagerBackend):
    """Exact on one node; a program of two or more nodes (a fused kernel) comes out 1% high."""

    name = "fused_pairs_drift"

    def execute(self, handle, inputs):
        outputs = super().execute(handle, inputs)
        nodes = [n for n in handle[0].graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
        if len(nodes) < 2:
            return outputs
        return [o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outputs]


@bc.hookimpl
def backendconf_register_backends(register):
    for backend in (
        EagerBackend,
        HalfAccumulator,
        Float32Compute,
        OtherTies,
        WrongTopkIndex,
        SmallestTopk,
        CorruptRunningMean,
        EagerRejectsSigmoid,
        OtherTiesNoSigmoid,
        SmallestTopkNoSigmoid,
        FusedPairsDrift,
    ):
        register(backend())
