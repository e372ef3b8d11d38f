"""Argument checks for allowlisted operators whose kernels trust index-like arguments.

A few admitted operators read memory at positions their arguments give without
checking them against the tensor: ``aten.segment_reduce`` with ``offsets`` past
the data sums words read from the heap, and with ``unsafe=True`` skips its own
checks of ``lengths``. Those arguments may come from a file (a blob's
constants) or from the caller at run time (an input tensor), so the check runs
on every call, before the kernel: `argument_check` gives the checker the
interpreter binds in front of such an operator, whether it runs from the op
table or through the dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


def _segment_reduce(
    data: torch.Tensor,
    reduce: str,
    *,
    lengths: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: object = None,
) -> None:
    if unsafe:
        raise ValueError("aten.segment_reduce with unsafe=True skips its own argument checks; it is refused")
    if offsets is not None and offsets.numel():
        size = data.size(axis)
        if bool(offsets.min() < 0) or bool(offsets.max() > size) or bool((offsets.diff(dim=-1) < 0).any()):
            raise ValueError(
                f"aten.segment_reduce: offsets must be non-decreasing and within [0, {size}] (the data's size "
                "along axis); these would read outside the tensor"
            )


#: overload name -> a function taking the operator's arguments, raising ValueError when they would
#: make its kernel read or write outside its tensors.
ARGUMENT_CHECKS: dict[str, Callable[..., None]] = {"aten.segment_reduce.default": _segment_reduce}


def argument_check(name: str) -> Callable[..., None] | None:
    """The run-time argument check of operator ``name`` ("aten.segment_reduce.default"), or None."""
    return ARGUMENT_CHECKS.get(name)
