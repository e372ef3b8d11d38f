"""IREE alone, for the reproductions beside it: torch.export, IREE's FX importer, iree-compile, IREE's runtime.

No pytest-backendconf: a program is exported and decomposed by torch,
imported by ``iree.compiler.extras.fx_importer.FxImporter`` (what
iree-base-compiler ships), compiled for llvm-cpu on the generic CPU (the
backend's target) and run on the local-sync driver. Each ``*.py`` beside
this file reproduces one IREE defect and prints IREE's result beside eager
PyTorch's (or IREE's compile error)::

    python backends/iree/repro/atan2_zero_zero.py
"""

from __future__ import annotations

import numpy as np
import torch

FLAGS = ["--iree-llvmcpu-target-cpu=generic", "--iree-input-demote-f64-to-f32=false"]


class Function(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


def compile_vmfb(function, *args) -> bytes:
    """The ``.vmfb`` of ``function(*args)`` (raises IREE's ``CompilerToolError`` with its diagnostics)."""
    from iree.compiler import compile_str, ir
    from iree.compiler.extras.fx_importer import FxImporter

    program = torch.export.export(Function(function), args).run_decompositions()
    importer = FxImporter(context=ir.Context())
    importer.import_frozen_program(program, func_name="main")
    return compile_str(str(importer.module), input_type="torch", target_backends=["llvm-cpu"], extra_args=FLAGS)


def run(function, *args) -> list[torch.Tensor]:
    """``function(*args)`` compiled and run by IREE, as torch tensors."""
    import iree.runtime as rt
    import ml_dtypes

    vmfb = compile_vmfb(function, *args)
    context = rt.SystemContext(config=rt.Config("local-sync"))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, vmfb))
    feeds = [
        a.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if a.dtype == torch.bfloat16 else a.numpy() for a in args
    ]
    results = context.modules.module["main"](*feeds)
    results = results if isinstance(results, (tuple, list)) else [results]
    out = []
    for r in results:
        array = np.array(r.to_host(), copy=True)
        out.append(
            torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
            if array.dtype.name == "bfloat16"
            else torch.from_numpy(array)
        )
    return out


def compare(title: str, function, *args) -> None:
    """Print eager's and IREE's results of ``function(*args)``, or IREE's compile error."""
    from iree.compiler import CompilerToolError

    eager = function(*args)
    print(f"== {title}")
    print(f"eager: {eager}")
    try:
        print(f"IREE:  {run(function, *args)[0]}")
    except CompilerToolError as exc:
        errors = [line for line in str(exc).splitlines() if "error:" in line]
        print("IREE:  compile error:", *errors[:2], sep="\n  ")
