"""Several ops checks lowered as one program: the engine's per-lowering cost paid once per batch.

A real engine costs a second or more per lowering, however small the
program; the ops category lowers one single-op program per check. Here the
samples of a batch become one program (`build_batch_program`: each sample's
placeholders and call side by side, no node shared), lowered and executed
once; each sample's outputs are cut out and judged exactly as its own check
judges them (`ops.verdict`: the same inputs, reference and tolerance).

What a batch decides, and what it leaves to the check run alone
(`suite._batching` runs those, and bisects what this cannot attribute):

- a sample whose outputs pass is decided ``passed``, with the numerics its
  check alone reports;
- a rejection (`UnsupportedNodeError`) at a sample's own call node is that
  sample's outcome (its node keeps the name it has alone, so the text is the
  same); the batch is lowered again without it. A rejection at any other
  node (a placeholder, an output) sends that sample to run alone;
- a sample whose comparison fails runs alone, so that its failure text,
  saved inputs and rerun command are those of its own lowering;
- a batch that fails otherwise (another lowering error, an error in
  execute) is split.

A crash or hang takes the host down during the batch: the suite side runs
every member alone then, so that the host's isolation blames the right check.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .. import _compat
from ..errors import UnsupportedNodeError
from ..lowering import lower_programs
from ..report import Check
from . import ops
from ._ops_program import build_batch_program, op_call_class


def run_batch(ctx: Any, checks: list[Check]) -> dict[str, Any]:
    """Lower ``checks`` (ops checks of one dtype, distinct op names) as one program; see the module text."""
    from ..suite._host import run_check

    data = ops.ops_data(ctx)
    assert data is not None
    decided: dict[str, dict] = {}
    alone: list[str] = []
    pending: list[Check] = []
    for check in checks:
        sample = data.samples[check.batch.item]  # type: ignore[union-attr]
        try:
            ops.declared_or_skip(ctx, sample)
        except Exception:  # not lowered at all: cheap alone
            alone.append(check.id)
            continue
        pending.append(check)
    while len(pending) > 1:
        samples = [data.samples[c.batch.item] for c in pending]  # type: ignore[union-attr]
        program, spans = build_batch_program(samples)
        try:
            lowered = lower_programs(
                {"forward": program},
                ctx.backend,
                {"forward": {}},
                module_type=op_call_class(sum(len(s.inputs) for s in samples)),
                backend_version=ctx.registered.source.version,
            )
        except UnsupportedNodeError as exc:
            owner = _owner(exc, pending, samples)
            if owner is None:
                return {"decided": decided, "alone": alone, "split": [c.id for c in pending]}
            check, sample, own_node = owner
            if own_node:
                error = ops.rejection(sample, exc, ctx.capabilities.supported_ops is not None)
                decided[check.id] = run_check(_Raises(error), ctx)
            else:
                alone.append(check.id)
            pending.remove(check)
            continue
        except Exception:
            return {"decided": decided, "alone": alone, "split": [c.id for c in pending]}
        inputs = [[t.clone() for t in s.inputs] for s in samples]
        try:
            with torch.no_grad():
                outputs = _compat.tree_leaves(lowered(*[t for own in inputs for t in own]))
        except Exception:
            return {"decided": decided, "alone": alone, "split": [c.id for c in pending]}
        for check, sample, own, (start, stop) in zip(pending, samples, inputs, spans):
            number = check.batch.item  # type: ignore[union-attr]
            judged = _Judged(sample, number, own, outputs[start:stop])
            outcome = run_check(judged, ctx)
            if outcome["outcome"] == "passed":
                decided[check.id] = outcome
            else:
                alone.append(check.id)
        return {"decided": decided, "alone": alone, "split": []}
    alone += [c.id for c in pending]
    return {"decided": decided, "alone": alone, "split": []}


_BATCH_INPUT = re.compile(r"\bb\d+_input\d+\b")


def _owner(exc: UnsupportedNodeError, pending: list[Check], samples: list[Any]) -> tuple[Check, Any, bool] | None:
    """The check whose node was rejected, and whether it was the sample's call node; None: unknown."""
    node = getattr(exc, "node", None)
    name = getattr(node, "name", None)
    if not isinstance(name, str):
        return None
    # A reason that names the batch's own placeholders would read otherwise alone: it runs alone.
    batch_names = _BATCH_INPUT.search(str(getattr(exc, "reason", "")))
    for k, (check, sample) in enumerate(zip(pending, samples)):
        if getattr(node, "op", None) == "call_function" and name == sample.overload.split(".")[1]:
            return check, sample, batch_names is None
        if name.startswith(f"b{k}_input"):
            return check, sample, False
    return None


class _Raises:
    """A check-like object whose run raises ``error`` (the outcome `run_check` makes of it)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def run(self, ctx: Any) -> Any:
        raise self.error


class _Judged:
    """A check-like object whose run judges one sample's part of a batch, as `ops.check_op` does."""

    def __init__(self, sample: Any, number: int, inputs: list[torch.Tensor], actual: list[torch.Tensor]) -> None:
        self.sample, self.number, self.inputs, self.actual = sample, number, inputs, actual

    def run(self, ctx: Any) -> Any:
        program = ops.program_of(ctx, self.number)
        return ops.verdict(ctx, self.sample, self.number, program, list(self.actual), self.inputs, explain=False)
