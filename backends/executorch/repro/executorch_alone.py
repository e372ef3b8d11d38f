"""ExecuTorch alone, for the reproductions beside it: torchao's ``quantize_``, torch.export, ExecuTorch's flow.

No pytest-backendconf: a module is quantized by torchao 0.18.0, exported by
``torch.export.export`` (ExecuTorch unwraps torchao's tensor subclasses
itself), lowered by ``to_edge_transform_and_lower(program,
partitioner=[XnnpackPartitioner()]).to_executorch()`` (or with no
partitioner: ExecuTorch's portable kernels only) and run by
``executorch.runtime``. Each ``*.py`` beside this file reproduces one
ExecuTorch defect and prints ExecuTorch's result beside eager PyTorch's
running the *quantized* model (or ExecuTorch's lowering error)::

    cd backends/executorch/repro && python weight_only_integers_as_weights.py
"""

from __future__ import annotations

import logging
import warnings

import torch

warnings.filterwarnings("ignore")  # torch.export's and torchao's deprecation notices
logging.disable(logging.ERROR)  # fake-tensor tracebacks logged before the exception that carries them


def quantized(module: torch.nn.Module, config) -> torch.nn.Module:
    """``module`` with its linear layers quantized by the torchao ``config`` (in place)."""
    from torchao.quantization import quantize_

    quantize_(module.eval(), config)
    return module


def lower(module: torch.nn.Module, x: torch.Tensor, xnnpack: bool = True, **options) -> bytes:
    """The ``.pte`` of ``module(x)``: XNNPACK (``XnnpackPartitioner(**options)``) where it takes the nodes, portable kernels elsewhere."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = torch.export.export(module, (x,))
    partitioner = [XnnpackPartitioner(**options)] if xnnpack else None
    return to_edge_transform_and_lower(program, partitioner=partitioner).to_executorch().buffer


def run(pte: bytes, x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of the ``.pte``'s ``forward`` on ``x``."""
    from executorch.runtime import Runtime

    return list(Runtime.get().load_program(pte).load_method("forward").execute([x]))


def lowering_error(exc: BaseException) -> str:
    """ExecuTorch's error and the first line of its cause (a pass's error wraps the real one)."""
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    cause = exc.__cause__
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    if cause is not None:
        text += f"\n    caused by {type(cause).__name__}: {str(cause).strip().splitlines()[0]}"
    return text


def compare(
    title: str, module: torch.nn.Module, x: torch.Tensor, xnnpack: bool = True, **options
) -> torch.Tensor | None:
    """Print eager's and ExecuTorch's outputs of the quantized ``module(x)``; return ExecuTorch's (None: no lowering)."""
    with torch.no_grad():
        eager = module(x)
    how = "portable kernels only"
    if xnnpack:
        how = "XNNPACK" + (
            f", XnnpackPartitioner({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""
        )
    print(f"== {title} ({how})")
    try:
        got = run(lower(module, x, xnnpack, **options), x)[0]
    except Exception as exc:  # ExecuTorch's lowering raises plain exceptions
        print(f"  ExecuTorch does not lower it: {lowering_error(exc)}")
        return None
    error = (got - eager).abs().max().item()
    print(f"  largest output: eager {eager.abs().max().item():.4g}; max abs error of ExecuTorch {error:.4g}")
    return got
