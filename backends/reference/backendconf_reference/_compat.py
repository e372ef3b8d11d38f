"""The private torch names this backend uses, in one place, with the torch versions they were checked on.

A backend copied from this one keeps its torch boundary here: when a torch
release moves one of these, this is the file to change.
"""

from __future__ import annotations

from typing import Any

import torch


def op_schema(target: Any) -> Any:
    """The ``torch.FunctionSchema`` of an op overload (``aten.mul.Tensor``), or None for any other target.

    ``torch._ops.OpOverload`` and its ``_schema`` are private on torch
    2.4-2.14 (no public alias); checked on 2.13 and 2.14.
    """
    if isinstance(target, torch._ops.OpOverload):
        return target._schema
    return None


def is_higher_order_op(target: Any) -> bool:
    """Whether a call target is a higher-order op such as ``torch.cond``
    (``torch._ops.HigherOrderOperator`` on torch 2.4-2.14)."""
    return isinstance(target, torch._ops.HigherOrderOperator)
