"""Run blobs on the ExecuTorch runtime (target side): ``compile`` and ``execute``.

`load` decodes a blob and loads its ``.pte`` with
``executorch.runtime.Runtime.get().load_program(bytes).load_method(name)``;
`CompiledMethod.run` feeds the flat user inputs, and returns outputs of
exactly the exported program's dtypes (copied: ExecuTorch's outputs live in
the method's planned memory, which the next call overwrites).

ExecuTorch reports a failure as an error code; which instruction failed is
only in its native log. When a call fails, `run` runs it once more with
the log captured, finds the instruction, and raises
``BackendError(message, debug_handle=h)`` naming the kernel or the
delegate and, through the blob's instruction table, the user's node.

Needs the ExecuTorch runtime (``executorch.runtime``, which imports
``torch._dynamo`` but traces nothing) and torch; never ``executorch.exir``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from pytest_backendconf import BackendError

from . import blob as blob_format

_FAILED_INSTRUCTION = re.compile(r"at instruction (?:\d+:)?(\d+)")
# Redirecting file descriptor 2 is process-wide: one capture at a time.
_LOG_LOCK = threading.Lock()
_OPERATORS: frozenset[str] | None = None


def the_runtime() -> Any:
    """ExecuTorch's process-wide runtime (its import takes seconds: done on first use)."""
    from executorch.runtime import Runtime

    return Runtime.get()


def registered_operators() -> frozenset[str]:
    """The operator names the runtime has kernels for (``aten::add.out``, ...)."""
    global _OPERATORS
    if _OPERATORS is None:
        _OPERATORS = frozenset(the_runtime().operator_registry.operator_names)
    return _OPERATORS


@contextlib.contextmanager
def captured_native_log() -> Iterator[list[str]]:
    """Capture the runtime's log; the text lands in the yielded list.

    The pybindings forward C++ ``std::cerr`` to Python's ``sys.stderr``;
    other native code writes to file descriptor 2. Both are captured.
    """
    text: list[str] = []
    with _LOG_LOCK, tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stderr.flush()
        saved_stream, forwarded = sys.stderr, io.StringIO()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        sys.stderr = forwarded
        try:
            yield text
        finally:
            sys.stderr = saved_stream
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text.append(forwarded.getvalue() + sink.read().decode("utf-8", "replace"))


def try_load(pte: bytes, method: str) -> tuple[str | None, str]:
    """Load ``method`` of ``pte`` once; ``(None, log)`` or ``(problem, log)``."""
    problem = None
    with captured_native_log() as log:
        try:
            the_runtime().load_program(pte).load_method(method)
        except Exception as exc:  # the pybindings raise RuntimeError with an error code
            problem = f"{type(exc).__name__}: {_first_line(exc)}"
    return problem, log[0]


def load(blob: bytes) -> "CompiledMethod":
    """Decode a blob and load its method; ``ValueError`` if either fails."""
    header, pte = blob_format.decode(blob)
    try:
        program = the_runtime().load_program(pte)
        method = program.load_method(header.method)
    except Exception:
        problem, log = try_load(pte, header.method)  # again, with the log captured, for the message
        raise ValueError(
            f"ExecuTorch's runtime cannot load the method: {problem or 'load_method failed'}; "
            f"runtime log: {log.strip()[-500:]}"
        ) from None
    return CompiledMethod(header, method, keep=(pte, program))


class CompiledMethod:
    """One method ready to run: what ``ExecuTorchBackend.compile`` returns per method.

    An ExecuTorch ``Method`` owns its planned memory, so concurrent calls of
    one method take turns (a lock); different methods run in parallel.
    """

    def __init__(self, header: blob_format.Header, method: Any, keep: tuple = ()) -> None:
        self.header = header
        self.method = method
        # The Method points into its Program and the .pte bytes: they must live as long as it does.
        self._keep = keep
        self._lock = threading.Lock()
        self._dtypes = [getattr(torch, v) if k == "tensor" else None for k, v in header.outputs]

    def run(self, inputs: Sequence[Any]) -> list:
        """Run the method on its flat user inputs; return the flat user outputs."""
        header = self.header
        if len(inputs) != len(header.fed):
            raise ValueError(f"expected {len(header.fed)} inputs, got {len(inputs)}")
        feeds = [_feed(value) for value, fed in zip(inputs, header.fed) if fed]
        if header.fault is not None:
            fault = header.fault
            raise BackendError(f"injected fault at node {fault.node!r} ({fault.op})", debug_handle=fault.handle)
        with self._lock:
            try:
                results = list(self.method.execute(feeds))
            except Exception as exc:  # the pybindings raise RuntimeError with an error code
                raise self._runtime_error(exc, feeds) from exc
            # Copy while holding the lock: the next call reuses this memory.
            results = [r.clone() if isinstance(r, torch.Tensor) else r for r in results]
        return self._outputs(results)

    def _outputs(self, results: list) -> list:
        kinds = self.header.outputs
        tensors = sum(1 for kind, _ in kinds if kind == "tensor")
        if len(results) not in (len(kinds), tensors):
            raise BackendError(
                f"ExecuTorch's method returned {len(results)} outputs; the program has {len(kinds)} ({tensors} tensors)"
            )
        given = iter(results)
        outputs = []
        for (kind, value), dtype in zip(kinds, self._dtypes):
            if kind == "constant":
                if len(results) == len(kinds):
                    next(given)  # ExecuTorch returns the constant too; the header's is exact
                outputs.append(value)
                continue
            tensor = next(given)
            if not isinstance(tensor, torch.Tensor):
                tensor = torch.tensor(tensor)
            outputs.append(tensor if tensor.dtype == dtype else tensor.to(dtype))
        return outputs

    def _runtime_error(self, exc: Exception, feeds: list) -> BackendError:
        # The error code says what, the native log says where: run once
        # more with the log captured (the method is deterministic).
        with captured_native_log() as log:
            try:
                self.method.execute(feeds)
            except Exception:
                pass
        found = _FAILED_INSTRUCTION.search(log[0])
        text = _first_line(exc)
        if found is None or int(found.group(1)) >= len(self.header.instructions):
            return BackendError(f"ExecuTorch's runtime failed: {text}; runtime log: {log[0].strip()[-300:]}")
        index = int(found.group(1))
        instruction = self.header.instructions[index]
        nodes = f" (FX node {', '.join(repr(n) for n in instruction.nodes)})" if instruction.nodes else ""
        # A delegate covers many nodes and does not say which failed: the
        # handle is its first node's, the message lists all of them.
        handle = instruction.handles[0] if instruction.handles else None
        return BackendError(
            f"ExecuTorch's runtime failed at instruction {index}, {instruction.what}{nodes}: {text}",
            debug_handle=handle,
        )

    def __repr__(self) -> str:
        return f"<CompiledMethod {self.header.method!r}, {len(self.header.instructions)} instructions>"


def _feed(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().contiguous()
    return value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
