"""A test-only model whose index outputs have ties in every row (a ``-p`` plugin for the ties tests).

``tied_indices`` rounds ``4 * sigmoid(x)`` to the five values 0 … 4, so
each row of eight has equal values, then returns the indices of ``topk``,
``sort``, ``max`` over a dimension and ``argmin``, each beside other
outputs. Its number of rows varies (a `Dim`), so that the dynamic-shape
parity checks run it too. Its sigmoid makes ``eager_no_sigmoid``-style backends partition
it, so that the delegation category runs it too.
"""

from __future__ import annotations

import torch

import pytest_backendconf as bc


ROWS = torch.export.Dim("rows", min=2, max=6)


class TiedIndices(torch.nn.Module):
    def forward(self, x):
        y = torch.round(torch.sigmoid(x) * 4)
        values, top = torch.topk(y, 3, dim=-1)
        _, order = torch.sort(y, dim=-1)
        most, at = torch.max(y, dim=0)
        return values, top, order, most, at, torch.argmin(y, dim=-1), y * 2


@bc.hookimpl
def backendconf_register_cases(register):
    register(
        bc.ModelCase(
            name="tied_indices",
            build=lambda: TiedIndices().eval(),
            # rows vary in number: the [<dtype>-dynamic] parity checks judge ties too
            inputs={"forward": (bc.TensorInput(shape=(ROWS, 8), low=-3.0, high=3.0),)},
            dim_examples={"rows": 4},
            description="topk, sort, max over a dim and argmin of values rounded to 0 … 4: ties in every row",
        )
    )
