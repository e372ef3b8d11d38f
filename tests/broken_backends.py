"""Deliberately broken backends: each is the reference backend with one defect.

They prove that the checks catch what they claim to: a lowering or suite
check that passes against one of these would be a check that cannot fail.
"""

from __future__ import annotations

import torch
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc


class Unavailable(ReferenceBackend):
    """Not available anywhere; counts compile and execute calls (there must be none)."""

    name = "unavailable"

    def __init__(self) -> None:
        self.compiled = 0
        self.executed = 0

    def is_available(self) -> bool:
        return False

    def unavailable_reason(self) -> str:
        return "no device in this test"

    def compile(self, processed, method_compile_spec):
        self.compiled += 1
        return super().compile(processed, method_compile_spec)

    def execute(self, handle, inputs):
        self.executed += 1
        return super().execute(handle, inputs)


class CompileFailsWhileAvailable(ReferenceBackend):
    """Says it is available, then cannot compile: a contract violation (§3.4)."""

    name = "compile_fails"

    def compile(self, processed, method_compile_spec):
        raise RuntimeError("device driver refused the blob")


class MissingHandle(ReferenceBackend):
    """compile() forgets every method but the first."""

    name = "missing_handle"

    def compile(self, processed, method_compile_spec):
        handles = super().compile(processed, method_compile_spec)
        return dict(list(handles.items())[:1])


class WrongOutputDtype(ReferenceBackend):
    """Returns float64 where the program says float32."""

    name = "wrong_dtype"

    def execute(self, handle, inputs):
        return [out.double() if isinstance(out, torch.Tensor) else out for out in super().execute(handle, inputs)]


class HalfAsFloat(ReferenceBackend):
    """Returns float32 where the program says float16 (a compiler that widens half precision): right
    values and shapes, the wrong dtype."""

    name = "half_as_float"

    def execute(self, handle, inputs):
        outputs = super().execute(handle, inputs)
        return [o.float() if isinstance(o, torch.Tensor) and o.dtype == torch.float16 else o for o in outputs]


class WrongOutputCount(ReferenceBackend):
    """Drops the last output."""

    name = "wrong_count"

    def execute(self, handle, inputs):
        return super().execute(handle, inputs)[:-1]


class UnknownHandle(ReferenceBackend):
    """Reports failures with debug handle -1, which no lowering gives a node."""

    name = "unknown_handle"

    def execute(self, handle, inputs):
        raise bc.BackendError("kernel trap", debug_handle=-1)


class PreprocessReturnsStr(ReferenceBackend):
    """preprocess() returns text, not bytes."""

    name = "preprocess_str"

    def preprocess(self, program, compile_spec, debug_handles):
        return super().preprocess(program, compile_spec, debug_handles).hex()


# --- symbolication (conformance/symbolication/) ----------------------------------


class AcceptsEverything(ReferenceBackend):
    """Never rejects at preprocess: a node it cannot compile fails only at execute, far from its source."""

    name = "accepts_everything"
    _DEFERRED = b"DEFERRED:"

    def preprocess(self, program, compile_spec, debug_handles):
        try:
            return super().preprocess(program, compile_spec, debug_handles)
        except bc.UnsupportedNodeError as exc:
            return self._DEFERRED + str(exc.node.target).encode()

    def compile(self, processed, method_compile_spec):
        deferred = {m: blob for m, blob in processed.items() if blob.startswith(self._DEFERRED)}
        rest = {m: blob for m, blob in processed.items() if m not in deferred}
        return {**super().compile(rest, method_compile_spec), **deferred}

    def execute(self, handle, inputs):
        if isinstance(handle, bytes):
            raise RuntimeError(f"no kernel for {handle[len(self._DEFERRED) :].decode()}")
        return super().execute(handle, inputs)


class RejectsWithTheWrongError(ReferenceBackend):
    """Rejects a node it cannot compile with NotImplementedError instead of UnsupportedNodeError."""

    name = "rejects_with_wrong_error"

    def preprocess(self, program, compile_spec, debug_handles):
        try:
            return super().preprocess(program, compile_spec, debug_handles)
        except bc.UnsupportedNodeError as exc:
            raise NotImplementedError(f"op {exc.node.target} is not implemented") from None


class NoSourceRejection(ReferenceBackend):
    """Rejects an unknown op naming the graph's output node: the text has no source line for the op."""

    name = "no_source_rejection"

    def preprocess(self, program, compile_spec, debug_handles):
        try:
            return super().preprocess(program, compile_spec, debug_handles)
        except bc.UnsupportedNodeError as exc:
            raise bc.UnsupportedNodeError(program.graph.output_node(), exc.reason) from None


class WrongHandleOnFault(ReferenceBackend):
    """Reports injected faults with the node's debug handle off by 1000."""

    name = "wrong_handle_on_fault"

    def execute(self, handle, inputs):
        try:
            return super().execute(handle, inputs)
        except bc.BackendError as exc:
            raise bc.BackendError(exc.message, debug_handle=exc.debug_handle + 1000) from None


class ChangesProgram(ReferenceBackend):
    """preprocess() adds a node to the program it was given, which then has no debug info."""

    name = "changes_program"

    def preprocess(self, program, compile_spec, debug_handles):
        blob = super().preprocess(program, compile_spec, debug_handles)
        graph = program.graph_module.graph
        source = next(n for n in graph.nodes if n.op == "placeholder")
        with graph.inserting_before(graph.output_node()):
            scratch = graph.call_function(torch.ops.aten.clone.default, (source,))
        scratch.meta.update(source.meta)
        return blob


# --- reliability (conformance/reliability.py) ---------------------------------------
# The suite runs crash and hang probes in a child process and skips the
# in-process checks of a case that crashed or hung there; select only the
# reliability category when using these two.


class CrashesOnExecute(ReferenceBackend):
    """Ends its process from execute(), with the status of a segfault (139)."""

    name = "crashes_on_execute"

    def execute(self, handle, inputs):
        import os

        os._exit(139)


class HangsOnExecute(ReferenceBackend):
    """Never returns from execute()."""

    name = "hangs_on_execute"

    def execute(self, handle, inputs):
        import time

        time.sleep(3600)


class MutatesInputs(ReferenceBackend):
    """Uses its float inputs as scratch space after computing the outputs."""

    name = "mutates_inputs"

    def execute(self, handle, inputs):
        outputs = super().execute(handle, inputs)
        for value in inputs:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                value.add_(1)
        return outputs


class Nondeterministic(ReferenceBackend):
    """Adds noise far below any tolerance to float outputs: parity passes, bit-identity does not."""

    name = "nondeterministic"

    def execute(self, handle, inputs):
        return [
            out + torch.randn_like(out) * 1e-6 if isinstance(out, torch.Tensor) and out.is_floating_point() else out
            for out in super().execute(handle, inputs)
        ]


class NotThreadSafe(ReferenceBackend):
    """Declares thread_safe but keeps each call's inputs in one shared attribute, without a lock."""

    name = "not_thread_safe"

    def execute(self, handle, inputs):
        import time

        self._scratch = list(inputs)
        time.sleep(0.002)  # widens the window, so that calls from threads overlap every time
        return super().execute(handle, self._scratch)


_LEAKED: list = []


class LeaksMemory(ReferenceBackend):
    """Keeps a 256 KiB buffer per call, never freed (a per-call cache without eviction)."""

    name = "leaks_memory"

    def execute(self, handle, inputs):
        _LEAKED.append(torch.ones(1 << 16))
        return super().execute(handle, inputs)


class CopiesStackTracesIntoBlob(ReferenceBackend):
    """preprocess() appends each node's stack trace to its blob ("for better device logs").

    Fails: symbolication debug_info_apart[*] (the handles-only archive holds source lines and file names).
    """

    name = "copies_stack_traces"
    MARK = b"\n#backendconf-traces\n"

    def preprocess(self, program, compile_spec, debug_handles):
        blob = super().preprocess(program, compile_spec, debug_handles)
        traces = "\n".join(n.meta.get("stack_trace") or "" for n in program.graph.nodes)
        return blob + self.MARK + traces.encode("utf-8")

    def compile(self, processed, method_compile_spec):
        stripped = {k: v.split(self.MARK)[0] for k, v in processed.items()}
        return super().compile(stripped, method_compile_spec)
