"""What the lowered module's state shows beside eager's buffers, call by call: the defect a failure names.

`StateWatch` snapshots both before a call and compares what each call
changed: a state the backend left as it was where eager's changed was
*never written back*; a cache whose changed rows are eager's shifted by one
was *written one position off*; any other difference is named with its
size. Only the first finding is kept: later ones follow from it.
"""

from __future__ import annotations

from typing import Any

import torch

import pytest_backendconf as bc


class StateWatch:
    """Compares ``bc.state(lowered)`` with ``eager``'s buffers of the same names around every call."""

    def __init__(self, eager: torch.nn.Module, lowered: Any) -> None:
        self.eager = eager
        self.lowered = lowered
        self.finding: str | None = None
        self._before: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None

    def _eager_state(self, names: Any) -> dict[str, torch.Tensor]:
        buffers = dict(self.eager.named_buffers())
        return {n: buffers[n].detach().clone() for n in names if n in buffers}

    def before(self) -> None:
        if self.finding is not None:
            return
        mine = bc.state(self.lowered)
        self._before = (mine, self._eager_state(mine))

    def after(self, record: Any) -> None:
        if self.finding is not None or self._before is None or record.error is not None:
            return
        mine_before, eager_before = self._before
        mine = bc.state(self.lowered)
        eager = self._eager_state(mine)
        for name in sorted(eager):
            finding = describe(name, mine_before[name], mine[name], eager_before[name], eager[name])
            if finding:
                self.finding = f"The lowered module's state after {record.where()}: {finding}"
                return


def describe(
    name: str, mine_before: torch.Tensor, mine: torch.Tensor, eager_before: torch.Tensor, eager: torch.Tensor
) -> str:
    """What differs between the backend's update of one state and eager's (``""``: nothing)."""
    if mine.shape != eager.shape or mine.dtype != eager.dtype:
        return f"state {name!r} is {mine.dtype}{list(mine.shape)}, eager's {eager.dtype}{list(eager.shape)}"
    if _close(mine, eager):
        return ""
    eager_changed = _changed(eager_before, eager)
    mine_changed = _changed(mine_before, mine)
    if eager_changed.any() and not mine_changed.any():
        return (
            f"state {name!r} still holds its value from before the call, where eager's changed: the state was never "
            "written back (execute must return each state's new value, first among its outputs; "
            'docs/backend-contract.md, "State")'
        )
    for dim in range(eager.dim()):
        if eager.shape[dim] < 2:
            continue
        rows = _rows(eager_changed, dim)
        theirs = _rows(mine_changed, dim)
        if not rows or len(rows) == eager.shape[dim]:
            continue
        for shift in (1, -1):
            if theirs == sorted((r + shift) % eager.shape[dim] for r in rows):
                return (
                    f"the call wrote index {_span(theirs)} of state {name!r} along dimension {dim}, where eager wrote "
                    f"index {_span(rows)}: the cache was written one position off ({shift:+d})"
                )
    if not _close(mine_before, eager_before):
        return ""  # already apart before this call (reported at an earlier one)
    diff = (mine.double() - eager.double()).abs()
    return (
        f"state {name!r} differs from eager's (max abs error {float(diff.max()):.3g} at index "
        f"{[int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)]})"
    )


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.is_floating_point():
        return torch.equal(a, b)
    # The state's values as the outputs' verdict sees them: a low-precision rounding is no finding.
    return torch.allclose(a.double(), b.double(), rtol=2e-2, atol=1e-3, equal_nan=True)


def _changed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    return before.ne(after) & ~(before.isnan() & after.isnan()) if before.is_floating_point() else before.ne(after)


def _rows(changed: torch.Tensor, dim: int) -> list[int]:
    other = [d for d in range(changed.dim()) if d != dim]
    flat = changed.any(dim=tuple(other)) if other else changed
    return [int(i) for i in flat.nonzero().reshape(-1)]


def _span(rows: list[int]) -> str:
    return (
        str(rows[0])
        if len(rows) == 1
        else f"{rows[0]}-{rows[-1]}"
        if rows == list(range(rows[0], rows[-1] + 1))
        else str(rows)
    )
