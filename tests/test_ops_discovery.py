"""Discovery's batched confirmation: many samples exported and decomposed as one program.

Each sample is a real call exported with torch.export; the batch's verdicts
must be those of confirming each sample on its own.
"""

from __future__ import annotations

import types

import pytest
import torch

from pytest_backendconf.conformance.ops import discovery

aten = torch.ops.aten


def _item(fn, *tensors, expected):
    sample = types.SimpleNamespace(input=tensors[0], args=tensors[1:], kwargs={})
    return (lambda inp, *args: fn(inp, *args)), sample, expected


def _items():
    x, y = torch.rand(3, 4) + 0.1, torch.rand(3, 4)
    return [
        _item(torch.sub, x, y, expected=aten.sub.Tensor),  # one op, nothing to decompose
        _item(torch.nn.functional.silu, x, expected=aten.silu.default),  # decomposes into several ops
        _item(lambda t: torch.max(t, dim=1), x, expected=aten.max.dim),  # one op, two outputs (getitem)
        _item(torch.addcmul, x, y, y, expected=aten.addcmul.default),  # decomposes into several ops
        _item(torch.frac, x, expected=aten.frac.default),
        # exported as aten.softmax.int, which its default decomposition makes the one op aten._softmax
        _item(lambda t: torch.softmax(t, 0), x, expected=aten._softmax.default),
    ]


@pytest.mark.slow
def test_a_batch_confirms_what_each_sample_confirms_alone():
    items = _items()
    alone = [discovery.confirm(fn, sample, expected, {}) for fn, sample, expected in items]
    # No decomposition asked: each is one op as exported, softmax as aten.softmax.int, not the _softmax expected.
    assert alone == [True, True, True, True, True, False]
    decompositions = torch.export.default_decompositions()
    alone = [discovery.confirm(fn, sample, expected, decompositions) for fn, sample, expected in items]
    assert alone == [True, False, True, False, False, True]
    assert discovery.confirm_batch(items) == alone


def test_a_sample_whose_export_fails_is_refuted_and_the_rest_still_judged():
    def fails(t):
        raise RuntimeError("this call cannot be exported")

    items = _items()
    items.insert(2, _item(fails, torch.rand(2), expected=aten.sin.default))
    assert discovery.confirm_batch(items) == [True, False, False, True, False, False, True]
    assert discovery.confirm_batch([]) == []
