"""Models used by the walkthrough and the docs: the nested N/M/L model and a small CNN."""

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

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(y.flatten(1))
