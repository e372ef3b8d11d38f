"""The helpers a backend's own code uses (`pytest_backendconf.vendor`): their checks and error texts.

Real programs from torch.export, not stand-ins: each rejection names the
node, the key or the argument, and what to do instead.
"""

from __future__ import annotations

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.backend import FAULT_KEY

KNOWN = (FAULT_KEY, "precision")


def test_the_facade_exports_the_helpers_lazily() -> None:
    from pytest_backendconf import vendor

    assert bc.check_compile_spec_keys is vendor.check_compile_spec_keys
    assert bc.check_functional_signature is vendor.check_functional_signature
    assert bc.AvailabilityProbe is vendor.AvailabilityProbe


def test_a_known_spec_comes_back_and_none_is_empty() -> None:
    spec = {"precision": "f16"}
    assert bc.check_compile_spec_keys(spec, KNOWN, "mybackend") is spec
    assert bc.check_compile_spec_keys(None, KNOWN, "mybackend") == {}


def test_an_unknown_key_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError) as raised:
        bc.check_compile_spec_keys({"precison": "f16", "zz": 1}, KNOWN, "mybackend")
    assert str(raised.value) == (
        "unknown compile-spec key 'precison' for the mybackend backend; known keys: '__backendconf_fault__', 'precision'"
    )


def test_a_spec_that_is_not_a_dict_is_named_by_its_type() -> None:
    with pytest.raises(ValueError, match=r"^the mybackend backend's compile spec must be a dict, not list$"):
        bc.check_compile_spec_keys(["precision"], KNOWN, "mybackend")


class _Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(1)
        return x * 2


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_a_functional_program_passes() -> None:
    program = torch.export.export(_Double(), (torch.ones(2),))
    bc.check_functional_signature(program, "mybackend", engine="MyEngine", dtypes={"float32"})


def test_a_buffer_updated_in_place_is_rejected_at_its_node() -> None:
    # Decomposed, the in-place add_ becomes an add whose result the signature writes back to the buffer.
    program = torch.export.export(_Counter(), (torch.ones(2),)).run_decompositions()
    with pytest.raises(bc.UnsupportedNodeError) as raised:
        bc.check_functional_signature(program, "mybackend", engine="MyEngine")
    assert raised.value.rejections[0].reason == (
        "the program updates 'seen' in place (BUFFER_MUTATION); the mybackend backend runs functional "
        "programs only (export in eval mode)"
    )
    assert raised.value.rejections[0].node.name == "add"


def test_a_dtype_outside_the_declared_ones_is_rejected_by_name() -> None:
    program = torch.export.export(_Double(), (torch.ones(2, dtype=torch.float64),))
    with pytest.raises(bc.UnsupportedNodeError) as raised:
        bc.check_functional_signature(program, "mybackend", engine="MyEngine", dtypes={"float32"})
    assert raised.value.rejections[0].reason == "dtype torch.float64 is not supported by the mybackend backend"
    # Without ``dtypes`` any dtype passes.
    bc.check_functional_signature(program, "mybackend", engine="MyEngine")


def test_the_availability_probe_runs_once() -> None:
    calls = []

    def probe() -> str:
        calls.append(1)
        return "MyEngine cannot be imported; pip install myengine"

    availability = bc.AvailabilityProbe(probe)
    assert calls == []  # not at construction: the plugin's import stays cheap
    assert availability.reason() == "MyEngine cannot be imported; pip install myengine"
    assert availability.reason() == "MyEngine cannot be imported; pip install myengine"
    assert calls == [1]
    assert bc.AvailabilityProbe(lambda: "").reason() == ""


class _CacheWrites(torch.nn.Module):
    """A KV cache written as a decoder writes it (``index_copy``), and the same by indexing (``index_put``)."""

    def forward(self, cache: torch.Tensor, position: torch.Tensor, row: torch.Tensor, mask: torch.Tensor):
        by_copy = cache.index_copy(0, position, row)
        by_put = cache.clone()
        by_put[position] = row
        masked = cache.clone()
        masked[mask] = row
        return by_copy, by_put, masked


def _cache_writes() -> torch.fx.GraphModule:
    args = (torch.zeros(4, 3), torch.tensor([1]), torch.ones(1, 3), torch.zeros(4, dtype=torch.bool))
    return torch.export.export(_CacheWrites(), args).graph_module


def test_scatter_indices_past_the_end_are_clamped_and_others_kept() -> None:
    from pytest_backendconf.vendor import clamp_scatter_indices

    module = _cache_writes()
    targets = {n.target for n in module.graph.nodes if n.op == "call_function"}
    assert {torch.ops.aten.index_copy.default, torch.ops.aten.index_put_.default} <= targets
    # One index_copy and two index_put positions; the boolean mask is not a position and stays as it is.
    assert clamp_scatter_indices(module) == 2
    cache, row = torch.zeros(4, 3), torch.ones(1, 3)
    mask = torch.tensor([True, False, False, True])
    for position in (torch.tensor([2]), torch.tensor([-1])):
        by_copy, by_put, masked = module(cache, position, row, mask)
        if position.item() >= 0:  # index_copy takes no negative index
            assert torch.equal(by_copy, cache.index_copy(0, position, row))
        expected = cache.clone()
        expected[position] = row
        assert torch.equal(by_put, expected)  # a negative index keeps its meaning
        assert torch.equal(masked, torch.where(mask[:, None], row, cache))
    # Past the end (eager raises IndexError): the write lands on the last row, inside the tensor.
    by_copy, by_put, _ = module(cache, torch.tensor([4]), row, mask)
    last = cache.index_copy(0, torch.tensor([3]), row)
    assert torch.equal(by_copy, last) and torch.equal(by_put, last)
    # Each clamp carries the scatter's own source line.
    clamps = [n for n in module.graph.nodes if n.target is torch.ops.aten.clamp.default]
    assert all(c.meta.get("stack_trace") == next(iter(c.users)).meta.get("stack_trace") for c in clamps)
