"""The reference compiler stores ``x op number`` as ``x op tensor(number)`` only where the result
is the number's to the bit (pytest_backendconf/reference/compiler.py, ``_scalar_as_tensor``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pytest_backendconf as bc
from pytest_backendconf.reference import bytecode


class Scaled(nn.Module):
    """``x <op> number`` for each (op, number) pair, one output each."""

    def __init__(self, pairs: list[tuple[str, float | int]]) -> None:
        super().__init__()
        self.pairs = pairs

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = []
        for op, number in self.pairs:
            if op == "add":
                out.append(x + number)
            elif op == "sub":
                out.append(x - number)
            elif op == "mul":
                out.append(x * number)
            else:
                out.append(x / number)
        return tuple(out)


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        x = torch.randn(6, 7, generator=gen, dtype=torch.float64) * 100
        x[0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
        return x.to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (6, 7), generator=gen, dtype=dtype)


def _lower(pairs: list[tuple[str, float | int]], dtype: torch.dtype):
    model = Scaled(pairs)
    return model, bc.to_backend(model, "reference", {"forward": {}}, example_inputs=(_inputs(dtype),))


def _scalar_constants(lowered) -> list[torch.Tensor]:
    blob = lowered.lowered.blobs["forward"]
    return [c for c in bytecode.decode(blob).constants if isinstance(c, torch.Tensor) and c.dim() == 0]


DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int8, torch.int64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_results_are_eager_to_the_bit(dtype: torch.dtype) -> None:
    numbers = (1.0, 0.5, -2.0, 0.1, 3e38) if dtype.is_floating_point else (1, 3, -7, 1000)
    pairs = [(op, number) for op in ("add", "sub", "mul", "div") for number in numbers]
    model, lowered = _lower(pairs, dtype)
    x = _inputs(dtype)
    for pair, expected, got in zip(pairs, model(x), lowered(x), strict=True):
        assert got.dtype == expected.dtype, pair
        assert torch.equal(_bits(got), _bits(expected)), pair


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns: equal NaNs, and -0.0 apart from 0.0."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize(
    ("op", "number", "dtype", "stored"),
    [
        ("add", 1.0, torch.float32, True),  # exact in float32
        ("mul", 0.5, torch.float16, True),
        ("mul", 0.1, torch.float32, False),  # not exact in float32: the number stays
        ("mul", 0.1, torch.float64, True),  # a Python float is a float64
        ("add", 3e38, torch.float16, False),  # out of float16's range
        ("add", 1000, torch.int8, False),  # out of int8's range
        ("add", 3, torch.int32, True),
        ("div", 3, torch.int32, False),  # int / int is a float: the dtype changes
        ("add", 1.5, torch.int32, False),  # float number, integer tensor: promotes
    ],
)
def test_which_numbers_become_tensors(op, number, dtype, stored) -> None:
    _, lowered = _lower([(op, number)], dtype)
    constants = _scalar_constants(lowered)
    if stored:
        (constant,) = constants
        assert constant.dtype == dtype and constant.item() == number
    else:
        assert constants == []
