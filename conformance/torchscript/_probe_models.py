"""Models the TorchScript symbolication checks lower: their lines are what the texts must show.

They live in a real source file, so that the expected line can be read back
from it (``suite.toml`` names the expressions, never line numbers).
"""

from __future__ import annotations

import torch
from torch import nn

from .._probe_models import register_probe_op


class TsMystery(nn.Module):
    """Calls ``backendconf_probe::mystery``, a custom op no backend can know: preprocess must reject it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        return torch.ops.backendconf_probe.mystery(y)


class TsScaleInner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class TsScale(nn.Module):
    """Runs on inputs of 4 columns; on 5 columns the multiplication in `TsScaleInner` fails at execute."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TsScaleInner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.inner(x)) + 1


PROBE_MODELS = {"TsMystery": TsMystery, "TsScale": TsScale}


def probe_model(name: str) -> nn.Module:
    """A probe model by its name in ``suite.toml`` (a fixed table: nothing is looked up by attribute)."""
    if name == "TsMystery":
        register_probe_op()
    return PROBE_MODELS[name]().eval()
