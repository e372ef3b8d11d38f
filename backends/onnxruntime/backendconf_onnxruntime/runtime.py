"""Run blobs with ONNX Runtime on the CPU (target side): ``compile`` and ``execute``.

`load` turns a blob into a `CompiledMethod`, an ``InferenceSession`` with
fixed, deterministic session options. `CompiledMethod.run` converts torch
tensors to numpy, runs the session, and converts the outputs back to the
exact dtypes and shapes of the exported program. An ONNX Runtime error that
names a node becomes ``BackendError(message, debug_handle=h)``, ``h`` the
debug handle of the FX node that node was exported from, so the user sees
their own source line.

This module needs onnxruntime, numpy and torch only: never ``onnx``,
``onnxscript`` or ``torch.onnx`` (they are host-only, and the suite loads
archives with them blocked).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pytest_backendconf import BackendError

from . import blob as blob_format

#: Threads per session: one keeps results bit-reproducible and leaves the
#: cores to pytest-xdist workers and to callers running methods in parallel.
INTRA_OP_THREADS = 1

# ONNX Runtime names the failing node as Name:'...'; in a subgraph (an If
# branch) the outer node comes first and the innermost last.
_NODE_NAME = re.compile(r"Name:'([^']*)'")


def session_options() -> Any:
    """The session options of every session: deterministic, modest, quiet."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = INTRA_OP_THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Basic optimizations (constant folding, redundant nodes) keep the node
    # names of the blob, which the error mapping relies on; the extended
    # levels fuse nodes into new ones with new names.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.use_deterministic_compute = True
    # Fatal only: a failing node is reported by the raised error, not a log line.
    options.log_severity_level = 4
    return options


def create_session(model: bytes) -> Any:
    """An ``InferenceSession`` for ``model`` on the CPU provider."""
    import onnxruntime as ort

    return ort.InferenceSession(model, session_options(), providers=["CPUExecutionProvider"])


def load(blob: bytes) -> "CompiledMethod":
    """Decode a blob and create its session; ``ValueError`` if either fails."""
    header, model = blob_format.decode(blob)
    try:
        session = create_session(model)
    except Exception as exc:  # onnxruntime's own exception types are not public API
        raise ValueError(f"ONNX Runtime cannot load the model: {_first_line(exc)}") from exc
    return CompiledMethod(header, session)


class CompiledMethod:
    """One method ready to run: what ``OnnxRuntimeBackend.compile`` returns per method.

    ``InferenceSession.run`` may be called from several threads at once, and
    `run` keeps its state local, so one handle serves concurrent callers.
    """

    def __init__(self, header: blob_format.Header, session: Any) -> None:
        self.header = header
        self.session = session
        self.fetch = header.model_outputs()
        self._fetch_index = {name: i for i, name in enumerate(self.fetch)}
        self._dtypes = {slot.dtype: getattr(torch, slot.dtype) for slot in _slots(header)}
        fault = header.fault
        self._fault_now = fault is not None and fault.flag is None

    def run(self, inputs: Sequence[Any]) -> list:
        """Run the method on its flat user inputs; return the flat user outputs."""
        header = self.header
        if len(inputs) != len(header.inputs):
            raise ValueError(f"expected {len(header.inputs)} inputs, got {len(inputs)}")
        feeds = {}
        for slot, value in zip(header.inputs, inputs):
            if slot is not None:
                feeds[slot.name] = self._feed(slot, value)
        if self._fault_now:
            # The node runs on every call: fail before running, as the engine
            # would when it reached the node.
            raise self._fault_error()
        try:
            results = self.session.run(self.fetch, feeds)
        except Exception as exc:  # onnxruntime's exception types are not public API
            raise self._runtime_error(exc) from exc
        fault = header.fault
        if fault is not None and fault.flag is not None and bool(results[self._fetch_index[fault.flag]]):
            raise self._fault_error()
        outputs = []
        for kind, value in header.outputs:
            if kind == "constant":
                outputs.append(value)
            else:
                outputs.append(self._output(value, results[self._fetch_index[value.name]]))
        return outputs

    def _feed(self, slot: blob_format.TensorSlot, value: Any) -> np.ndarray:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"input {slot.name!r} must be a tensor, got {type(value).__name__}")
        tensor = value.detach()
        if slot.widened:
            tensor = tensor.to(torch.float32)  # exact: every float16/bfloat16 is a float32
        return tensor.contiguous().numpy()

    def _output(self, slot: blob_format.TensorSlot, array: Any) -> torch.Tensor:
        # asarray, not ascontiguousarray: the latter turns a 0-d array into 1-d.
        tensor = torch.from_numpy(np.asarray(array, order="C"))
        dtype = self._dtypes[slot.dtype]
        if tensor.dtype != dtype:
            # Widened outputs were rounded to their dtype inside the model, so
            # this cast is exact; other mismatches (an exporter typing an
            # output wider than torch does) are cast as torch would store them.
            tensor = tensor.to(dtype)
        return tensor

    def _fault_error(self) -> BackendError:
        fault = self.header.fault
        assert fault is not None
        return BackendError(f"injected fault at node {fault.node!r} ({fault.op})", debug_handle=fault.handle)

    def _runtime_error(self, exc: Exception) -> BackendError:
        text = str(exc)
        handle = None
        node = None
        for name in reversed(_NODE_NAME.findall(text)):  # innermost node first
            handle = self._handle_of(name)
            if handle is not None:
                node = name
                break
        where = f" at ONNX node {node!r}" if node else ""
        return BackendError(f"ONNX Runtime failed{where}: {text.strip()}", debug_handle=handle)

    def _handle_of(self, name: str) -> int | None:
        nodes = self.header.nodes
        if name in nodes:
            return nodes[name]
        # ONNX Runtime may prefix or suffix the names of nodes it rewrote.
        best = max((known for known in nodes if known and known in name), key=len, default=None)
        return nodes[best] if best is not None else None

    def __repr__(self) -> str:
        return f"<CompiledMethod {len(self.header.inputs)} inputs, {len(self.header.outputs)} outputs>"


def _slots(header: blob_format.Header) -> list[blob_format.TensorSlot]:
    slots = [slot for slot in header.inputs if slot is not None]
    slots += [value for kind, value in header.outputs if kind == "tensor"]
    return slots


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
