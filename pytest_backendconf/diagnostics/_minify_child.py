"""The minimiser's backend host: lowers and runs candidate sub-programs in a child process.

A candidate can crash the process or hang in the backend, so none runs in
the caller's process. The child (`target.ChildProcess`, the same machinery
as the suite's backend host) loads the whole program once from a file
``torch.export.save`` wrote, runs it eagerly over the inputs to get every
intermediate, and then answers one request per candidate: the names of the
nodes to keep. Each candidate is `piece_program` of those nodes (every value
from outside them is an input fed with its eager value), lowered whole to
the backend, run, and compared with eager.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: ``aten::gelu``, ``aten.gelu.default``, ``aten.gelu``: an operator named in an error message.
_OP_IN_TEXT = re.compile(r"\baten(?:::|\.)([A-Za-z0-9_]+)")


def op_name(node: torch.fx.Node) -> str:
    """``aten::gelu``: the operator of a ``call_function`` node, as debug infos name it."""
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        return str(schema.name)
    return getattr(node.target, "__name__", str(node.target))


def ops_in_text(text: str) -> set[str]:
    """The ``aten`` operators a message names (``{"gelu"}``), overload and spelling aside."""
    return set(_OP_IN_TEXT.findall(text or ""))


class CandidateHandler:
    """In the child: the program, its eager intermediates, and the backend; runs one candidate per request."""

    def __init__(self, options: dict, channel: object) -> None:
        import torch

        from ..archive import read_tensors
        from ..registry import BackendRegistry, active_registry, set_active_registry
        from ._divergence import eager_intermediates
        from ..numerics import Tolerance

        # Torch's thread count is the parent's (set by the child protocol): the failure being
        # minimised was seen at that count.
        registry = active_registry() or BackendRegistry()
        registry.load_entry_points(select=options["backend"])
        set_active_registry(registry)
        self.backend = registry.get(options["backend"]).backend
        self.program = torch.export.load(options["program"])
        tensors, _ = read_tensors(options["inputs"])
        inputs = [tensors[f"input{i}"] for i in range(len(tensors))]
        self.env = eager_intermediates(self.program, inputs)
        self.nodes = {n.name: n for n in self.program.graph_module.graph.nodes}
        tolerance = options.get("tolerance")
        self.tolerance = None if tolerance is None else Tolerance(float(tolerance[0]), float(tolerance[1]), "given")

    def __call__(self, request: dict, channel: object) -> dict:
        from ..target import error_record
        from ._divergence import _tolerance_of, run_on_backend
        from ..numerics import StructureMismatch, compare_outputs, worst

        nodes = [self.nodes[name] for name in request["nodes"]]
        try:
            results = run_on_backend(nodes, self.env, self.backend)
        except Exception as exc:  # the candidate's failure is what the minimiser looks for
            return {"outcome": "raised", "error": error_record(exc)}
        for node, actual, expected in results:
            tolerance = self.tolerance or _tolerance_of(expected)
            try:
                closeness = compare_outputs(actual, expected, tolerance)
            except StructureMismatch as exc:
                return {"outcome": "raised", "error": error_record(exc)}
            bad = [c for c in closeness if not c.passed]
            if bad:
                top = worst(bad)
                assert top is not None
                return {"outcome": "diverged", "node": node.name, "op": op_name(node), "max_abs": top.max_abs}
        return {"outcome": "passed"}
