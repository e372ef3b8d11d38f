"""How ``reference-blobs-v2.bcpt`` and ``reference-opcodes-v2.json`` were made: with
backendconf-reference 0.3.0 (blob format 1), whose compiler wrote PT2E quantize/dequantize nodes as
the literal opcodes 490 to 496 and the float ops between them as float kernels.

0.4.0 runs ``dq -> conv/linear/matmul/add -> q`` as integer kernels instead; an archive written
before must keep loading and giving the same outputs (its blobs hold the literal opcodes only).
Re-running this with a later release writes that release's blobs and table, not 0.3.0's; the
committed files are the fixtures. The model is quantized per channel with the project's reference
quantizer and holds a convolution, a ReLU, an add, a linear layer and a matmul. Inputs and the
0.3.0 outputs ride along as attributes; the JSON is 0.3.0's whole opcode -> overload name map.

    python tests/data/make_reference_blobs_v2.py tests/data
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import pytest_backendconf as bc
from pytest_backendconf.quant import quantize, reference_quantizer
from pytest_backendconf.reference import ops


class QuantizedSpread(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.linear = torch.nn.Linear(4, 5)

    def forward(self, x, y):
        a = torch.relu(self.conv(x))
        b = a + x[:, :1]
        h = self.linear(b.mean((2, 3)))
        return h, torch.matmul(h, y)


def main(directory: str) -> None:
    out = Path(directory)
    torch.manual_seed(0)
    model = QuantizedSpread().eval()
    x, y = torch.randn(2, 3, 8, 8), torch.randn(5, 3)
    exported = torch.export.export(model, (x, y))
    calibration = [((torch.randn(2, 3, 8, 8), torch.randn(5, 3)), {}) for _ in range(4)]
    converted = quantize(exported.module(), reference_quantizer("int8-static-per-channel"), calibration)
    lowered = bc.to_backend(converted, "reference", {"forward": {}}, example_inputs={"forward": (x, y)})
    lowered.fixture_args = [x, y]
    with torch.no_grad():
        lowered.fixture_expected = list(lowered(x, y))
    bc.save(lowered, out / "reference-blobs-v2.bcpt")
    table = {str(op.opcode): op.name for op in ops.OPS}
    (out / "reference-opcodes-v2.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
