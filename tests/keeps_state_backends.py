"""Backends that keep a stateful program's state themselves (``Capabilities(keeps_state=True)``).

``KeepsState`` is the eager backend (tests/eager_backends.py) on torch.export's
functional form, as the contract gives it to such a backend: a state is a
``BUFFER`` input and its new value a ``BUFFER_MUTATION`` output. Each
``compile()`` call makes one set of state tensors, from the initial values
in the blobs, shared by the methods compiled together (``prefill`` writes
the cache that ``decode`` reads); ``execute`` takes and returns the
caller's values only. The stateful category must pass it. The others break
one rule each:

- ``KeepsStateAcrossCompiles``: one set of state tensors for every
  ``compile()`` call of the process, so two instances share a cache and
  ``reset()`` (which compiles again) returns to nothing.
- ``KeepsStateNeverWritten``: drops each new value, so the state stays as
  exported.
"""

from __future__ import annotations

import pickle

import torch
from torch.export.graph_signature import InputKind, OutputKind

import pytest_backendconf as bc

from eager_backends import EagerBackend, _decode, _encode, _Interpreter


class KeepsState(EagerBackend):
    name = "keeps_state"
    capabilities = bc.Capabilities(keeps_state=True)

    def preprocess(self, program, compile_spec, debug_handles):
        signature = program.graph_signature
        values = {**program.state_dict, **program.constants}
        # Per input: ("user",), ("fixed", tensor) or ("buffer", fqn, initial value).
        inputs = []
        for spec in signature.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                inputs.append(("user",))
            elif spec.kind == InputKind.BUFFER:
                inputs.append(("buffer", spec.target, values[spec.target]))
            else:
                inputs.append(("fixed", values[spec.target]))
        # Per output: None for the caller's, or the fqn of the buffer it is the new value of.
        outputs = [spec.target if spec.kind == OutputKind.BUFFER_MUTATION else None for spec in signature.output_specs]
        other = [
            s.kind.name
            for s in signature.output_specs
            if s.kind not in (OutputKind.USER_OUTPUT, OutputKind.BUFFER_MUTATION)
        ]
        if other:
            raise ValueError(f"outputs of kind {other} are not supported: only the caller's and buffer mutations")
        return pickle.dumps((_encode(program.graph_module), inputs, outputs), protocol=4)

    def new_states(self):
        """The state tensors of one compile() call, filled from the blobs' initial values."""
        return {}

    def compile(self, processed, method_compile_spec):
        decoded = {method: pickle.loads(blob) for method, blob in processed.items()}
        written = {fqn for _, _, outputs in decoded.values() for fqn in outputs if fqn is not None}
        states = self.new_states()
        for _, inputs, _ in decoded.values():
            for item in inputs:
                if item[0] == "buffer" and item[1] in written:
                    states.setdefault(item[1], item[2].clone())
        return {
            method: (_decode(graph), inputs, outputs, states) for method, (graph, inputs, outputs) in decoded.items()
        }

    def execute(self, handle, inputs):
        module, fixed, outputs, states = handle
        given = iter(inputs)
        args = []
        for item in fixed:
            if item[0] == "user":
                args.append(next(given))
            elif item[0] == "buffer":
                args.append(states.get(item[1], item[2]))
            else:
                args.append(item[1])
        with torch.no_grad():
            results = _Interpreter(module, self.calls).run(*args)
        mine = []
        for value, fqn in zip(results, outputs):
            if fqn is None:
                mine.append(value)
            else:
                self.write(states, fqn, value)
        return mine

    def write(self, states, fqn, value):
        states[fqn] = value


_PROCESS_STATES: dict = {}


class KeepsStateAcrossCompiles(KeepsState):
    name = "keeps_state_across_compiles"

    def new_states(self):
        return _PROCESS_STATES


class KeepsStateNeverWritten(KeepsState):
    name = "keeps_state_never_written"

    def write(self, states, fqn, value):
        pass


@bc.hookimpl
def backendconf_register_backends(register):
    for backend in (KeepsState(), KeepsStateAcrossCompiles(), KeepsStateNeverWritten()):
        register(backend)
