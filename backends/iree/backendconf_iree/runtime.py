"""Run blobs with IREE's runtime (target side): ``compile`` and ``execute``.

`load` reads a blob's ``.vmfb`` into a VM context on the ``local-sync``
driver (the module's code runs on the calling thread: no thread pool to
fight pytest-xdist's workers for the cores, and the same result every run).
`CompiledMethod.run` feeds torch tensors as numpy arrays (bfloat16 through
``ml_dtypes``, which IREE's runtime reads), calls the module's function and
returns tensors of exactly the exported program's dtypes.

This module needs ``iree.runtime``, numpy, ml_dtypes and torch only; never
``iree.compiler`` (host-only: the suite loads archives with it blocked).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pytest_backendconf import BackendError

from . import blob as blob_format

#: IREE's HAL driver: one thread, the caller's.
DRIVER = "local-sync"

_config_lock = threading.Lock()
_config: Any = None


def config() -> Any:
    """The process's ``iree.runtime.Config`` (its VM instance and device; creating one per method is wasted work)."""
    global _config
    with _config_lock:
        if _config is None:
            import iree.runtime

            _config = iree.runtime.Config(DRIVER)
        return _config


def load(blob: bytes) -> "CompiledMethod":
    """Decode a blob and load its module; ``ValueError`` if either fails."""
    import iree.runtime

    header, vmfb = blob_format.decode(blob)
    try:
        context = iree.runtime.SystemContext(config=config())
        context.add_vm_module(iree.runtime.VmModule.copy_buffer(context.instance, vmfb))
        function = context.modules.module[header.function]
    except Exception as exc:  # IREE raises RuntimeError, ValueError and KeyError here
        raise ValueError(f"IREE's runtime cannot load the module: {first_line(exc)}") from exc
    return CompiledMethod(header, context, function)


class CompiledMethod:
    """One method ready to run: what ``IreeBackend.compile`` returns per method.

    The VM context keeps state between calls (its stack, the device's
    allocations), so calls of one method take turns on a lock.
    """

    def __init__(self, header: blob_format.Header, context: Any, function: Any) -> None:
        self.header = header
        self._context = context
        self._function = function
        self._lock = threading.Lock()

    def run(self, inputs: Sequence[Any]) -> list:
        """Run the method on its flat user inputs; return the flat user outputs."""
        header = self.header
        if len(inputs) != len(header.inputs):
            raise ValueError(f"expected {len(header.inputs)} inputs, got {len(inputs)}")
        arrays = [
            _to_numpy(index, dtype, value) for index, (dtype, value) in enumerate(zip(header.inputs, inputs)) if dtype
        ]
        if header.fault is not None:
            # Simulated: every dispatch of an IREE module runs on every call, so fail before running.
            fault = header.fault
            raise BackendError(f"injected fault at node {fault.node!r} ({fault.op})", debug_handle=fault.handle)
        with self._lock:
            try:
                results = self._function(*arrays)
            except Exception as exc:  # IREE's runtime raises RuntimeError, IndexError, ValueError...
                raise BackendError(f"IREE's runtime failed: {first_line(exc)}") from exc
            if results is None:
                results = ()
            elif not isinstance(results, (tuple, list)):
                results = (results,)
            tensors = iter([_from_iree(r) for r in results])
        outputs = []
        for kind, value in header.outputs:
            if kind == "constant":
                outputs.append(value)
                continue
            tensor = next(tensors)
            dtype = getattr(torch, value)
            outputs.append(tensor if tensor.dtype == dtype else tensor.to(dtype))
        return outputs

    def __repr__(self) -> str:
        return f"<CompiledMethod {self.header.function}: {len(self.header.inputs)} inputs on {DRIVER}>"


def _to_numpy(index: int, dtype: str, value: Any) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"input {index} must be a tensor, got {type(value).__name__}")
    if str(value.dtype).removeprefix("torch.") != dtype:
        raise TypeError(f"input {index} must be a {dtype} tensor, got {value.dtype}")
    tensor = value.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        # numpy has no bfloat16: the bits, typed as ml_dtypes' bfloat16 (which IREE's runtime reads).
        return tensor.view(torch.int16).numpy().copy().view(ml_dtypes.bfloat16)
    # A copy: the module must never see (or write) the caller's memory.
    return tensor.numpy().copy()


def _from_iree(result: Any) -> torch.Tensor:
    array = np.array(result.to_host() if hasattr(result, "to_host") else result, copy=True)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an error's text."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:500] if lines else type(exc).__name__
