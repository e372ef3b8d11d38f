"""Shrink a failing program to the smallest sub-program that still fails the same way.

The search works on sets of the program's operator nodes. Any set is a
program: `piece_program` turns every value from outside the set into an
input fed with its eager value, so dropping nodes from the end, replacing
the nodes before a piece by their eager outputs, and delta debugging over
the rest are all "keep these nodes". The order of the search keeps the
expensive candidates few: a candidate that crashes or hangs costs a fresh
child process (a torch import) or a timeout, a passing one a small lowering.

1. each node alone, in program order (a backend that fails on one operator
   stops here, after one failing candidate);
2. the whole program (does the failure reproduce outside its check?);
3. the shortest failing prefix (bisection: nodes removed from the end);
4. the longest failing suffix of that prefix (the nodes before it become
   inputs with their eager values);
5. delta debugging (``ddmin``) over what is left.

Every candidate runs in a child process (`_minify_child`), within one total
time budget; when it runs out the smallest failing program found so far is
the result, marked as such.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from ..backend import Backend
    from ..target import ChildProcess

#: Seconds ``bc.minify`` and the suite spend on one failure (``--backendconf-minify-budget``).
DEFAULT_BUDGET = 60.0
#: Seconds a candidate may run before it counts as hanging, when the caller gives no timeout.
DEFAULT_CANDIDATE_TIMEOUT = 30.0
#: Seconds the minimiser's child may take to import torch and the backend.
STARTUP_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How running one candidate on the backend ended.

    :param kind: ``passed``, ``raised``, ``diverged``, ``crashed`` or ``timed_out``.
    :param returncode: of a crash: the exit code, or minus the signal.
    :param error_type: of ``raised``: the exception's class name.
    :param message: of ``raised``: its message; of a crash or hang, how the process ended.
    :param op: of ``diverged``: the first out-of-tolerance node's operator (``aten::gelu``).
    """

    kind: str
    returncode: int | None = None
    error_type: str = ""
    message: str = ""
    op: str = ""
    max_abs: float | None = None

    def text(self) -> str:
        """One line: ``crashed: was killed by signal 11 (SIGSEGV)``, ``raised LoweringError: …``."""
        if self.kind == "raised":
            first = (self.message.splitlines() or [""])[0]
            return f"raised {self.error_type}: {first}"
        if self.kind == "diverged":
            return f"diverged at {self.op} (max abs error {self.max_abs:.3g})"
        return f"{self.kind}: {self.message}" if self.message else self.kind


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A sub-program the minimiser tried: its nodes (names, program order), their operators, how it ran."""

    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    outcome: Outcome


@dataclasses.dataclass
class Reproduction:
    """What `minify` found: the smallest failing program and its inputs.

    ``program`` is ``None`` when the failure did not reproduce (the whole
    program passed ``still_fails`` false) or the budget ran out before any
    candidate failed. ``program, inputs = bc.minify(...)`` unpacks it.
    """

    program: ExportedProgram | None
    inputs: list[torch.Tensor]
    #: The failing candidate the program was made of (``None`` with no program).
    candidate: Candidate | None
    #: Operator nodes of the whole program, and how many candidates ran.
    original_nodes: int
    tried: int
    seconds: float
    #: The budget ran out: the program is the smallest found, not necessarily minimal.
    budget_ran_out: bool = False
    #: Per output of ``program``, the operator of the node it comes from (for messages and scripts).
    output_ops: list[str] = dataclasses.field(default_factory=list)

    @property
    def ops(self) -> tuple[str, ...]:
        """The operator sequence of the minimal program (``("aten::convolution", "aten::gelu")``)."""
        return self.candidate.ops if self.candidate is not None else ()

    def __iter__(self) -> Iterator[ExportedProgram | list[torch.Tensor] | None]:
        yield self.program
        yield self.inputs


def minify(
    program: ExportedProgram,
    backend: str | Backend,
    inputs: Sequence[torch.Tensor],
    still_fails: Callable[[Candidate], bool],
    *,
    budget: float = DEFAULT_BUDGET,
    timeout: float | None = None,
    tolerance: tuple[float, float] | None = None,
    plugins: Sequence[str] | None = None,
) -> Reproduction:
    """Shrink ``program`` to a minimal sub-program for which ``still_fails(candidate)`` holds.

    :param program: a ``torch.export.ExportedProgram`` that fails on ``backend``.
    :param backend: a registered backend's name, or a registered backend object
        (the candidates run in a child process, which finds it by name).
    :param inputs: the program's flat user inputs (tensors).
    :param still_fails: called with each `Candidate` (its ``outcome``:
        ``passed``, ``raised``, ``diverged``, ``crashed``, ``timed_out``);
        true when it fails the way the original did.
    :param budget: total seconds; when they run out the smallest failing
        program found so far is returned, with ``budget_ran_out`` set.
    :param timeout: seconds one candidate may run before it counts as hanging.
    :param tolerance: ``(rtol, atol)`` of the comparison with eager; default:
        the suite's parity default for each output's dtype.
    :param plugins: modules or ``conftest.py`` paths that register the
        backend in the child; default: those of the running pytest session.
    """
    import torch

    from ..archive import write_tensors
    from ._divergence import eager_intermediates, piece_program

    name = backend if isinstance(backend, str) else getattr(backend, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"minify() needs a registered backend's name or object, got {type(backend).__name__}")
    flat = list(inputs)
    for i, value in enumerate(flat):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"minify(): input {i} is a {type(value).__name__}; pass the program's flat user inputs, "
                "tensors only (numbers are baked into an exported program)"
            )
    graph = program.graph_module.graph
    order = [n for n in graph.nodes if _cuttable(n)]
    env = eager_intermediates(program, flat)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="backendconf-minify-") as work:
        program_path = Path(work, "program.pt2")
        inputs_path = Path(work, "inputs.safetensors")
        torch.export.save(program, str(program_path))
        write_tensors(inputs_path, {f"input{i}": t for i, t in enumerate(flat)})
        runner = _Runner(
            {"backend": name, "program": str(program_path), "inputs": str(inputs_path), "tolerance": tolerance},
            plugins,
        )
        search = _Search(runner, {n.name: n for n in order}, still_fails, started + budget, timeout)
        try:
            found = search.run([n.name for n in order])
        finally:
            runner.close()
    if found is None:
        return Reproduction(None, [], None, len(order), search.tried, time.monotonic() - started, search.out_of_time)
    by_name = {n.name: n for n in order}
    piece, piece_inputs, outputs = piece_program([by_name[n] for n in found.nodes], env)
    output_ops = [op for node, items in outputs for op in [_op(node)] * len(items)]
    return Reproduction(
        piece,
        piece_inputs,
        found,
        len(order),
        search.tried,
        time.monotonic() - started,
        search.out_of_time,
        output_ops,
    )


def same_failure(target: Outcome) -> Callable[[Candidate], bool]:
    """The predicate "fails like ``target``": the same exit code or signal, a hang, the same
    exception type naming the same operator, a divergence at the same operator."""
    from ._minify_child import ops_in_text

    named = ops_in_text(target.message)

    def still_fails(candidate: Candidate) -> bool:
        got = candidate.outcome
        if got.kind != target.kind:
            return False
        if target.kind == "crashed":
            return got.returncode == target.returncode
        if target.kind == "raised":
            # Lowering wraps a backend's exception and names it ("…failed for method 'forward': KeyError: …"):
            # a check that called the backend directly saw the exception itself.
            if got.error_type != target.error_type and f"{target.error_type}: " not in got.message:
                return False
            # The same operator: the original named one; the candidate's message or its nodes must have it.
            return not named or bool(named & (ops_in_text(got.message) | ops_in_text(" ".join(candidate.ops))))
        if target.kind == "diverged":
            return _short(got.op) == _short(target.op)
        return True  # timed_out

    return still_fails


def _short(op: str) -> str:
    return op.split("::")[-1].split(".")[0]


def _op(node: torch.fx.Node) -> str:
    from ._minify_child import op_name

    return op_name(node)


def _cuttable(node: torch.fx.Node) -> bool:
    import operator

    from ._divergence import _localizable

    return node.op == "call_function" and node.target is not operator.getitem and _localizable(node)


class _OutOfTime(Exception):
    pass


class _Runner:
    """One child process for the candidates, replaced when a candidate crashes or hangs in it."""

    def __init__(self, options: dict, plugins: Sequence[str] | None) -> None:
        self.options = options
        self.plugins = plugins
        self.child: ChildProcess | None = None

    def run(self, nodes: list[str], timeout: float) -> Outcome | None:
        """How the candidate ended; ``None``: the child could not even start in time."""
        from ..target import ChildProcess, Ended

        if self.child is None or not self.child.alive:
            self.child = ChildProcess(
                "pytest_backendconf.diagnostics._minify_child:CandidateHandler",
                self.options,
                plugins=self.plugins,
                startup_timeout=STARTUP_TIMEOUT,
            )
            if not self.child.wait_ready():
                ended = self.child.ended
                assert ended is not None  # wait_ready is False when the child ended
                raise RuntimeError(f"the minimiser's child process {ended.describe()}: {ended.stderr[-2000:]}")
        result = self.child.request({"nodes": nodes}, timeout=timeout)
        if isinstance(result, Ended):
            self.child = None
            if result.timed_out is not None:
                return Outcome("timed_out", message=result.describe())
            return Outcome("crashed", returncode=result.returncode, message=result.describe())
        if "outcome" not in result:  # the handler itself failed (a bug here, not the backend's)
            error = result.get("error") or {}
            raise RuntimeError(f"the minimiser's child failed: {error.get('type')}: {error.get('message')}")
        if result["outcome"] == "raised":
            return Outcome("raised", error_type=result["error"]["type"], message=result["error"]["message"])
        if result["outcome"] == "diverged":
            return Outcome("diverged", op=result["op"], max_abs=result["max_abs"])
        return Outcome("passed")

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
            self.child = None


class _Search:
    def __init__(
        self,
        runner: _Runner,
        nodes: dict[str, torch.fx.Node],
        still_fails: Callable[[Candidate], bool],
        deadline: float,
        timeout: float | None,
    ) -> None:
        self.runner = runner
        self.nodes = nodes
        self.position = {name: i for i, name in enumerate(nodes)}
        self.still_fails = still_fails
        self.deadline = deadline
        self.timeout = timeout or DEFAULT_CANDIDATE_TIMEOUT
        self.seen: dict[tuple[str, ...], Candidate | None] = {}
        self.best: Candidate | None = None
        self.tried = 0
        self.out_of_time = False

    def fails(self, names: Sequence[str]) -> bool:
        key = tuple(sorted(names, key=self.position.__getitem__))
        if not key:
            return False
        if key not in self.seen:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _OutOfTime
            # A candidate cut short by the budget has not shown that it hangs.
            outcome = self.runner.run(list(key), min(self.timeout, left))
            if outcome is None or (outcome.kind == "timed_out" and left < self.timeout):
                raise _OutOfTime
            self.tried += 1
            candidate = Candidate(key, tuple(_op(self.nodes[n]) for n in key), outcome)
            failing = bool(self.still_fails(candidate))
            self.seen[key] = candidate if failing else None
            if failing and (self.best is None or len(key) < len(self.best.nodes)):
                self.best = candidate
        return self.seen[key] is not None

    def run(self, order: list[str]) -> Candidate | None:
        try:
            self._search(order)
        except _OutOfTime:
            self.out_of_time = True
        return self.best

    def _search(self, order: list[str]) -> None:
        for name in order:
            if self.fails([name]):
                return
        if not self.fails(order):
            return
        low, high = 0, len(order)  # order[:high] fails
        while high - low > 1:
            middle = (low + high) // 2
            if self.fails(order[:middle]):
                high = middle
            else:
                low = middle
        prefix = order[:high]
        low, high = 0, len(prefix) - 1  # prefix[low:] fails
        while high - low > 1:
            middle = (low + high) // 2
            if self.fails(prefix[middle:]):
                low = middle
            else:
                high = middle
        self._ddmin(prefix[low:])

    def _ddmin(self, items: list[str]) -> None:
        parts = 2
        while len(items) >= 2:
            size = -(-len(items) // parts)
            chunks = [items[i : i + size] for i in range(0, len(items), size)]
            for chunk in chunks:
                if self.fails(chunk):
                    items, parts = chunk, 2
                    break
            else:
                for chunk in chunks:
                    rest = [n for n in items if n not in chunk]
                    if self.fails(rest):
                        items, parts = rest, max(parts - 1, 2)
                        break
                else:
                    if parts >= len(items):
                        return
                    parts = min(len(items), parts * 2)
