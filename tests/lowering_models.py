"""Models for the lowering tests; their source lines appear in the asserted texts."""

import torch


# The nested trio and the small CNN are the zoo's own (one definition for
# the suite, the docs and these tests).
from pytest_backendconf.conformance.zoo import L, M, N, SmallCNN  # noqa: F401


class Outputs(torch.nn.Module):
    """One method per output structure, and keyword arguments with defaults."""

    def forward(self, x, y):
        return x + y, x * y

    def single(self, x):
        return (x.relu(),)

    def as_dict(self, x, *, scale: float = 2.0):
        return {"scaled": x * scale, "pair": (x - 1, x.sigmoid())}

    def double(self, x):
        return x * 2


class Branchy(torch.nn.Module):
    def forward(self, x):
        def positive(x):
            return x.sin() * 2

        def negative(x):
            return x.cos() - 1

        return torch.cond(x.sum() > 0, positive, negative, (x,))


class Unsupported(torch.nn.Module):
    def forward(self, x):
        h = x.relu()
        return torch.logit(h) + 1


class InPlaceActivation(torch.nn.Module):
    """In-place ops on intermediates are not state mutations and lower fine."""

    def __init__(self):
        super().__init__()
        self.act = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(x * 2)
