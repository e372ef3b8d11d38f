"""The model zoo's code: small modules that together cover the reference backend's op set.

Which inputs each model takes, its dtypes, tags and ops are data, in
``models.toml``; `build` makes a model with the same weights on every call.
"""

from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import nn


def build(cls: type[nn.Module]) -> nn.Module:
    """A fresh ``cls()`` in eval mode, with weights seeded by the class name.

    The global RNG is forked, so building a model never changes the random
    stream of the code around it, and two builds give the same weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(cls.__name__.encode()))
        return cls().eval()


def _randomize_batch_norm(bn: nn.BatchNorm2d, seed: int) -> nn.BatchNorm2d:
    # Fresh running stats (mean 0, var 1) and affine (1, 0) make batch norm an
    # identity, which would hide a backend that ignores them.
    generator = torch.Generator().manual_seed(seed)
    n = bn.num_features
    assert bn.running_mean is not None and bn.running_var is not None  # track_running_stats, the default
    with torch.no_grad():
        bn.running_mean.copy_(torch.rand(n, generator=generator) - 0.5)
        bn.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
        bn.weight.copy_(torch.rand(n, generator=generator) + 0.5)
        bn.bias.copy_(torch.rand(n, generator=generator) - 0.5)
    return bn


# --- elementwise -------------------------------------------------------------------


class ArithmeticTensors(nn.Module):
    """Add, subtract, multiply and divide two tensors."""

    def forward(self, x, y):
        return (x + y) * (x - y) / y


class ArithmeticScalars(nn.Module):
    """Arithmetic between a tensor and Python scalars, on both sides."""

    def forward(self, x):
        return (x + 2.0) * 3.0 - (1.5 - x) / 4.0 + x**2


class CompareWhere(nn.Module):
    """Comparisons of two tensors and of a tensor with a scalar, feeding where."""

    def forward(self, x, y):
        both = (x > y) & (x >= 0.0) | (x < -0.5) & (y <= 0.5)
        other = (x == y) | (x != 0.25)
        return torch.where(both, x, y), other, torch.where(x.ne(y), x * 2.0, y)


class LogicalOps(nn.Module):
    """Logical and bitwise ops on two bool tensors."""

    def forward(self, a, b):
        return (
            torch.logical_and(a, b),
            torch.logical_or(a, b),
            torch.logical_xor(a, b),
            torch.logical_not(a),
            (a & ~b) | b,
        )


class SmoothActivations(nn.Module):
    """The smooth activations: gelu, silu, sigmoid, tanh, elu and softplus."""

    def forward(self, x):
        return F.gelu(x) + F.silu(x) + torch.sigmoid(x) * torch.tanh(x) - F.elu(x) + F.softplus(x)


class PiecewiseActivations(nn.Module):
    """The piecewise-linear activations: relu, hardtanh and leaky_relu."""

    def forward(self, x):
        return torch.relu(x), F.hardtanh(x, -0.5, 0.5), F.leaky_relu(x, 0.1)


class Trigonometry(nn.Module):
    """Sine and cosine."""

    def forward(self, x):
        return torch.sin(x) * torch.cos(x * 2.0)


class ExpLog(nn.Module):
    """Exp, log, sqrt and rsqrt of a positive input."""

    def forward(self, x):
        return torch.exp(x) + torch.log(x) - torch.sqrt(x) * torch.rsqrt(x + 1.0)


class AbsNegPow(nn.Module):
    """Abs, neg and pow with a tensor exponent."""

    def forward(self, x, y):
        return torch.pow(torch.abs(x) + 0.5, y), -x


class ClampMaxMin(nn.Module):
    """Clamp between scalars, and the elementwise maximum and minimum of two tensors."""

    def forward(self, x, y):
        return torch.clamp(x, -0.5, 0.5) + torch.maximum(x, y) - torch.minimum(x, y)


# --- reductions ---------------------------------------------------------------------


class Reductions(nn.Module):
    """Sum, mean, amax, amin and argmax, over all and over one dimension."""

    def forward(self, x):
        return (
            x.sum(),
            x.sum(dim=1),
            x.mean(dim=-1, keepdim=True),
            x.amax(dim=0),
            x.amin(dim=1),
            x.argmax(dim=1),
        )


# --- linear algebra -----------------------------------------------------------------


class MatrixProducts(nn.Module):
    """Matmul, mm and bmm."""

    def forward(self, a, b, c):
        return torch.matmul(a, b), torch.mm(a, b), torch.bmm(c, c.transpose(1, 2))


class Linear(nn.Module):
    """A linear layer with bias."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(x)


class Addmm(nn.Module):
    """addmm: a bias plus a matrix product, scaled."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 5))
        self.bias = nn.Parameter(torch.randn(5))

    def forward(self, x):
        return torch.addmm(self.bias, x, self.weight, beta=0.5, alpha=2.0)


# --- convolution and pooling --------------------------------------------------------


class Conv2dStridePadding(nn.Module):
    """A conv2d with bias, stride 2 and padding 1."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


class Conv2dNoBias(nn.Module):
    """A conv2d without bias, rectangular kernel, no padding."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, kernel_size=(3, 2), bias=False)

    def forward(self, x):
        return self.conv(x)


class Pools(nn.Module):
    """max_pool2d, with and without indices, avg_pool2d and adaptive_avg_pool2d."""

    def forward(self, x):
        return (
            F.max_pool2d(x, kernel_size=2),
            *F.max_pool2d(x, kernel_size=3, stride=2, padding=1, return_indices=True),
            F.avg_pool2d(x, kernel_size=3, stride=1, padding=1),
            F.adaptive_avg_pool2d(x, (2, 2)),
        )


# --- normalization ------------------------------------------------------------------


class Softmaxes(nn.Module):
    """softmax and log_softmax over different dimensions."""

    def forward(self, x):
        return torch.softmax(x, dim=-1), torch.log_softmax(x, dim=0)


class LayerNorm(nn.Module):
    """layer_norm with learned affine parameters."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(x)


class BatchNormEval(nn.Module):
    """batch_norm in eval mode, from non-trivial running statistics."""

    def __init__(self):
        super().__init__()
        self.bn = _randomize_batch_norm(nn.BatchNorm2d(3), seed=101)

    def forward(self, x):
        return self.bn(x)


# --- shapes -------------------------------------------------------------------------


class ViewReshapeFlatten(nn.Module):
    """view, reshape and flatten."""

    def forward(self, x):
        return x.view(4, 6) * 2.0, x.reshape(2, 12), torch.flatten(x, 1)


class PermuteTranspose(nn.Module):
    """permute and transpose."""

    def forward(self, x):
        return x.permute(2, 0, 1) + 1.0, x.transpose(0, 1) * 2.0


class CatStack(nn.Module):
    """cat along a dimension, and stack into a new one."""

    def forward(self, x, y):
        return torch.cat([x, y, x], dim=1), torch.stack([x, y], dim=0)


class SliceSelect(nn.Module):
    """Slices with start, end and step, and selecting an index."""

    def forward(self, x):
        return x[:, 1:3] + x[:, ::2][:, :2], x[0], x[..., -1]


class SqueezeUnsqueezeExpand(nn.Module):
    """squeeze, unsqueeze and expand."""

    def forward(self, x):
        column = x.squeeze(1).unsqueeze(-1)
        return column.expand(4, 5) + 1.0, x.squeeze()


# --- dtypes -------------------------------------------------------------------------


class DtypeCasts(nn.Module):
    """Casts between the float dtype under test, int64 and bool."""

    def forward(self, x, i):
        as_int = x.to(torch.int64) + i
        as_float = i.to(x.dtype) * x
        return as_int, as_float, (x > 0).to(torch.int64), x.float()


class IntegerArithmetic(nn.Module):
    """int64 arithmetic: add, mul, floor division, remainder, sum and comparison."""

    def forward(self, a, b):
        return a + b * 3, torch.div(a, 7, rounding_mode="floor"), torch.remainder(a, 5), a.sum(dim=0), a > b


class BoolMask(nn.Module):
    """A bool mask selecting from a float tensor, filling with a scalar or a 0-d tensor, and counted."""

    def forward(self, x, mask):
        return torch.where(mask, x, -x), x.masked_fill(mask, 0.0), x.masked_fill(~mask, x.amax()), mask.sum()


# --- structure ----------------------------------------------------------------------


class L(nn.Module):
    """Innermost of the nested trio: multiplies by 5."""

    def forward(self, x):
        return x * 5


class M(nn.Module):
    """Middle of the nested trio: calls L, subtracts 2."""

    def __init__(self):
        super().__init__()
        self.l = L()

    def forward(self, x):
        return self.l(x) - 2


class N(nn.Module):
    """Outermost of the nested trio: calls M, adds 3."""

    def __init__(self):
        super().__init__()
        self.m = M()

    def forward(self, x):
        return self.m(x) + 3


class SmallCNN(nn.Module):
    """conv2d, batch_norm, relu, max_pool2d, flatten and a linear classifier."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel_size=3, padding=1)
        self.bn = _randomize_batch_norm(nn.BatchNorm2d(4), seed=202)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


class MLP(nn.Module):
    """Two hidden linear layers with relu and gelu."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(torch.relu(self.fc1(x)))))


class TinyAttention(nn.Module):
    """Single-head self-attention: projections, scaled scores, softmax, weighted sum."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).split(8, dim=-1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (8**-0.5)
        return self.out(torch.matmul(torch.softmax(scores, dim=-1), v))


class MultiheadSelfAttention(nn.Module):
    """torch.nn.MultiheadAttention as transformers use it: heads split with unflatten, fused attention."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, num_heads=2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


class ResidualBlock(nn.Module):
    """Two conv-batch_norm stages with a skip connection."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, kernel_size=3, padding=1, bias=False)
        self.bn1 = _randomize_batch_norm(nn.BatchNorm2d(4), seed=303)
        self.conv2 = nn.Conv2d(4, 4, kernel_size=3, padding=1, bias=False)
        self.bn2 = _randomize_batch_norm(nn.BatchNorm2d(4), seed=304)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def _when_positive(x):
    return torch.cos(x) * 2.0


def _when_not_positive(x):
    return torch.sin(x) - 1.0


class CondOnSign(nn.Module):
    """torch.cond on the sign of the input's sum: either branch runs, depending on the input."""

    def forward(self, x):
        return torch.cond(x.sum() > 0, _when_positive, _when_not_positive, (x,))


class EncodeForward(nn.Module):
    """Two methods sharing weights: encode, and forward which decodes the encoding."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(8, 4)
        self.decoder = nn.Linear(4, 8)

    def encode(self, x):
        return torch.tanh(self.encoder(x))

    def forward(self, x):
        return self.decoder(self.encode(x))


class EncoderDecoder(nn.Module):
    """Two methods, encode and decode, and no forward to lower."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(6, 3)
        self.decoder = nn.Linear(3, 6)

    def encode(self, x):
        return torch.relu(self.encoder(x))

    def decode(self, z):
        return torch.sigmoid(self.decoder(z))

    def forward(self, x):
        return self.decode(self.encode(x))


class TupleOutput(nn.Module):
    """Returns a tuple of three tensors."""

    def forward(self, x):
        return x + 1.0, x * 2.0, x.sum(dim=0)


class SingleTupleOutput(nn.Module):
    """Returns a tuple of one tensor."""

    def forward(self, x):
        return (torch.relu(x),)


class DictOutput(nn.Module):
    """Returns a dict of tensors, keys not in sorted order."""

    def forward(self, x):
        return {"scores": torch.softmax(x, dim=-1), "logits": x * 2.0, "argmax": x.argmax(dim=-1)}


class NestedOutput(nn.Module):
    """Returns a dict holding a tuple and a list of tensors."""

    def forward(self, x, y):
        return {"pair": (x + y, x - y), "items": [x * y, torch.relu(x)], "total": (x + y).sum()}


class KeywordScale(nn.Module):
    """Keyword-only arguments with defaults, baked into the program at export."""

    def forward(self, x, *, scale: float = 2.0, shift: float = 0.5):
        return x * scale + shift


class ScalarArgument(nn.Module):
    """A Python int as a positional input, baked into the program at export."""

    def forward(self, x, k: int):
        return x * k + k


class MultipleInputs(nn.Module):
    """Three tensor inputs of different shapes, broadcast together."""

    def forward(self, x, y, z):
        return x * y + z, torch.matmul(x, z.transpose(0, 1))


# --- the rest of the reference op set ------------------------------------------------


class MoreElementwise(nn.Module):
    """relu6, hardswish, hardsigmoid, erf, reciprocal and square."""

    def forward(self, x):
        gates = F.relu6(x * 4.0) + F.hardswish(x) * F.hardsigmoid(x) + torch.erf(x)
        return gates, torch.reciprocal(x.abs() + 0.5) + torch.square(x)


class Statistics(nn.Module):
    """var, std, cumsum, max and min over a dimension, and argmin."""

    def forward(self, x):
        values, indices = x.max(dim=1)
        return x.var(dim=1), x.std(), torch.cumsum(x, dim=0), values, indices, x.min(dim=0).values, x.argmin(dim=1)


class CausalMask(nn.Module):
    """A causal attention mask from triu, tril, arange and the *_like constructors."""

    def forward(self, scores):
        n = scores.shape[-1]
        upper = torch.triu(torch.ones_like(scores), diagonal=1).to(torch.bool)
        masked = scores.masked_fill(upper, float("-inf"))
        positions = torch.arange(n, dtype=scores.dtype)
        constant = torch.zeros_like(scores) + torch.full_like(scores, 0.5)
        return torch.softmax(masked, dim=-1) + torch.tril(scores) * positions + constant


class Embedding(nn.Module):
    """An embedding lookup from int64 indices, and index_select of its rows."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)

    def forward(self, indices):
        table = self.embedding(indices)
        return table, torch.index_select(self.embedding.weight, 0, indices[0])


class SplitChunk(nn.Module):
    """chunk, unbind, repeat, t, contiguous and clone."""

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        first, *_ = x.unbind(0)
        return (a * b).repeat(2, 1), x.t().contiguous() + 1.0, first.clone()


class Conv1dGroupNorm(nn.Module):
    """conv1d followed by group_norm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, kernel_size=3, padding=1)
        self.norm = nn.GroupNorm(2, 4)

    def forward(self, x):
        return self.norm(self.conv(x))


class Rounding(nn.Module):
    """floor, ceil, round, sign, expm1 and log1p."""

    def forward(self, x):
        return torch.floor(x) + torch.ceil(x) * torch.round(x * 4.0), torch.sign(x) * torch.expm1(x) + torch.log1p(x)


class TensorBounds(nn.Module):
    """Tensor-tensor comparisons, clamp between tensors, a scalar to a tensor power, and rsub."""

    def forward(self, x, low, high):
        inside = (x >= low) & (x <= high) | (x < low).logical_not() & x.eq(0.5)
        return torch.clamp(x, low, high), inside, torch.pow(2.0, x), torch.rsub(x, low)


class IntegerDivision(nn.Module):
    """int64 floor division, remainder by a tensor, and bitwise and/or."""

    def forward(self, a, b):
        return torch.floor_divide(a, b), torch.remainder(a, b), torch.bitwise_and(a, b), torch.bitwise_or(a, b)


class Constructors(nn.Module):
    """zeros, ones, full, arange with start and step, new_zeros and new_ones."""

    def forward(self, x):
        rows = torch.arange(1, 4, dtype=x.dtype).unsqueeze(1)
        columns = torch.arange(0, 8, 2, dtype=x.dtype)
        base = torch.zeros(3, 4, dtype=x.dtype) + torch.ones(3, 4, dtype=x.dtype)
        base = base + torch.full((3, 4), 0.25, dtype=x.dtype)
        return x * base + rows * columns, x.new_zeros(2) + x.new_ones(2)


class WholeTensorReductions(nn.Module):
    """mean, max, min and var over the whole tensor, std over a dimension, split and squeeze of several dims."""

    def forward(self, x):
        first, rest = torch.split(x, [1, 3], dim=0)
        return x.mean() + x.max() - x.min() + x.var(), x.std(dim=-1), first.squeeze((0, 1)), rest


class DropoutEval(nn.Module):
    """Dropout in eval mode, an identity the backend must keep as one."""

    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.5)

    def forward(self, x):
        return self.dropout(x * 2.0) + F.dropout(x, 0.25, training=self.training)


# --- the seeds' own models (the TorchScript form's zoo, torchscript_models.toml) ----------------
# Made of aten::add and aten::sub only, on one-element inputs, as the seeds'
# tests lower them to PyTorch's demo compiler: a backend that compiles those
# two operators runs the TorchScript form's checks on these.


class BasicModule(nn.Module):
    """The seeds' BasicModule: ``x + h`` with its alpha as a constant of the graph."""

    __constants__ = ["alpha"]  # TorchScript inlines it: aten::add(x, h, 1)

    def __init__(self):
        super().__init__()
        self.alpha = 1

    def forward(self, x, h):
        return torch.add(x, h, alpha=self.alpha)


class SeedL(nn.Module):
    """Innermost of the seeds' nested trio in add/sub form: ``x - h``."""

    def forward(self, x, h):
        return x - h


class SeedM(nn.Module):
    """Middle of the seeds' nested trio: calls SeedL."""

    def __init__(self):
        super().__init__()
        self.l = SeedL()

    def forward(self, x, h):
        return self.l(x, h)


class SeedN(nn.Module):
    """Outermost of the seeds' nested trio: calls SeedM (the module hierarchy top.m.l of seed 000)."""

    def __init__(self):
        super().__init__()
        self.m = SeedM()

    def forward(self, x, h):
        return self.m(x, h)


class AccumSubAccum(nn.Module):
    """The seeds' two methods: ``forward`` adds (``accum``), ``sub_accum`` subtracts."""

    def forward(self, x, h):
        return x + h

    @torch.jit.export
    def sub_accum(self, x, h):
        return x - h
