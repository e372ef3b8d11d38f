"""`to_backend`: lower methods of a module to a backend.

The flow (docs/backend-contract.md): copy the module, export each method named in
the method compile spec, give every node a debug handle (numbered per lowering), ``preprocess`` each
program into a blob, ``compile`` now if the backend is available (else warn),
and return a `WrapperModule` around the `LoweredModule` that runs the blobs
(both in `_lowered_module`).
"""

from __future__ import annotations

import copy
import functools
import threading
import types
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from .. import _compat
from ..archive import shapes, structure
from ..debuginfo import DebugHandleRecorder, traceable
from ._program_io import user_inputs, user_outputs
from ..backend import Backend
from ..debuginfo import DebugInfo, build_debug_infos
from ._cache import cached_preprocess
from ._lowered_module import LoweredModule, WrapperModule
from ..archive import MethodSpec, params_of, value_spec
from ._args import availability, check_compile_spec, check_examples, normalize, resolve_backend
from ..errors import (
    BackendContractError,
    BackendUnavailableWarning,
    CompilerError,
    LoweringError,
    UnsupportedNodeError,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    from torch.export import ExportedProgram
    from torch.fx import Node

    from .._compat import TreeSpec
    from ..debuginfo import DebugHandles
    from ._fallback import PartitionedMethod

    #: ``partition=``: None (whole methods), "supported", submodule names, or a function node -> bool.
    Partition: TypeAlias = "str | Sequence[str] | Callable[[Node], bool] | None"


def to_backend(
    module: torch.nn.Module,
    backend: str | object,
    method_compile_spec: Mapping[str, Mapping[str, Any]],
    *,
    example_inputs: tuple | Mapping[str, tuple],
    example_kwargs: Mapping[str, Mapping[str, object]] | None = None,
    partition: Partition = None,
    dynamic_shapes: Any = None,
) -> WrapperModule:
    """Lower the methods of ``module`` named in ``method_compile_spec`` to ``backend``.

    :param backend: a registered backend's name, or a backend object.
    :param method_compile_spec: ``{method_name: {key: value}}``; values must
        be JSON-compatible.
    :param example_inputs: positional example inputs per method, or one
        tuple when only ``forward`` is lowered.
    :param example_kwargs: keyword example inputs per method, if any.
    :param partition: ``None`` lowers each whole method; ``"supported"``
        delegates the maximal groups of nodes the backend accepts, a list of
        submodule names (``["encoder"]``) the nodes under them, a function
        ``node -> bool`` the nodes it picks; every other node runs on the
        host CPU (docs/writing-a-backend.md, "Partial delegation").
    :param dynamic_shapes: the sizes that may vary from call to call, in
        ``torch.export.export``'s forms (``{"x": {0: Dim("batch", min=1,
        max=64)}}``), or ``{method_name: that}`` when several methods are
        lowered. Calls are checked against the exported ranges.
    :returns: a `WrapperModule` with one method per compile-spec key.
    """
    _compat.check_torch_version()
    if not isinstance(module, torch.nn.Module):
        raise LoweringError(
            f"to_backend() needs a torch.nn.Module, got {type(module).__name__}; "
            "wrap a function in a Module whose forward calls it"
        )
    backend_obj, source = resolve_backend(backend)
    specs = check_compile_spec(module, method_compile_spec)
    if example_kwargs is not None and not isinstance(example_kwargs, Mapping):
        raise LoweringError(
            f"example_kwargs must be a dict {{method_name: {{argument: value}}}}, got {type(example_kwargs).__name__} "
            f"{example_kwargs!r:.80}; e.g. example_kwargs={{'forward': {{'scale': 2.0}}}}"
        )
    examples = check_examples(specs, example_inputs, example_kwargs or {})
    dynamic = shapes.per_method(dynamic_shapes, specs, module)
    work = copy.deepcopy(module)  # to_backend never mutates the caller's module
    programs = {name: export_method(work, name, *examples[name], dynamic_shapes=dynamic.get(name)) for name in specs}
    return lower_programs(
        programs,
        backend_obj,
        specs,
        module_type=type(module),
        backend_version=source.version if source else None,
        stacklevel=3,
        partition=partition,
    )


def export_method(
    module: torch.nn.Module, name: str, args: tuple, kwargs: dict, *, dynamic_shapes: Any = None
) -> ExportedProgram:
    """Export one method of ``module`` the way `to_backend` does (defaults bound, checked).

    The suite calls this once per (model, input signature) and lowers the
    cached program many times with `lower_programs`.
    """
    args, kwargs = normalize(getattr(type(module), name), name, args, kwargs)
    fitted = None if dynamic_shapes is None else shapes.fit_positional(dynamic_shapes, len(args))
    program = _export(module, name, args, kwargs, dynamic_shapes=fitted)
    _reject_mutations(program, name)
    return program


def lower_programs(
    programs: Mapping[str, ExportedProgram],
    backend: Backend,
    method_compile_spec: Mapping[str, Mapping[str, Any]],
    *,
    module_type: type,
    backend_version: str | None = None,
    stacklevel: int = 2,
    partition: Partition = None,
) -> WrapperModule:
    """Lower already exported programs (one per method) to ``backend``.

    Every call numbers its nodes with a recorder of its own, from 0, the methods one after another
    in the compile spec's order: the same programs and spec get the same handles (and so the same
    blobs and archive) in any process and at any point of a run, whatever was lowered before.
    """
    from ..archive import declared_version

    # The backend's own `version` names its blob format better than its distribution's.
    backend_version = declared_version(backend, backend_version)
    methods: dict[str, MethodSpec] = {}
    blobs: dict[str, bytes] = {}
    debug: dict[int, DebugInfo] = {}
    partitioned: dict[str, PartitionedMethod] = {}
    whole: dict[str, tuple[str, ...]] = {}
    recorder = DebugHandleRecorder()
    for name, spec in method_compile_spec.items():
        program = programs[name]
        handles = recorder.assign(program.graph_module)
        infos = build_debug_infos(program.graph_module, handles, method=name, top_class=module_type.__name__)
        debug.update(infos)
        try:
            if partition is None:
                run = functools.partial(run_preprocess, backend, program, dict(spec), handles, infos, name)
                blobs[name] = cached_preprocess(backend, program, dict(spec), handles, run, what=f"method {name!r}")
                nodes = tuple(n.name for n in program.graph.nodes if n.op == "call_function")
                whole[name] = nodes
            else:
                partitioned[name] = _lower_partitioned(backend, program, dict(spec), handles, infos, name, partition)
                blobs.update(partitioned[name].delegated_blobs)
        except (UnsupportedNodeError, CompilerError, BackendContractError, LoweringError):
            raise
        except Exception as exc:
            # Name the backend and the method: a bare ValueError from deep inside
            # a vendor's compiler does not say whose it is. Neither a rejection nor a compiler failure at
            # named nodes: the harness cannot tell which of the two it is, and says so (the last line, so
            # that the first stays the backend's own words).
            error = LoweringError(
                f"preprocess() of backend {backend.name!r} failed for method {name!r}: {type(exc).__name__}: {exc}"
                f"\n{UNDECIDED_TEXT}"
            )
            error.compile_verdict = "undecided"  # type: ignore[attr-defined]
            raise error from exc
        methods[name] = _method_spec(program, name, dict(spec), getattr(module_type, name))
    lowered = LoweredModule(backend, methods, blobs, debug, backend_version=backend_version)
    for name, nodes in whole.items():
        lowered.whole_method_nodes[name] = nodes
    for name, method in partitioned.items():
        lowered.add_plan(name, method.plan, method.compile_specs, method.fallback_blobs)
    if availability(backend):
        lowered.compile_now(at="lowering")
    else:
        warnings.warn(
            BackendUnavailableWarning(
                f"Backend [{backend.name}] is not available. Execution of this Module is "
                "still possible by saving and loading on a device where the backend is available."
            ),
            stacklevel=stacklevel,
        )
    return WrapperModule(lowered)


def _lower_partitioned(
    backend: Backend,
    program: ExportedProgram,
    spec: dict,
    handles: DebugHandles,
    infos: dict[int, DebugInfo],
    name: str,
    partition: Partition,
) -> PartitionedMethod:
    from . import _fallback, _partition

    selected = _partition.select_nodes(program, partition, backend, spec, handles, name)
    units = _partition.plan_units(program, selected)

    def preprocess(piece: ExportedProgram, unit_spec: dict, unit_handles: DebugHandles, key: str) -> bytes:
        run = functools.partial(run_preprocess, backend, piece, unit_spec, unit_handles, infos, key)
        return cached_preprocess(backend, piece, unit_spec, unit_handles, run, what=f"method {name!r}, piece {key!r}")

    return _fallback.lower_units(program, units, handles, infos, name, spec, preprocess)


# torch.export keeps global tracing state (mode stacks, the module hierarchy)
# and fails when two threads export at once; lowering from threads is safe
# because exports take turns. Preprocess and compile still run concurrently.
_EXPORT_LOCK = threading.Lock()


def _export(
    work: torch.nn.Module, name: str, args: tuple, kwargs: dict, *, dynamic_shapes: Any = None
) -> ExportedProgram:
    original = type(work)
    if name != "forward":
        work.__class__ = _class_exporting(original, name)
    try:
        with _EXPORT_LOCK, traceable(work):
            return _compat.export(work, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        raise LoweringError(
            f"torch.export could not export method {name!r} of {original.__name__}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        work.__class__ = original


def _class_exporting(cls: type, method: str) -> type:
    """A subclass of ``cls`` whose ``forward`` is ``method``, renamed.

    ``torch.export`` keeps only stack frames of that name
    (`_compat.EXPORT_FRAME_NAME`); the method's code object is renamed so
    that its frames, and so the user's source lines, are kept.
    """
    kept = _compat.EXPORT_FRAME_NAME
    function = getattr(cls, method)
    code = function.__code__.replace(co_name=kept)
    forward = types.FunctionType(code, function.__globals__, kept, function.__defaults__, function.__closure__)
    forward.__kwdefaults__ = function.__kwdefaults__
    return type(
        cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    )


def _reject_mutations(program: ExportedProgram, name: str) -> None:
    mutated = [
        f"{spec.kind.name.lower().replace('_', ' ')} {spec.target!r}"
        for spec in program.graph_signature.output_specs
        if spec.kind.name in ("BUFFER_MUTATION", "USER_INPUT_MUTATION", "PARAMETER_MUTATION")
    ]
    # torch.export's default IR may also keep in-place ops on a buffer or an
    # input (a training-mode batch norm's num_batches_tracked.add_) instead of
    # mutation outputs. In-place ops on intermediates (ReLU(inplace=True)) are fine.
    mutated += [
        f"node {node.name!r} ({_compat.op_schema(node.target).name} on {target.name!r}, in place)"
        for node in program.graph.nodes
        for target in _written_arguments(node)
        if target.op == "placeholder"
    ]
    if mutated:
        raise LoweringError(
            f"method {name!r} mutates state ({', '.join(mutated)}); delegate backends run graphs "
            "without side effects. Is the module in training mode? Call .eval() before lowering."
        )


def _written_arguments(node: Node) -> list[Node]:
    """The graph nodes an in-place op writes to (from its schema's alias annotations)."""
    schema = _compat.op_schema(node.target) if node.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return []
    written: list[Node] = []
    for i, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            if isinstance(value, torch.fx.Node):
                written.append(value)
    return written


#: What a compile error that names no node says: whether the backend claims the program is not known.
UNDECIDED_TEXT = (
    "The harness cannot tell whether the backend claims this program: preprocess() raised neither "
    "UnsupportedNodeError (not claimed) nor CompilerError (claimed, and its compiler failed) naming nodes "
    '(docs/writing-a-backend.md, "A compiler that builds the whole graph").'
)


def run_preprocess(
    backend: Backend,
    program: ExportedProgram,
    spec: dict,
    handles: DebugHandles,
    infos: dict[int, DebugInfo],
    name: str,
) -> bytes:
    """``backend.preprocess`` of method ``name`` as `to_backend` calls it: rejected nodes get their debug
    info (for the error's source lines), and a blob that is not bytes is a `BackendContractError`."""
    try:
        blob = backend.preprocess(program, copy.deepcopy(spec), handles)
    except (UnsupportedNodeError, CompilerError) as exc:
        # Every rejected or failing node gets its own source line (a backend may name several at once).
        for rejection in exc.rejections:
            node = rejection.node
            handle = handles.get(node) if isinstance(node, torch.fx.Node) else None
            if handle is not None:
                rejection.debug_info = infos[handle]
        raise
    if not isinstance(blob, bytes):
        raise BackendContractError(
            f"preprocess() of backend {backend.name!r} returned {type(blob).__name__} for method "
            f"{name!r}; it must return bytes"
        )
    return blob


def _method_spec(program: ExportedProgram, name: str, spec: dict, function: Callable[..., object]) -> MethodSpec:
    example_inputs, example_outputs = user_inputs(program), user_outputs(program)
    inputs = [value_spec(n, v) for n, v in example_inputs]
    outputs = [value_spec(n, v) for n, v in example_outputs]
    return MethodSpec(
        dynamic_shapes=shapes.DynamicShapes.from_program(example_inputs, example_outputs, program.range_constraints),
        name=name,
        compile_spec=spec,
        params=params_of(function),
        in_structure=_structure_of(program.call_spec.in_spec, name, "inputs"),
        out_structure=_structure_of(program.call_spec.out_spec, name, "outputs"),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
    )


def _structure_of(spec: TreeSpec, method: str, what: str) -> Any:
    """The archive's structure JSON of an exported program's input or output pytree."""
    try:
        return structure.from_treespec(spec, f"the {what} of method {method!r}")
    except structure.StructureError as exc:
        raise LoweringError(f"{exc}; change the method's signature or return value") from None
