"""Export a ``torch.export`` program to an ONNX blob (host only): the backend's ``preprocess``.

The program goes through PyTorch's own ONNX exporter (``torch.onnx``, the
``ExportedProgram`` path, with onnxscript's torchlib), run here step by step
(decompose, check dispatch, translate) so that the torchlib registry is
built once per process and decompositions are cached; then through our
passes on the ONNX IR (``passes``: names and debug handles, float16 and
bfloat16, fault flag, determinism); then ONNX Runtime checks that it can
load the model.

Every ONNX node is traced back to the FX node of the *given* program it
came from through the provenance the exporter records
(``node.meta["from_node"]``). An op the exporter has no translation for, or
that ONNX Runtime has no kernel for, is rejected with ``UnsupportedNodeError``
at that FX node, so the user sees their own source line; a translation that
crashes, or a model ONNX Runtime refuses otherwise, is the engine failing on
an op it claims: ``CompilerError`` at the node it names, or, naming none, a
plain error (the harness then says it cannot tell). Every node the exporter's
dispatch check would reject is named in one error, and those that no
decomposition rewrites are found before decomposing (most of an export's
cost), from torchlib's registry alone.

This module, ``passes``, ``torch.onnx``, ``onnxscript``, ``onnx_ir`` and
``onnx`` are host-only: the target loads blobs with onnxruntime alone.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.fx

from pytest_backendconf import (
    CompilerError,
    UnsupportedNodeError,
    check_compile_spec_keys,
    check_functional_signature,
)
from pytest_backendconf.backend import FAULT_KEY, fault_node_name as requested_fault_node

from pytest_backendconf.provenance import ProgramNodes, graph_modules

from . import blob as blob_format
from ._compat import (
    ExporterSteps,
    decomposed_targets,
    exporter_steps,
    has_composite_kernel,
    is_higher_order_op,
    op_schema,
    torchlib_registry,
)
from .passes import ModelBuilder

#: Every compile-spec key this backend understands.
KNOWN_KEYS = (FAULT_KEY,)

_SUPPORTED_DTYPES = frozenset(blob_format.DTYPES)

_registry_lock = threading.Lock()
_registry: Any = None
# torch.onnx's exporter keeps module-level state (a global "exporting" flag,
# the tracer of torchlib functions): one export at a time per process.
_export_lock = threading.Lock()
# Decomposing a program (torch.export's run_decompositions) is most of the
# cost of an export, and the same program is often preprocessed again (with
# another compile spec, fresh debug handles, or to check determinism): keep
# the decomposed program while the given one lives, and while its graph and
# weights are unchanged.
_decomposed: "weakref.WeakKeyDictionary[Any, tuple[tuple, Any]]" = weakref.WeakKeyDictionary()


def export_program(
    program: torch.export.ExportedProgram,
    compile_spec: Mapping[str, Any] | None,
    debug_handles: Mapping[torch.fx.Node, int],
) -> bytes:
    """Export one method's program to a blob; the same arguments give the same bytes."""
    fault_name = fault_node_name(compile_spec)
    originals = ProgramNodes(program)
    fault_node = originals.fault_node(fault_name) if fault_name else None
    check_functional_signature(
        program,
        "onnxruntime",
        engine="ONNX",
        dtypes=_SUPPORTED_DTYPES,
        nodes=originals.nodes,
        fallback_node=originals.output,
    )
    with _export_lock:
        model = _to_onnx_ir(program, originals)
    from onnx_ir import serde

    builder = ModelBuilder(model, program, originals, debug_handles)
    header = builder.finish(fault_node)
    if "" not in model.opset_imports:
        # A program without ops (`mean` over a dimension of size 1, kept: the input is the output)
        # comes out with no nodes, and so no opset import, which ONNX Runtime refuses to load.
        model.opset_imports[""] = _DEFAULT_OPSET
    data = serde.serialize_model(model).SerializeToString(deterministic=True)
    _check_loads(data, builder)
    return blob_format.encode(header, data)


#: The ONNX opset of a model without nodes: the one torch.onnx's exporter writes (its torchlib's).
_DEFAULT_OPSET = 18

# --- compile spec ------------------------------------------------------------------


def fault_node_name(compile_spec: Mapping[str, Any] | None) -> str | None:
    """Validate the compile spec; return the node named for fault injection, if any."""
    return requested_fault_node(check_compile_spec_keys(compile_spec, KNOWN_KEYS, "onnxruntime"))


# --- the given program's nodes ------------------------------------------------------


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


# --- torch.onnx ---------------------------------------------------------------------


def _onnx_registry() -> Any:
    """torchlib's registry of ATen → ONNX functions, built once (it takes seconds)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            with _quiet_exporter():
                _registry = torchlib_registry()
        return _registry


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's informational warnings (e.g. "torchvision is not installed")."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _to_onnx_ir(program: torch.export.ExportedProgram, originals: ProgramNodes) -> Any:
    """The exporter's ONNX IR model of ``program`` (an ``onnx_ir.Model``).

    This is ``torch.onnx.export(program, dynamo=True, optimize=False)`` in
    its three steps (decompose, check dispatch, translate) so that the
    torchlib registry is built once per process rather than once per export
    (it takes seconds), decompositions are cached, and a failing node is
    known. The step functions are internal to torch.onnx (see `_compat`);
    where they are missing, the public ``torch.onnx.export`` is used instead.
    """
    steps = exporter_steps()
    if steps is None:
        return _to_onnx_ir_public(program, originals)

    registry = _onnx_registry()
    with _quiet_exporter(), steps.exporting():
        # Every node the dispatch check below would reject and that no decomposition rewrites is known
        # before decomposing (most of an export's cost): rejected at once, all of them.
        kept = _decomposed_targets(registry)
        early = _untranslatable((n for n in originals.nodes if _kept_as_is(n, kept)), originals, registry, steps)
        if early:
            raise UnsupportedNodeError(rejections=early)
        decomposed = _decompose(program, originals, registry, steps)
        # What the exporter would fail on: an op with no ONNX function (every such node, in one error).
        late = _untranslatable(
            (n for _, gm in graph_modules(decomposed.graph_module) for n in gm.graph.nodes), originals, registry, steps
        )
        if late:
            raise UnsupportedNodeError(rejections=late)
        try:
            onnx_program = steps.translate(decomposed, registry=registry)
        except Exception as exc:
            raise _rejection(exc, originals, decomposed) from exc
    return onnx_program.model


def _to_onnx_ir_public(program: torch.export.ExportedProgram, originals: ProgramNodes) -> Any:
    """The same through the public API: slower, and failures are mapped from their text only."""
    try:
        with _quiet_exporter(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnx_program = torch.onnx.export(program, (), dynamo=True, optimize=False, verbose=False)
    except Exception as exc:
        raise _rejection(exc, originals, None) from exc
    return onnx_program.model


def _decompose(program: Any, originals: ProgramNodes, registry: Any, steps: ExporterSteps) -> Any:
    """The program decomposed to what torchlib translates, with explicit type promotion (cached)."""
    key = originals.fingerprint()
    cached = _decomposed.get(program)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        with warnings.catch_warnings():
            # torch's own deprecation noise from inside run_decompositions.
            warnings.simplefilter("ignore", FutureWarning)
            decomposed = steps.prepare(program, registry=registry)
    except Exception as exc:
        raise _rejection(exc, originals, None) from exc
    _spell_out_full_reductions(decomposed)
    _decomposed[program] = (key, decomposed)
    return decomposed


# Reductions whose torchlib translation requires ``dim`` although ATen's
# default (``dim=[]``) means "every dimension".
_FULL_REDUCTIONS = ("amax", "amin")


def _spell_out_full_reductions(decomposed: Any) -> None:
    """Rewrite ``amax(x)``/``amin(x)`` as ``amax(x, [0, …, ndim-1])`` in our decomposed copy.

    torchlib's ``aten_amax``/``aten_amin`` (onnxscript 0.7) reject a missing
    ``dim``; naming every dimension is the same reduction.
    """
    targets = {getattr(torch.ops.aten, name).default for name in _FULL_REDUCTIONS}
    for _, graph_module in graph_modules(decomposed.graph_module):
        changed = False
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target not in targets:
                continue
            args = list(node.args)
            dim = args[1] if len(args) > 1 else node.kwargs.get("dim", [])
            value = getattr(args[0], "meta", {}).get("val")
            if dim or not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue
            keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
            node.args = (args[0], list(range(value.dim())), keepdim)
            node.kwargs = {}
            changed = True
        if changed:
            graph_module.recompile()


def _untranslatable(
    nodes: Iterator[torch.fx.Node], originals: ProgramNodes, registry: Any, steps: ExporterSteps
) -> list[tuple[torch.fx.Node, str]]:
    """The given program's nodes behind ``nodes`` that torchlib has no ONNX function for, with the reason.

    ``nodes`` are the decomposed program's (or the given program's own); each
    failing one is named at the node of the given program it comes from, once.
    """
    found: dict[torch.fx.Node, str] = {}
    for node in nodes:
        if node.op != "call_function" or _is_passthrough(node):
            continue
        function, message = steps.dispatch(node, registry)
        if function is None:
            culprit = originals.origin(node) or originals.output
            found.setdefault(
                culprit, f"torch.onnx has no ONNX translation of {node.target} (from {_describe(culprit)}): {message}"
            )
    return list(found.items())


_kept_lock = threading.Lock()
_kept: dict[int, frozenset] = {}


def _decomposed_targets(registry: Any) -> frozenset:
    """The ops the decomposition step rewrites, for this registry (built once: it walks every decomposition)."""
    with _kept_lock:
        if id(registry) not in _kept:
            _kept[id(registry)] = decomposed_targets(registry)
        return _kept[id(registry)]


#: What the exporter removes after decomposing (``_fx_passes.remove_assertion_nodes``), never dispatched.
_DROPPED_BY_EXPORTER = frozenset(
    {
        "aten::sym_constrain_range_for_size",
        "aten::_assert_async",
        "aten::_assert_scalar",
        "aten::_assert_tensor_metadata",
    }
)


def _kept_as_is(node: torch.fx.Node, decomposed: frozenset) -> bool:
    """Whether the exporter's decomposition leaves ``node`` as it is, so its dispatch can be asked before.

    Only a used, functional ATen op overload that the exporter does not
    drop, with neither a decomposition in the exporter's table nor a
    CompositeImplicitAutograd kernel (which tracing may inline); anything
    else is judged after decomposing, as before.
    """
    target = node.target
    schema = op_schema(target)
    if node.op != "call_function" or schema is None or not node.users:
        return False  # not an op, or dead code that the exporter's retracing drops
    if not schema.name.startswith("aten::") or schema.name in _DROPPED_BY_EXPORTER:
        return False  # other namespaces (quantization's, custom ops) may be handled otherwise
    if target in decomposed or has_composite_kernel(target):
        return False
    return not schema.is_mutable


def _is_passthrough(node: torch.fx.Node) -> bool:
    import operator

    target = node.target
    return target is operator.getitem or is_higher_order_op(target)


_TRANSLATING = re.compile(r"Error when translating node (%\S+ : .*?)\. See the stack trace")


def _rejection(exc: BaseException, originals: ProgramNodes, decomposed: Any) -> Exception:
    """An exporter failure on an op it has a translation for: a ``CompilerError`` at the node it names (the
    backend claims the op; its exporter broke), else a ``RuntimeError`` naming no node (undecided)."""
    culprit = None
    text = str(exc)
    match = _TRANSLATING.search(text) or _search_chain(exc)
    if match is not None:
        formatted = match.group(1)
        # The node is one of the decomposed program's; without it, try ours by name.
        modules = [gm for _, gm in graph_modules(decomposed.graph_module)] if decomposed else []
        candidates = [n for gm in modules for n in gm.graph.nodes] or originals.nodes
        for node in candidates:
            if node.format_node() == formatted or formatted.startswith(f"%{node.name} :"):
                culprit = originals.origin(node)
                break
    cause = _innermost(exc)
    reason = f"torch.onnx cannot export it: {type(cause).__name__}: {_first_line(cause)}"
    if culprit is None:
        return RuntimeError(f"torch.onnx could not export the program, naming no node: {reason}")
    return CompilerError(culprit, reason)


def _search_chain(exc: BaseException) -> re.Match | None:
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 20:
        match = _TRANSLATING.search(str(current))
        if match:
            return match
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _innermost(exc: BaseException) -> BaseException:
    seen = 0
    while (exc.__cause__ or exc.__context__) is not None and seen < 20:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else "(no message)"


def _describe(node: torch.fx.Node) -> str:
    return f"FX node {node.name!r}, {node.target}" if node.op == "call_function" else f"FX node {node.name!r}"


# --- ONNX Runtime's verdict ------------------------------------------------------------------

_NODE_NAME = re.compile(r"[Nn]ame:? ?'([^']*)'")
# "NOT_IMPLEMENTED : Could not find an implementation for Cos(7) node with name 'cos'"
_NO_KERNEL = re.compile(r"NOT_IMPLEMENTED|Could not find an implementation for")


def _check_loads(data: bytes, builder: ModelBuilder) -> None:
    """Reject, at its FX node, a model ONNX Runtime cannot load (e.g. a missing kernel).

    ``compile`` must not fail where the backend is available (docs/backend-contract.md
    of pytest-backendconf, "Availability"), so the check happens here, where the user's source line can be
    shown. Skipped when onnxruntime is not installed on the host.
    """
    try:
        from .runtime import create_session
    except ImportError:
        return
    try:
        create_session(data)
    except ImportError:
        return
    except Exception as exc:  # onnxruntime's exception types are not public API
        text = str(exc)
        culprit = None
        for name in _NODE_NAME.findall(text):
            culprit = builder.node_by_name.get(name)
            if culprit is not None:
                break
        reason = f"ONNX Runtime cannot load the exported model: {text.strip().splitlines()[0][:500]}"
        if _NO_KERNEL.search(text):
            # No kernel for the op (or its dtypes): ONNX Runtime does not run it, so the backend does not claim it.
            raise UnsupportedNodeError(culprit or builder.originals.output, reason) from None
        if culprit is None:
            raise RuntimeError(f"{reason} (no node named)") from None
        raise CompilerError(culprit, reason) from None
