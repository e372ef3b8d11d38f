"""A decode step of a lowered stateful module against eager PyTorch: tokens per second, as a ratio in one run.

The model is the stateful category's Llama-like decoder (2 layers, width 32, grouped-query attention, a
static KV cache of 16 positions in buffers written with ``index_copy_``), lowered whole to the reference
backend. After a prompt of 4 tokens both sides repeat the decode step at position 4: each call writes the
same cache slot with the same values, so every timed call is a steady-state decode step (the state read,
the program run, the new state written back) and neither side runs out of cache.
"""

from __future__ import annotations

from typing import Any

from bench_timing import Figure, Settings, interleaved, judged

#: The target: a decode step of the lowered module within this multiple of eager's.
DECODE_TARGET = 1.5


def stateful_figures(settings: Settings) -> list[Figure]:
    import torch

    import pytest_backendconf as bc
    from pytest_backendconf.conformance.stateful import models

    model = next(m for m in models() if m.name == "llama_decoder")
    eager = model.module("float32")
    lowered = bc.to_backend(
        model.module("float32"), "reference", {"forward": {}}, example_inputs=model.example_inputs("float32")
    )
    prompt = model.prompt_tokens(0)
    with torch.no_grad():
        for position, token in enumerate(prompt):
            call = (torch.tensor([[token]]), torch.tensor([position]))
            eager(*call)
            lowered(*call)
        step = (torch.tensor([[prompt[-1]]]), torch.tensor([len(prompt)]))
        same = torch.equal(eager(*step), lowered(*step))
        timed: dict[str, Any] = {"eager": lambda: eager(*step), "lowered": lambda: lowered(*step)}
        t = interleaved(timed, settings)
    ratio = t["lowered"] / t["eager"]
    return [
        Figure(
            "stateful.decode_step",
            "stateful decode step: lowered (reference) ÷ eager",
            ratio,
            "×",
            f"≤ {DECODE_TARGET}×",
            judged(ratio <= DECODE_TARGET),
            f"llama_decoder, position {len(prompt)}: lowered {1 / t['lowered']:,.0f} tokens/s "
            f"({t['lowered'] * 1e3:.2f} ms), eager {1 / t['eager']:,.0f} tokens/s ({t['eager'] * 1e3:.2f} ms); "
            f"logits {'bit-identical' if same else 'NOT identical'} to eager's",
        )
    ]
