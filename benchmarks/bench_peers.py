"""Five engines side by side: eager, the reference backend, ONNX Runtime, ExecuTorch XNNPACK and OpenVINO CPU.

    python benchmarks/bench_peers.py            # the benchmark models, about 2 minutes
    python benchmarks/bench_peers.py --quick    # fewer rounds
    python benchmarks/bench_peers.py --json out.json

Per model: the call latency of each engine on the same inputs, timed
interleaved in one run (``bench_timing.interleaved``: many short rounds, rotating
order, minimum kept, one torch thread), and the lowering time of each
backend (``to_backend`` from an eager module: export, preprocess, compile;
CPU time, minimum of a few runs, after one warm-up lowering per backend
so that first-use imports are not counted). A backend that is not installed
is reported as such, not left out silently. docs/benchmarks.md records the
latest run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_models as models  # noqa: E402
import bench_timing as timing  # noqa: E402  (interleaved, best_of, Settings, machine)

#: (backend name, what the table calls it)
BACKENDS = (
    ("reference", "reference"),
    ("onnxruntime", "ONNX Runtime"),
    ("executorch", "ExecuTorch XNNPACK"),
    ("openvino", "OpenVINO CPU"),
)
MODELS = {**models.SMALL, **models.LARGE}


def available_backends() -> dict[str, str]:
    """{backend: ""} for those that can run here, {backend: why not} for the others."""
    from pytest_backendconf.registry import lookup_backend
    from pytest_backendconf.errors import RegistryError

    reasons = {}
    for name, _ in BACKENDS:
        try:
            backend = lookup_backend(name).backend
        except RegistryError:
            reasons[name] = f"not installed (pip install -e backends/{name})"
            continue
        ok = backend.is_available()
        reasons[name] = "" if ok else getattr(backend, "unavailable_reason", lambda: "is_available() is false")()
    return reasons


def measure(settings: timing.Settings, lowering_rounds: int) -> dict[str, Any]:
    import torch

    import pytest_backendconf as bc

    torch.set_num_threads(settings.threads)
    reasons = available_backends()
    engines = [name for name, _ in BACKENDS if not reasons[name]]
    rows = {}
    for model_name, (cls, shapes) in MODELS.items():
        model = models.seeded(cls).eval()
        inputs = models.example(*shapes)
        lowered, lowering = {}, {}
        for name in engines:

            def lower(name: str = name) -> Any:
                return bc.to_backend(model, name, {"forward": {}}, example_inputs=inputs)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lowered[name] = lower()  # also the warm-up: first-use imports are not timed
                lowering[name] = timing.best_of(lower, lowering_rounds)
        with torch.no_grad():
            expected = model(*inputs)
            for module in lowered.values():
                torch.testing.assert_close(module(*inputs), expected, rtol=1e-4, atol=1e-4)
            calls = {"eager": lambda: model(*inputs)}
            calls.update({name: (lambda module=module: module(*inputs)) for name, module in lowered.items()})
            latency = timing.interleaved(calls, settings)
        rows[model_name] = {"latency_s": latency, "lowering_cpu_s": lowering}
    return {"engines": ["eager", *engines], "unavailable": {k: v for k, v in reasons.items() if v}, "models": rows}


def render(result: dict[str, Any]) -> str:
    labels = dict(BACKENDS) | {"eager": "eager"}
    engines = result["engines"]
    lines = [
        "Call latency (µs, minimum of interleaved rounds; ×eager in brackets)",
        "",
        "| model | " + " | ".join(labels[e] for e in engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    for model, row in result["models"].items():
        eager = row["latency_s"]["eager"]
        cells = [
            f"{row['latency_s'][e] * 1e6:,.1f}" + ("" if e == "eager" else f" ({row['latency_s'][e] / eager:.2f}×)")
            for e in engines
        ]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Lowering (`to_backend` from the eager module, CPU seconds, minimum)",
        "",
        "| model | " + " | ".join(labels[e] for e in engines[1:]) + " |",
        "|---|" + "---|" * (len(engines) - 1),
    ]
    for model, row in result["models"].items():
        lines.append(f"| {model} | " + " | ".join(f"{row['lowering_cpu_s'][e]:.3f}" for e in engines[1:]) + " |")
    for name, why in result["unavailable"].items():
        lines.append(f"\n{labels[name]}: not measured, {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    settings = timing.Settings.quick() if args.quick else timing.Settings.full()
    start = time.monotonic()
    result = measure(settings, lowering_rounds=1 if args.quick else 3)
    result["machine"] = timing.machine()
    result["wall_s"] = time.monotonic() - start
    print(render(result))
    print(f"\nwhole run {result['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
