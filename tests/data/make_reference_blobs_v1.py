"""How ``reference-blobs-v1.bcpt`` and ``reference-opcodes-v1.json`` were made: with the reference
backend's first op table (blob format 1, opcodes 1..251), before the table grew to every overload
of the ops data.

Re-running this with a later release writes that release's blobs and table, not the first's; the
committed files are the fixtures. The model runs a spread of the first table's ops (convolution,
pooling, normalization, activations, reductions, shapes, indexing, casts, creation) so that a
renumbered or reused opcode changes its outputs or fails its load. Inputs and eager outputs ride
along as attributes. The JSON is the first table's opcode -> overload name map, which the table
must keep (append only).

    python tests/data/make_reference_blobs_v1.py tests/data
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import pytest_backendconf as bc
from pytest_backendconf.reference import ops


class Spread(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)
        self.linear = torch.nn.Linear(4, 5)
        self.ln = torch.nn.LayerNorm(5)
        self.embed = torch.nn.Embedding(10, 5)

    def forward(self, x, idx):
        y = torch.nn.functional.hardswish(self.norm(self.conv(x)))
        y = torch.nn.functional.max_pool2d(y, 2)
        pooled = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        h = torch.nn.functional.gelu(self.ln(self.linear(pooled)))
        h = torch.softmax(h, -1) + self.embed(idx).mean(1)
        parts = torch.cat([h[:, :2], h.transpose(0, 1)[:2].t()], dim=1)
        mask = parts > parts.mean()
        filled = parts.masked_fill(mask, 0.5).cumsum(-1)
        counts = (idx % 3).to(torch.float32).sum(-1, keepdim=True)
        return filled * torch.rsqrt(counts + 1), torch.argmax(h, -1), torch.where(mask, parts, -parts).clamp(-1, 1)


def main(directory: str) -> None:
    out = Path(directory)
    torch.manual_seed(0)
    model = Spread().eval()
    x = torch.randn(2, 3, 8, 8)
    idx = torch.randint(0, 10, (2, 3))
    lowered = bc.to_backend(model, "reference", {"forward": {}}, example_inputs={"forward": (x, idx)})
    lowered.fixture_args = [x, idx]
    with torch.no_grad():
        lowered.fixture_expected = list(model(x, idx))
    bc.save(lowered, out / "reference-blobs-v1.bcpt")
    table = {str(op.opcode): op.name for op in ops.OPS}
    (out / "reference-opcodes-v1.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
