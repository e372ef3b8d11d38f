"""Models and backends for the partial-delegation tests; source lines appear in asserted texts.

Importing this module registers the custom operator ``bcpartition::scale``
with torch.library; a process that does not import it does not have it.
"""

from __future__ import annotations

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc


@torch.library.custom_op("bcpartition::scale", mutates_args=())
def scale(x: torch.Tensor, k: float) -> torch.Tensor:
    if not torch.isfinite(x).all():
        raise ValueError("bcpartition::scale needs finite inputs")
    return x * k


@scale.register_fake
def _(x, k):
    return torch.empty_like(x)


class WithCustomOp(torch.nn.Module):
    """A linear layer, a custom op the reference op table lacks, then more arithmetic."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        h = torch.ops.bcpartition.scale(h, 2.0)
        return h.sum(dim=-1) + 1, h - x


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 8)

    def forward(self, x):
        return torch.tanh(self.proj(x))


class EncoderWithHead(torch.nn.Module):
    """What a user composes: an encoder to delegate, a head that stays on the CPU."""

    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.encoder(x)).softmax(dim=-1)


class ThreeParts(torch.nn.Module):
    """sub splits the graph: with sub rejected, three partitions around two fallback nodes."""

    def forward(self, x):
        a = (x * 2).relu()
        b = a - 1
        c = (b * b).sigmoid()
        d = c - x
        return d.exp() + 1


class RejectsSub(ReferenceBackend):
    """The reference backend without aten.sub: it says so only by rejecting it in preprocess."""

    name = "rejects_sub"
    capabilities = bc.Capabilities(
        supported_ops=None,
        dtypes=ReferenceBackend.capabilities.dtypes,
        host_only_modules=ReferenceBackend.capabilities.host_only_modules,
        thread_safe=True,
        fault_injection=True,
    )

    def __init__(self) -> None:
        self.preprocessed = 0

    def preprocess(self, program, compile_spec, debug_handles):
        self.preprocessed += 1
        for node in program.graph.nodes:
            if node.op == "call_function" and str(node.target).startswith("aten.sub"):
                raise bc.UnsupportedNodeError(node, "this backend has no subtraction")
        return super().preprocess(program, compile_spec, debug_handles)


class DeclaresSubtraction(RejectsSub):
    """Declares every reference op, sub included, in supported_ops, then rejects sub."""

    name = "declares_sub"
    capabilities = ReferenceBackend.capabilities


class SupportedNodesMethod(ReferenceBackend):
    """Says which nodes it takes by name: everything but the multiplications."""

    name = "no_mul_nodes"

    def supported_nodes(self, program, compile_spec):
        return [n.name for n in program.graph.nodes if n.op == "call_function" and "mul" not in str(n.target)]


class DropsPartitionOutput(ReferenceBackend):
    """Returns one output too few from a partition with several: a dropped boundary value."""

    name = "drops_output"

    def execute(self, handle, inputs):
        outputs = super().execute(handle, inputs)
        return outputs[:-1] if len(outputs) > 1 else outputs


class SwapsPartitionInputs(ReferenceBackend):
    """Feeds a partition's inputs in reverse order: same shapes, wrong values."""

    name = "swaps_inputs"

    def execute(self, handle, inputs):
        return super().execute(handle, list(reversed(inputs)))


class ClaimsTooMuch(RejectsSub):
    """Its supported_nodes() claims every node, sub included, which preprocess then rejects."""

    name = "claims_too_much"

    def supported_nodes(self, program, compile_spec):
        return [n.name for n in program.graph.nodes if n.op == "call_function"]


class DropsOutputWithoutSub(DropsPartitionOutput, RejectsSub):
    """Partitions (no sub), and drops the last output of any partition with several."""

    name = "drops_output_no_sub"


class SwapsInputsWithoutSub(SwapsPartitionInputs, RejectsSub):
    """Partitions (no sub), and feeds every partition its inputs in reverse order."""

    name = "swaps_inputs_no_sub"
