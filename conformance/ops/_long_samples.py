"""Long-reduction samples: the suite's own ops samples where accumulation precision shows.

OpInfo's samples hold a few hundred elements at most, and a sum of a few
hundred float16 numbers accumulated in float16 is still within a few ULPs:
a backend whose reductions accumulate in the low-precision dtype (a classic
accelerator defect) passes them all. These samples reduce over thousands of
elements (``[[ops.long_samples]]`` in suite.toml: the overload, the input
shapes and the call, as data), in float16 and bfloat16, with inputs drawn
from a generator seeded per sample so that every run checks the same
numbers. Values are uniform in [0, 1): the partial sums grow, and a
float16 accumulator stops adding once its ULP exceeds the next term.
"""

from __future__ import annotations

from typing import Any

import torch

from .discovery import OpSample
from .._spec import section

#: The dtypes the long samples are made in (float32 accumulates well enough on every engine).
LONG_DTYPES = ("float16", "bfloat16")


def long_samples(spec: list[dict[str, Any]] | None = None) -> list[OpSample]:
    """The samples of ``[[ops.long_samples]]``, ``long<k>`` per (overload, dtype) in the order listed."""
    spec = section("ops").get("long_samples", []) if spec is None else spec
    samples: list[OpSample] = []
    counts: dict[tuple[str, str], int] = {}
    for number, entry in enumerate(spec):
        for dtype in LONG_DTYPES:
            index = counts.get((entry["overload"], dtype), 0)
            counts[(entry["overload"], dtype)] = index + 1
            generator = torch.Generator().manual_seed(1000 * number + LONG_DTYPES.index(dtype))
            inputs = [
                torch.rand(tuple(shape), generator=generator, dtype=torch.float32).to(getattr(torch, dtype))
                for shape in entry["inputs"]
            ]
            samples.append(
                OpSample(
                    overload=entry["overload"],
                    dtype=dtype,
                    index=index,
                    opinfo=f"long reduction of {entry['reduces']} elements",
                    args=entry["args"],
                    kwargs=entry.get("kwargs", {}),
                    outputs=entry.get("outputs"),
                    inputs=inputs,
                    kind="long",
                )
            )
    return samples
