"""Helpers for a backend's own code: the checks every ``preprocess`` repeats, and a cached availability probe.

Each backend of this project (the reference backend, ONNX Runtime,
OpenVINO, ExecuTorch, IREE) used to carry its own copy of these; a vendor's
backend may use them too::

    import pytest_backendconf as bc

    KNOWN_KEYS = (bc.backend.FAULT_KEY, "precision")  # docs/writing-a-backend.md

    class MyBackend:
        name = "mybackend"

        def __init__(self):
            self._availability = bc.AvailabilityProbe(probe_my_runtime)  # returns "" or why not

        def is_available(self):
            return not self._availability.reason()

        def unavailable_reason(self):
            return self._availability.reason()

        def preprocess(self, program, compile_spec, debug_handles):
            spec = bc.check_compile_spec_keys(compile_spec, KNOWN_KEYS, self.name)
            bc.check_functional_signature(program, self.name, engine="MyEngine")
            ...

A backend over an engine whose runtime loads one blob per method may
start from `EngineBackend`, which holds the availability probe, ``compile``
and ``execute`` such a backend repeats.

Importing this module never imports torch (`check_functional_signature`
imports it when called).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .blobs import checked_handle, compile_each

if TYPE_CHECKING:
    import torch


def check_compile_spec_keys(compile_spec: object, known_keys: Iterable[str], backend: str) -> Mapping[str, Any]:
    """``compile_spec`` as a mapping whose keys are all in ``known_keys`` (``None`` is an empty spec).

    A misspelt key silently ignored would make a test pass for the wrong
    reason, so an unknown key is a `ValueError` naming the key, the backend
    and the keys it knows; a spec that is not a mapping is a `ValueError`
    naming its type.

    :param compile_spec: what ``preprocess`` was given.
    :param known_keys: every key the backend understands (`backend.FAULT_KEY` too, if it injects faults).
    :param backend: the backend's name, as the error texts show it.
    """
    if compile_spec is None:
        return {}
    if not isinstance(compile_spec, Mapping):
        raise ValueError(f"the {backend} backend's compile spec must be a dict, not {type(compile_spec).__name__}")
    known = tuple(known_keys)
    unknown = sorted(str(k) for k in compile_spec if k not in known)
    if unknown:
        raise ValueError(
            f"unknown compile-spec key {unknown[0]!r} for the {backend} backend; "
            f"known keys: {', '.join(repr(k) for k in known)}"
        )
    return compile_spec


def check_functional_signature(
    program: torch.export.ExportedProgram,
    backend: str,
    *,
    engine: str,
    dtypes: Collection[str] | None = None,
    nodes: Iterable[torch.fx.Node] | None = None,
    fallback_node: torch.fx.Node | None = None,
) -> None:
    """Reject, at their own node, what a runtime of plain tensors in and out cannot run.

    Raises `UnsupportedNodeError` for a program that updates a buffer or an
    input in place (export in eval mode), an output or a user input that is
    neither a tensor nor a constant, an input of kind ``CUSTOM_OBJ`` or
    ``TOKEN``, and, when ``dtypes`` is given, a node whose value has a dtype
    outside it.

    :param backend: the backend's name, as the error texts show it.
    :param engine: the runtime's name in "input kind TOKEN has no <engine> equivalent".
    :param dtypes: the dtype names (``"float32"``, ...) the backend runs; None: any.
    :param nodes: the nodes whose dtypes are checked (default: every node of the graph).
    :param fallback_node: the node an error names when the signature's argument has none
        (default: the graph's output node).
    """
    from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind, TensorArgument

    from .errors import UnsupportedNodeError

    graph = program.graph_module.graph
    by_name = {node.name: node for node in graph.nodes}
    fallback = fallback_node if fallback_node is not None else graph.output_node()
    values = (TensorArgument, ConstantArgument)
    for spec in program.graph_signature.output_specs:
        node = by_name.get(getattr(spec.arg, "name", None)) or fallback
        if spec.kind != OutputKind.USER_OUTPUT:
            raise UnsupportedNodeError(
                node,
                f"the program updates {spec.target!r} in place ({spec.kind.name}); the {backend} "
                "backend runs functional programs only (export in eval mode)",
            )
        if not isinstance(spec.arg, values):
            raise UnsupportedNodeError(
                node, f"output {spec.arg} is a {type(spec.arg).__name__}, not a tensor or a constant"
            )
    for spec in program.graph_signature.input_specs:
        node = by_name.get(getattr(spec.arg, "name", None)) or fallback
        if spec.kind in (InputKind.CUSTOM_OBJ, InputKind.TOKEN):
            raise UnsupportedNodeError(node, f"input kind {spec.kind.name} has no {engine} equivalent")
        if spec.kind == InputKind.USER_INPUT and not isinstance(spec.arg, values):
            raise UnsupportedNodeError(node, f"input {spec.arg} is a {type(spec.arg).__name__}, not a tensor")
    if dtypes is None:
        return
    for node in graph.nodes if nodes is None else nodes:
        for tensor in _tensors(node.meta.get("val")):
            if str(tensor.dtype).removeprefix("torch.") not in dtypes:
                raise UnsupportedNodeError(node, f"dtype {tensor.dtype} is not supported by the {backend} backend")


def clamp_scatter_indices(module: torch.fx.GraphModule) -> int:
    """Clamp the indices of each ``index_copy`` and ``index_put`` (in place or not) of ``module`` (and its subgraphs) into
    range, in place; return how many indices were clamped.

    For an engine whose scatter kernel has no bounds check (OpenVINO's
    ScatterUpdate, IREE's scatter): an index past the end writes past the
    tensor. A KV cache written one position past its end (eager raises
    IndexError) corrupted the heap, and a later, unrelated call crashed the
    process or, worse, could have computed on corrupted memory. Clamped, such
    a write lands on the last row instead: wrong, as the check reports, but
    memory-safe. In-range indices are unchanged (``index_put`` keeps negative
    indices: its range is ``-size .. size - 1``); a dimension of symbolic
    size, and a boolean mask, are left alone. Each clamp carries the
    scatter's own metadata (its source line and provenance).
    """
    import torch

    from .provenance import graph_modules

    aten = torch.ops.aten
    # The functional ops and, in a program of torch.export's training dialect, the in-place ones.
    copies = (aten.index_copy.default, aten.index_copy_.default)
    puts = (aten.index_put.default, aten.index_put_.default)
    clamps: list[torch.fx.Node] = []
    for _, gm in graph_modules(module):
        before = len(clamps)
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in copies + puts:
                continue
            target, *rest = node.args
            value = target.meta.get("val") if isinstance(target, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor):
                continue
            if node.target in puts:  # index_put(self, indices, values, ...): its range is -size .. size - 1
                indices = [_clamped(node, index, value, dim, None, clamps) for dim, index in enumerate(rest[0])]
                node.args = (target, indices, *rest[1:])
            else:  # index_copy(self, dim, index, source): no negative index
                dim = int(rest[0]) % max(value.dim(), 1)
                node.args = (target, rest[0], _clamped(node, rest[1], value, dim, 0, clamps), *rest[2:])
        if len(clamps) > before:
            gm.recompile()
    return len(clamps)


def _clamped(
    scatter: torch.fx.Node, index: object, value: torch.Tensor, dim: int, low: int | None, clamps: list
) -> object:
    """``index`` clamped into dimension ``dim`` of ``value`` by a node before ``scatter`` (appended to
    ``clamps``); ``index`` itself when it is no node of positions or the size is symbolic."""
    import torch

    if not isinstance(index, torch.fx.Node):
        return index
    index_value = index.meta.get("val")
    size = value.shape[dim] if dim < value.dim() else None
    if not isinstance(size, int) or not isinstance(index_value, torch.Tensor):
        return index
    if index_value.dtype in (torch.bool, torch.uint8):  # a mask, not positions
        return index
    graph = scatter.graph
    with graph.inserting_before(scatter):
        clamp = graph.call_function(torch.ops.aten.clamp.default, (index, -size if low is None else low, size - 1))
    # The scatter's source line and provenance; the index's value and type.
    clamp.meta = {k: v for k, v in scatter.meta.items() if k != "tensor_meta"}
    clamp.meta.update({k: index.meta[k] for k in ("val", "tensor_meta") if k in index.meta})
    clamps.append(clamp)
    return clamp


def _tensors(value: object) -> Iterable[torch.Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


class AvailabilityProbe:
    """A backend's availability probe, run on the first question and its answer kept.

    Probing imports the engine (seconds, or a native library that fails to
    load), so a backend runs it when first asked, not when its plugin is
    imported, and answers every later ``is_available()`` from the kept text.
    Two threads asking at once may both probe; the answers are the same.

    :param probe: returns ``""`` when the backend can run in this process,
        else why not and how to fix it (shown by ``unavailable_reason()``).
    """

    def __init__(self, probe: Callable[[], str]) -> None:
        self._probe = probe
        self._reason: str | None = None

    def cache_identity(self) -> str:
        """Nothing for the preprocess cache's key: whether the engine loads here changes no blob."""
        return ""

    def reason(self) -> str:
        """``""`` when the backend can run here, else why not (probed once)."""
        if self._reason is None:
            self._reason = self._probe()
        return self._reason


class EngineBackend:
    """The delegate-backend protocol around an engine's runtime, less what differs per engine.

    A subclass sets ``name``, ``version``, ``capabilities`` and
    ``runtime_module``, and defines ``preprocess`` and ``_probe`` (``""``
    when the engine runs here, else why not and how to fix it). The runtime
    module, imported only where a method is loaded, has ``load(blob)``
    (a ``ValueError`` for a bad blob) returning a ``CompiledMethod``, whose
    ``run(inputs)`` returns the flat outputs.
    """

    name: str
    version: str
    #: The module (target side) with ``load`` and ``CompiledMethod``, e.g. ``"backendconf_iree.runtime"``.
    runtime_module: str

    def __init__(self) -> None:
        self._availability = AvailabilityProbe(self._probe)

    def _probe(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define _probe()")

    def is_available(self) -> bool:
        """True when the engine's runtime loads here (``_probe``, asked once)."""
        return not self.unavailable_reason()

    def unavailable_reason(self) -> str:
        """Why ``is_available()`` is false; empty when it is true."""
        return self._availability.reason()

    def compile(self, processed: dict[str, bytes], method_compile_spec: dict[str, dict]) -> dict[str, Any]:
        """One loaded method per blob; a bad blob raises ``ValueError`` naming the method.

        Everything the runtime needs is in the blob, so this is a pure load
        that works on a target without the engine's host-only parts.
        """
        return compile_each(processed, self._runtime().load)

    def execute(self, handle: Any, inputs: list) -> list:
        """Run a compiled method on its flat user inputs; return the flat outputs."""
        compiled = checked_handle(handle, self._runtime().CompiledMethod, f"{type(self).__name__}.compile")
        return compiled.run(inputs)

    def _runtime(self) -> Any:
        # Imported here, not with the backend: the runtime needs the engine, which may be missing.
        return importlib.import_module(self.runtime_module)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.version}>"
