"""Backends that get dynamic shapes wrong, each the reference backend with one defect.

Both pass every static check: they only go wrong once one lowered module
is called with a second shape, which is what the dynamic-shape checks do.
"""

from __future__ import annotations

import json
import struct

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc


class FirstShapeBuffers(ReferenceBackend):
    """Allocates each method's output buffers at its first call and reuses them.

    Later results are written into those buffers, cropped to fit: right for
    every call at the first call's shapes, wrong for any other.
    """

    name = "first_shape_buffers"

    def __init__(self) -> None:
        self.buffers: dict[int, list] = {}

    def execute(self, handle, inputs):
        outputs = super().execute(handle, inputs)
        buffers = self.buffers.setdefault(
            id(handle), [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]
        )
        for buffer, out in zip(buffers, outputs):
            if isinstance(buffer, torch.Tensor) and buffer.dim() == out.dim():
                region = tuple(slice(0, min(a, b)) for a, b in zip(buffer.shape, out.shape))
                buffer[region] = out[region]
        return list(buffers)


class IgnoresRanges(ReferenceBackend):
    """Compiles for the example shapes only, ignoring the program's symbolic ranges.

    ``preprocess`` reads each input's size as its example value (what a
    compiler that calls ``int()`` on every dimension gets); ``execute`` crops
    or zero-pads every input to those sizes, like a fixed-shape engine.
    """

    name = "ignores_ranges"

    def preprocess(self, program, compile_spec, debug_handles):
        shapes = []
        for node in program.graph.nodes:
            spec = next(
                (s for s in program.graph_signature.input_specs if getattr(s.arg, "name", None) == node.name), None
            )
            if node.op == "placeholder" and spec is not None and spec.kind.name == "USER_INPUT":
                value = node.meta.get("val")
                shape = getattr(value, "shape", None)
                shapes.append(None if shape is None else [_example_size(d) for d in shape])
        header = json.dumps(shapes).encode()
        return struct.pack("<I", len(header)) + header + super().preprocess(program, compile_spec, debug_handles)

    def compile(self, processed, method_compile_spec):
        split = {}
        for method, blob in processed.items():
            (n,) = struct.unpack_from("<I", blob)
            split[method] = (json.loads(blob[4 : 4 + n]), blob[4 + n :])
        handles = super().compile({m: b for m, (_, b) in split.items()}, method_compile_spec)
        return {m: (split[m][0], h) for m, h in handles.items()}

    def execute(self, handle, inputs):
        shapes, inner = handle
        fitted = [_fit(x, s) if isinstance(x, torch.Tensor) and s is not None else x for x, s in zip(inputs, shapes)]
        return super().execute(inner, fitted)


def _example_size(dim) -> int:
    node = getattr(dim, "node", None)
    return int(node.hint) if node is not None else int(dim)


def _fit(x: torch.Tensor, shape: list[int]) -> torch.Tensor:
    out = torch.zeros(shape, dtype=x.dtype)
    region = tuple(slice(0, min(a, b)) for a, b in zip(x.shape, shape))
    out[region] = x[region]
    return out


class StaticOnly(ReferenceBackend):
    """Declares that it runs static shapes only: dynamic-shape checks are unsupported for it."""

    name = "static_only"
    capabilities = bc.Capabilities(
        supported_ops=ReferenceBackend.capabilities.supported_ops,
        dtypes=ReferenceBackend.capabilities.dtypes,
        host_only_modules=ReferenceBackend.capabilities.host_only_modules,
        dynamic_shapes=False,
    )

    def preprocess(self, program, compile_spec, debug_handles):
        # Were it ever given a dynamic program, the test would see this fail.
        if program.range_constraints:
            raise AssertionError("static_only was given a program with symbolic shapes")
        return super().preprocess(program, compile_spec, debug_handles)
