"""What the engines' own test files (test_iree_backend.py, test_openvino_backend.py, ...) set up alike.

A program ready for ``preprocess``, the line of a marked source line in a
test module, a fresh interpreter that imports an engine's target side
and reports which of its host-only modules came along, and the KV-cache
write past its end that an engine without bounds checks must clamp.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import torch

import pytest_backendconf as bc
from pytest_backendconf.debuginfo import DebugHandleRecorder
from pytest_backendconf.lowering import export_method


def prepared(module, args, spec=None):
    """``(program, spec, debug handles)`` of ``module.forward`` exported at ``args``: preprocess's arguments."""
    program = export_method(module, "forward", args, {})
    handles = DebugHandleRecorder().assign(program.graph_module)
    return program, spec or {}, handles


def line_of(module_name: str, marker: str) -> int:
    """The line of module ``module_name`` that ends with ``# <marker>``."""
    lines = inspect.getsource(sys.modules[module_name]).splitlines()
    return next(i for i, text in enumerate(lines, start=1) if text.endswith(f"# {marker}"))


def host_only_imports(package: str, backend: str, setup: str = "") -> subprocess.CompletedProcess:
    """A fresh interpreter importing ``package``, its plugin and its runtime (then running ``setup``); its last
    line of output is the JSON list of the ``backend`` class's host-only modules that were imported."""
    code = textwrap.dedent(
        f"""
        import json, sys
        import {package}, {package}.plugin, {package}.runtime
        {setup}
        host = {package}.{backend}.capabilities.host_only_modules
        print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in host))))
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


class CacheWrite(torch.nn.Module):
    def forward(self, cache, position, row):
        return cache.index_copy(0, position, row)


def assert_cache_write_past_the_end_is_clamped(backend: str) -> None:
    """Lowered to ``backend``, a write into a 4-row cache at position 2 is eager's, and one at position 4
    (eager raises IndexError) lands on the last row: inside the buffer."""
    cache, row = torch.zeros(4, 3), torch.ones(1, 3)
    lowered = bc.to_backend(CacheWrite(), backend, {"forward": {}}, example_inputs=(cache, torch.tensor([1]), row))
    assert torch.equal(lowered(cache, torch.tensor([2]), row), cache.index_copy(0, torch.tensor([2]), row))
    assert torch.equal(lowered(cache, torch.tensor([4]), row), cache.index_copy(0, torch.tensor([3]), row))
