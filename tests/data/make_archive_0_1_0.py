"""How ``archive-0.1.0.bcpt`` was made: with pytest-backendconf 0.1.0 (schema 1.0), before the
archive switched from torch's ``treespec_dumps`` strings to its own structure JSON.

Re-running this with a later release writes that release's format, not 0.1.0's; the committed
file is the fixture. The model has nested inputs and outputs (a tuple holding a list, a keyword
dict, a dict output holding a tuple and a list) so that every structure form of the old strings
that the reader keeps supporting is in it. Inputs and eager outputs ride along as attributes.

    python tests/data/make_archive_0_1_0.py tests/data/archive-0.1.0.bcpt
"""

from __future__ import annotations

import sys

import torch

import pytest_backendconf as bc


class Nested(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x, pair, *, opts):
        first, rest = pair
        y = self.linear(x) * opts["scale"]
        return {"sum": y + first, "parts": (y - rest[0], [rest[1] * 2, y.relu()])}


def main(path: str) -> None:
    torch.manual_seed(0)
    model = Nested().eval()
    x = torch.randn(4, 3)
    pair = (torch.randn(4, 2), [torch.randn(4, 2), torch.randn(4, 2)])
    opts = {"scale": torch.randn(2)}
    lowered = bc.to_backend(
        model,
        "reference",
        {"forward": {}},
        example_inputs={"forward": (x, pair)},
        example_kwargs={"forward": {"opts": opts}},
    )
    lowered.fixture_args = [x, pair]
    lowered.fixture_kwargs = opts
    lowered.fixture_expected = model(x, pair, opts=opts)
    bc.save(lowered, path)


if __name__ == "__main__":
    main(sys.argv[1])
