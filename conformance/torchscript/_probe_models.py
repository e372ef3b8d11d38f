"""Models the TorchScript symbolication and reliability checks lower: their lines are what the texts must show.

They live in a real source file, so that the expected line can be read back
from it (``suite.toml`` names the expressions, never line numbers). Each
probe has variants (``suite.toml`` lists them in the order they are tried):
a backend that compiles few operators still lowers one of them, and the
check runs on it.
"""

from __future__ import annotations

import torch
from torch import nn

from .._probe_models import register_probe_op


# --- the rejection probe: accepted operators, then the one no backend can know --------------------


class TsMysteryAfterRelu(nn.Module):
    """``relu``, then ``backendconf_probe::mystery``, a custom op no backend can know: preprocess must reject it."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        return torch.ops.backendconf_probe.mystery(y)


class TsRelu(nn.Module):
    """What `TsMysteryAfterRelu` computes before the mystery op: lowering it says the backend accepts relu."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class TsMysteryAfterSub(nn.Module):
    """``x - h`` (as the seeds' demo compiler takes it), then the mystery op."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        y = x - h
        return torch.ops.backendconf_probe.mystery(y)


class TsSub(nn.Module):
    """What `TsMysteryAfterSub` computes before the mystery op."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return x - h


class TsMysteryAlone(nn.Module):
    """The mystery op alone: for a backend that lowers neither of the others' operators."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.ops.backendconf_probe.mystery(x)


# --- the runtime-error and memory probes: they run on good inputs and fail inside the backend on bad ones --


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


class TsAddPair(nn.Module):
    """``x + h`` of two inputs, as the seeds' demo compiler takes it: inputs of different sizes fail at execute."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return x + h


#: Each rejection variant and the model of its accepted operators (None: it has none).
REJECTION_PROBES: dict[str, tuple[type[nn.Module], type[nn.Module] | None]] = {
    "TsMysteryAfterRelu": (TsMysteryAfterRelu, TsRelu),
    "TsMysteryAfterSub": (TsMysteryAfterSub, TsSub),
    "TsMysteryAlone": (TsMysteryAlone, None),
}
PROBE_MODELS: dict[str, type[nn.Module]] = {"TsScale": TsScale, "TsAddPair": TsAddPair}


def probe_model(name: str) -> nn.Module:
    """A probe model by its name in ``suite.toml`` (a fixed table: nothing is looked up by attribute)."""
    if name in REJECTION_PROBES:
        register_probe_op()
        return REJECTION_PROBES[name][0]().eval()
    return PROBE_MODELS[name]().eval()


def accepted_part(name: str) -> nn.Module | None:
    """The model of what rejection variant ``name`` computes before the mystery op; None if nothing."""
    part = REJECTION_PROBES[name][1]
    return None if part is None else part().eval()
