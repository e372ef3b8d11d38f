"""Index outputs of ops that leave the order of ties open: checked for validity, not equality.

The rule is numerics' (`pytest_backendconf.numerics.settle_ties`, shared with
parity and delegation); here an op sample's overload and decoded arguments
say which output is indices, along which dimension, and what they select
from (the sample's first input).
"""

from __future__ import annotations

from typing import Any

from pytest_backendconf.numerics import InvalidIndices, TieOpen, settle_ties as settle, tie_open_call

from .discovery import OpSample, decode_arg, decode_arg_dict

__all__ = ["InvalidIndices", "settle_ties"]


def settle_ties(sample: OpSample, actual: list[Any], expected: list[Any]) -> tuple[list[Any], list[int]]:
    """``actual`` with each valid tie-open index output replaced by ``expected``'s, and the outputs so settled.

    Raises `InvalidIndices` naming the first wrong index.
    """
    args = decode_arg(sample.args, sample.inputs)
    call = tie_open_call(sample.overload, args, decode_arg_dict(sample.kwargs, sample.inputs))
    if call is None:
        return actual, []
    if sample.outputs is None:  # the op's result is one tensor
        if call.output != 0:
            return actual, []
        at = 0
    elif call.output in sample.outputs:
        at = sample.outputs.index(call.output)
    else:
        return actual, []
    if at >= min(len(actual), len(expected)):
        return actual, []
    return settle(actual, expected, {at: TieOpen(call, args[0], expected[at])})
