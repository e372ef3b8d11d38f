"""The models the benchmarks time: small and larger graphs, and the chain of N nodes for scaling.

Weights are seeded, so every run times the same programs.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallMLP(nn.Module):
    """Two linear layers and a ReLU on a [4, 16] batch: a few kernels, each cheap."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


class Elementwise(nn.Module):
    """Six elementwise ops on two [4, 5] tensors: per-op overhead dominates."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x * y + 1.0
        b = torch.sigmoid(a) - x
        return torch.relu(b) * 0.5


class SmallCNN(nn.Module):
    """Conv, ReLU, pool and a linear head on one 3×16×16 image."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.head(torch.flatten(x, 1))


class DictOutput(nn.Module):
    """Two inputs, a dict of two outputs: the call path that rebuilds a pytree."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": x + y, "prod": x * y}


class WideMLP(nn.Module):
    """Three 1024-wide linear layers on a [64, 512] batch: kernel time dominates."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(512, 1024)
        self.l2 = nn.Linear(1024, 1024)
        self.l3 = nn.Linear(1024, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class ConvNet(nn.Module):
    """Two convolutions, pooling and a head on a batch of eight 3×64×64 images."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.relu(self.c2(x))
        return self.head(x.mean(dim=(2, 3)))


class ChainBlock(nn.Module):
    """A small linear layer, a ReLU and a scale: five graph nodes (two are its parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 0.5


class Chain(nn.Module):
    """``n_nodes // 5`` chained blocks: a graph of about ``n_nodes`` nodes, one module per block.

    Like a deep network of repeated layers: the source lines repeat, the
    module hierarchy (``blocks.0``, ``blocks.1``, …) does not.
    """

    NODES_PER_BLOCK = 5

    def __init__(self, n_nodes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ChainBlock() for _ in range(max(1, n_nodes // self.NODES_PER_BLOCK)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def seeded(cls: type[nn.Module], *args: object) -> nn.Module:
    """An instance of ``cls`` in eval mode with weights seeded by the class name."""
    torch.manual_seed(sum(map(ord, cls.__name__)))
    return cls(*args).eval()


def example(*shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Seeded float32 inputs of the given shapes."""
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(shape, generator=generator) for shape in shapes)


#: name -> (model class, input shapes): the graphs of the call-time figures.
SMALL = {
    "small_mlp": (SmallMLP, [(4, 16)]),
    "elementwise": (Elementwise, [(4, 5), (4, 5)]),
    "small_cnn": (SmallCNN, [(1, 3, 16, 16)]),
}
LARGE = {
    "wide_mlp": (WideMLP, [(64, 512)]),
    "conv_net": (ConvNet, [(8, 3, 64, 64)]),
}


class ThreeParts(nn.Module):
    """Elementwise ops split by two subtractions: lowered to a backend without sub, three
    partitions and two fallback segments (four partition boundaries)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = (x * 2.0).relu()
        b = a - 1.0
        c = (b * b).sigmoid()
        d = c - x
        return d.exp() + 1.0
