"""Run blobs with OpenVINO's CPU plugin (target side): ``compile`` and ``execute``.

`load` reads a blob's IR with ``openvino.Core.read_model`` (the IR frontend,
native code) and compiles it on ``"CPU"`` with the inference precision the
blob names (`compile_config`). `CompiledMethod.run` feeds torch tensors as
OpenVINO tensors (bfloat16 through its bits: numpy has no bfloat16), runs the
infer request and returns tensors of exactly the exported program's dtypes.
An OpenVINO error that names an IR layer becomes ``BackendError(message,
debug_handle=h)``, ``h`` the debug handle of the FX node that layer was
converted from.

This module needs openvino's runtime, numpy and torch only: never
``openvino.frontend.pytorch`` or ``openvino.tools.ovc`` (host-only; the suite
loads archives with them blocked).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pytest_backendconf import BackendError

from . import blob as blob_format

DEVICE = "CPU"
#: Threads per compiled model: one keeps results reproducible and leaves the
#: cores to pytest-xdist workers and to callers running methods in parallel.
INFERENCE_THREADS = 1

_core_lock = threading.Lock()
_core: Any = None

# OpenVINO quotes the layer it failed in, e.g. "... node with name 'add/aten.add.Tensor/Add' ...".
_QUOTED = re.compile(r"""['"]([^'"]+)['"]""")


def core() -> Any:
    """The process's ``openvino.Core`` (creating one loads the plugin registry: keep one)."""
    global _core
    with _core_lock:
        if _core is None:
            import openvino

            _core = openvino.Core()
        return _core


def compile_config(precision: str) -> dict[str, Any]:
    """The CPU plugin's configuration for a method whose blob asks for ``precision``.

    The precision is always explicit: without a hint, a CPU with AVX-512 BF16
    or AMX runs float32 models in bfloat16 (errors of 1e-3 where float32 gives
    1e-7), which would make results depend on the machine. Dynamic
    quantization is off for the same reason: on a CPU with VNNI or AMX the
    plugin quantizes a weight-compressed linear's activations to int8 in
    groups of 32 (errors of 1e-1 against eager's float activations), and on
    a CPU without them it does not.
    """
    return {
        "INFERENCE_PRECISION_HINT": precision,
        "INFERENCE_NUM_THREADS": INFERENCE_THREADS,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        # Pinning threads to cores fights pytest-xdist's workers for them.
        "ENABLE_CPU_PINNING": False,
        # 0 turns the activations' dynamic quantization off (see above).
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }


def compile_ir(xml: bytes, weights: bytes, precision: str) -> tuple[Any, Any]:
    """``(CompiledModel, weights array)`` of an IR; the array must outlive the model."""
    import openvino

    array = np.frombuffer(weights, dtype=np.uint8).copy() if weights else np.zeros(1, dtype=np.uint8)
    model = core().read_model(model=xml.decode("utf-8"), weights=openvino.Tensor(array))
    return core().compile_model(model, DEVICE, compile_config(precision)), array


def load(blob: bytes) -> "CompiledMethod":
    """Decode a blob and compile its IR on the CPU; ``ValueError`` if either fails."""
    header, xml, weights = blob_format.decode(blob)
    try:
        compiled, array = compile_ir(xml, weights, header.precision)
    except Exception as exc:  # openvino's exception types are not all public API
        raise ValueError(f"OpenVINO cannot compile the IR on {DEVICE}: {first_line(exc)}") from exc
    return CompiledMethod(header, compiled, array)


class CompiledMethod:
    """One method ready to run: what ``OpenVinoBackend.compile`` returns per method.

    An ``InferRequest`` is not thread-safe and owns its output memory, so
    calls take turns on a lock (different methods run in parallel).
    """

    def __init__(self, header: blob_format.Header, compiled: Any, weights: Any) -> None:
        self.header = header
        self.compiled = compiled
        self._weights = weights  # read_model may refer to it
        self._request = compiled.create_infer_request()
        self._lock = threading.Lock()
        self._dtypes = {slot.dtype: getattr(torch, slot.dtype) for slot in _slots(header)}
        self._input_index = {name: i for i, port in enumerate(compiled.inputs) for name in port.get_names()}

    def run(self, inputs: Sequence[Any]) -> list:
        """Run the method on its flat user inputs; return the flat user outputs."""
        import openvino

        header = self.header
        if len(inputs) != len(header.inputs):
            raise ValueError(f"expected {len(header.inputs)} inputs, got {len(inputs)}")
        feeds = {}
        keep = []  # an openvino.Tensor shares the array's memory without keeping it alive
        for slot, value in zip(header.inputs, inputs):
            if slot is not None:
                array, feeds[self._input_index[slot.name]] = _to_openvino(slot, value, openvino)
                keep.append(array)
        if header.fault is not None:
            # Simulated: every node of an OpenVINO model runs on every call
            # (or, inside a torch.cond branch, may run), so fail before running.
            fault = header.fault
            raise BackendError(f"injected fault at node {fault.node!r} ({fault.op})", debug_handle=fault.handle)
        with self._lock:
            try:
                self._request.infer(feeds)
            except Exception as exc:  # openvino raises RuntimeError and its own types
                raise self._runtime_error(exc) from exc
            results = [self._request.get_output_tensor(i) for i in range(len(self.compiled.outputs))]
            tensors = iter([_from_openvino(t) for t in results])
        del keep
        outputs = []
        for kind, value in header.outputs:
            if kind == "constant":
                outputs.append(value)
            else:
                tensor = next(tensors)
                dtype = self._dtypes[value.dtype]
                # Widened outputs are rounded to their dtype here, once; and the
                # IR may type an output otherwise than torch (i32 for i64
                # indices): cast as torch would store it.
                outputs.append(tensor if tensor.dtype == dtype else tensor.to(dtype))
        return outputs

    def _runtime_error(self, exc: Exception) -> BackendError:
        text = str(exc).strip()
        nodes = self.header.nodes
        layer = next((name for name in _QUOTED.findall(text) if name in nodes), None)
        where = f" at IR layer {layer!r}" if layer else ""
        return BackendError(f"OpenVINO failed{where}: {text}", debug_handle=nodes[layer] if layer else None)

    def __repr__(self) -> str:
        return f"<CompiledMethod {len(self.header.inputs)} inputs, {len(self.header.outputs)} outputs on {DEVICE}>"


def _to_openvino(slot: blob_format.TensorSlot, value: Any, openvino: Any) -> tuple[Any, Any]:
    """``(array, openvino.Tensor over it)``: the caller keeps the array alive while the tensor is used."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"input {slot.name!r} must be a tensor, got {type(value).__name__}")
    tensor = value.detach()
    if slot.widened:
        tensor = tensor.to(torch.float32)  # exact: every float16/bfloat16 is a float32
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        # numpy has no bfloat16: hand OpenVINO the bits, typed bf16.
        array = tensor.view(torch.int16).numpy()
        return array, openvino.Tensor(array, list(tensor.shape), openvino.Type.bf16)
    array = tensor.numpy()
    return array, openvino.Tensor(array)


def _from_openvino(result: Any) -> torch.Tensor:
    import openvino

    # asarray keeps 0-d arrays 0-d; copy: the request reuses its output memory.
    array = np.array(result.data, copy=True)
    if result.get_element_type() == openvino.Type.bf16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _slots(header: blob_format.Header) -> list[blob_format.TensorSlot]:
    slots = [slot for slot in header.inputs if slot is not None]
    slots += [value for kind, value in header.outputs if kind == "tensor"]
    return slots


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an error's text (OpenVINO's start with the source file that raised)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return " ".join(lines[:3])[:500] if lines else type(exc).__name__
