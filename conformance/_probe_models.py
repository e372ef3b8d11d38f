"""Models calling ``backendconf_probe::mystery``, a custom op no backend can know.

The symbolication checks lower them to prove that a backend rejects an
unknown op at ``preprocess`` with a text that points here, at the call. They
live in a real source file so that the expected file, line and columns can
be read back from it (``suite.toml`` names the expressions, never line
numbers).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

OP_NAME = "backendconf_probe::mystery"

_lock = threading.Lock()


def register_probe_op() -> None:
    """Define the probe op once per process.

    Idempotent: pytester's in-process runs re-import this module, and
    defining the same op twice is an error in ``torch.library``.
    """
    with _lock:
        if _probe_op_defined():
            return

        @torch.library.custom_op(OP_NAME, mutates_args=())
        def mystery(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @mystery.register_fake
        def _(x: torch.Tensor) -> torch.Tensor:
            # torch.export traces with fake tensors: only the output's metadata matters.
            return torch.empty_like(x)


def _probe_op_defined() -> bool:
    try:
        _ = torch.ops.backendconf_probe.mystery.default  # raises until the op is defined
    except (AttributeError, RuntimeError):
        return False
    return True


register_probe_op()


class Mystery(nn.Module):
    """The probe op between two ops every backend knows."""

    def forward(self, x):
        y = x + 1
        return torch.ops.backendconf_probe.mystery(y) * 2


class Inner(nn.Module):
    def forward(self, x):
        return torch.ops.backendconf_probe.mystery(x - 1)


class Middle(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x) + 1


class Outer(nn.Module):
    """The probe op two submodules down: the module hierarchy must name both."""

    def __init__(self):
        super().__init__()
        self.middle = Middle()

    def forward(self, x):
        return self.middle(x) * 2


def _mystery_branch(x):
    return torch.ops.backendconf_probe.mystery(x) + 1


def _plain_branch(x):
    return x - 1


class MysteryInCond(nn.Module):
    """The probe op inside a ``torch.cond`` branch: a node of a nested subgraph."""

    def forward(self, x):
        return torch.cond(x.sum() > 0, _mystery_branch, _plain_branch, (x,))
