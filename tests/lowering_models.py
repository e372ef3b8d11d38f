"""Models for the lowering tests; their source lines appear in the asserted texts."""

import torch


class L(torch.nn.Module):
    def forward(self, x):
        return x * 5


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = L()

    def forward(self, x):
        return self.l(x) - 2


class N(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = M()

    def forward(self, x):
        return self.m(x) + 3


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(y.flatten(1))


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
        return torch.special.erfcx(h) + 1


class InPlaceActivation(torch.nn.Module):
    """In-place ops on intermediates are not state mutations and lower fine."""

    def __init__(self):
        super().__init__()
        self.act = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(x * 2)
