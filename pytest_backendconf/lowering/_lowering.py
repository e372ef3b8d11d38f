"""`to_backend`: lower methods of a module to a backend.

The flow (docs/backend-contract.md): copy the module, export each method named in
the method compile spec, give every node a debug handle (numbered per lowering), ``preprocess`` each
program into a blob, ``compile`` now if the backend is available (else warn),
and return a `WrapperModule` around the `LoweredModule` that runs the blobs
(both in `_lowered_module`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
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
from ._subclasses import unwrap_tensor_subclasses
from ._lowered_module import LoweredModule, WrapperModule
from ..archive import MethodSpec, ParamSpec, params_of, value_spec
from ..capabilities import capabilities_of
from ._state import check_mutations, functional_form, make_explicit
from ._args import availability, check_compile_spec, check_examples, check_json, normalize, resolve_backend
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
    module: torch.nn.Module | ExportedProgram,
    backend: str | object,
    method_compile_spec: Mapping[str, Mapping[str, Any]],
    *,
    example_inputs: tuple | Mapping[str, tuple] | None = None,
    example_kwargs: Mapping[str, Mapping[str, object]] | None = None,
    partition: Partition = None,
    dynamic_shapes: Any = None,
) -> WrapperModule:
    """Lower the methods of ``module`` named in ``method_compile_spec`` to ``backend``.

    :param module: an ``nn.Module``, or a program already exported with
        ``torch.export.export`` (positional and keyword inputs alike): then
        the compile spec names one method (``{"forward": {}}``), which takes
        the program's inputs, and ``example_inputs`` and ``dynamic_shapes``
        are the program's own.
    :param backend: a registered backend's name, or a backend object.
    :param method_compile_spec: ``{method_name: {key: value}}``; values must
        be JSON-compatible.
    :param example_inputs: positional example inputs per method, or one
        tuple when only ``forward`` is lowered (a module only).
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
    :returns: a `WrapperModule` with one method per compile-spec key. Buffers
        the methods write are its state (docs/backend-contract.md, "State"):
        see `WrapperModule.reset` and `state`.
    """
    _compat.check_torch_version()
    from torch.export import ExportedProgram  # host only: a target never lowers

    if isinstance(module, ExportedProgram):
        return _program_to_backend(
            module, backend, method_compile_spec, example_inputs, example_kwargs, partition, dynamic_shapes
        )
    if not isinstance(module, torch.nn.Module):
        raise LoweringError(
            f"to_backend() needs a torch.nn.Module or a torch.export.ExportedProgram, got "
            f"{type(module).__name__}; wrap a function in a Module whose forward calls it"
        )
    if example_inputs is None:
        raise LoweringError(
            f"to_backend() of a {type(module).__name__} needs example_inputs: one tuple of example arguments "
            "per lowered method, e.g. example_inputs=(torch.randn(2, 3),) or {'forward': (x,)}"
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


def _program_to_backend(
    program: ExportedProgram,
    backend: str | object,
    method_compile_spec: Mapping[str, Mapping[str, Any]],
    example_inputs: object,
    example_kwargs: object,
    partition: Partition,
    dynamic_shapes: object,
) -> WrapperModule:
    """`to_backend` of an exported program: one method, whose signature is the program's inputs."""
    given = [
        n
        for n, v in (
            ("example_inputs", example_inputs),
            ("example_kwargs", example_kwargs),
            ("dynamic_shapes", dynamic_shapes),
        )
        if v is not None
    ]
    if given:
        raise LoweringError(
            f"to_backend() of an ExportedProgram takes no {' or '.join(given)}: the program was exported with "
            "its inputs and dynamic shapes already. Drop the argument, or export again with "
            "torch.export.export(module, args, kwargs, dynamic_shapes=...)"
        )
    if not isinstance(method_compile_spec, Mapping) or len(method_compile_spec) != 1:
        raise LoweringError(
            "the method compile spec of an ExportedProgram names its one method, e.g. {'forward': {}}; got "
            f"{method_compile_spec!r:.80}. To lower several methods, give to_backend the module"
        )
    ((name, options),) = method_compile_spec.items()
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise LoweringError(f"compile-spec key {name!r} must be a method name such as 'forward'")
    if not isinstance(options, Mapping):
        raise LoweringError(
            f"the compile spec of method {name!r} must be a dict of options, got {type(options).__name__}"
        )
    check_json(options, f"compile spec of method {name!r}")
    backend_obj, source = resolve_backend(backend)
    params, top = program_signature(program)
    # The caller's program stays as it was: lowering never changes a program it is given (the
    # state's explicit form is a new program), as the suite's lowering of cached programs relies on.
    return lower_programs(
        {name: program},
        backend_obj,
        {name: json.loads(json.dumps(options))},
        module_type=type(top, (torch.nn.Module,), {}),
        backend_version=source.version if source else None,
        stacklevel=4,
        partition=partition,
        params={name: params},
    )


def program_signature(program: ExportedProgram) -> tuple[tuple[ParamSpec, ...], str]:
    """The parameters a lowered program's method takes, and the exported module's class name.

    Positional inputs are positional-only, named after their placeholders
    (``arg0`` … for a nested one); keyword inputs are keyword-only, by their
    keys, as the program was called at export.
    """
    in_spec = program.call_spec.in_spec
    if in_spec is None or in_spec.num_children != 2:
        raise LoweringError("the ExportedProgram has no (args, kwargs) input structure; export it with torch.export")
    args_spec, kwargs_spec = in_spec.children()
    names = [name for name, _ in user_inputs(program)]
    params: list[ParamSpec] = []
    leaf = 0
    for i, child in enumerate(args_spec.children()):
        count = child.num_leaves
        name = names[leaf] if count == 1 and child.is_leaf() and leaf < len(names) else f"arg{i}"
        params.append(ParamSpec(name if name.isidentifier() else f"arg{i}", "POSITIONAL_ONLY"))
        leaf += count
    for key in kwargs_spec.context or ():
        params.append(ParamSpec(str(key), "KEYWORD_ONLY"))
    return tuple(params), _top_class(program)


def _top_class(program: ExportedProgram) -> str:
    """The exported module's class name, from the module stacks torch.export records (else ``Program``)."""
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            _, (_, cls) = next(iter(stack.items()))
            qualified = cls if isinstance(cls, str) else getattr(cls, "__qualname__", "")
            if qualified:
                return qualified.rsplit(".", 1)[-1]
    return "Program"


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
    check_mutations(program, name)  # a write to an input or a parameter is refused here, before any backend
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
    params: Mapping[str, tuple[ParamSpec, ...]] | None = None,
) -> WrapperModule:
    """Lower already exported programs (one per method) to ``backend``.

    Buffers the programs write become the lowered module's state (`_state.make_explicit`).
    ``params`` gives a method's parameters where ``module_type`` has no such method (a program
    given to `to_backend`).

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
    # The caller-facing specs come from the programs as exported; the backend gets them with state explicit.
    signatures = {
        name: _method_spec(programs[name], name, dict(spec), _params(module_type, name, params))
        for name, spec in method_compile_spec.items()
    }
    explicit, state, initial_state = make_explicit({name: programs[name] for name in method_compile_spec})
    kept: frozenset[str] = frozenset()
    if state and capabilities_of(backend).keeps_state:
        # The backend keeps the state: it gets torch.export's own form, and the module keeps nothing.
        _check_kept_whole(backend, partition, state)
        kept = frozenset(state)
        programs = {name: functional_form(programs[name]) if name in kept else explicit[name] for name in explicit}
        state, initial_state = {}, {}
    else:
        programs = explicit
    for name, spec in method_compile_spec.items():
        # torchao's quantized weights reach the backend as plain integer tensors, scales and zero points.
        program = unwrap_tensor_subclasses(programs[name], name)
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
        methods[name] = dataclasses.replace(
            signatures[name], state=state.get(name, ()), state_kept_by_backend=name in kept
        )
    lowered = LoweredModule(backend, methods, blobs, debug, backend_version=backend_version, state=initial_state)
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


def _params(module_type: type, name: str, given: Mapping[str, tuple[ParamSpec, ...]] | None) -> tuple[ParamSpec, ...]:
    if given is not None and name in given:
        return given[name]
    return params_of(getattr(module_type, name))


def _check_kept_whole(backend: Backend, partition: object, state: Mapping[str, object]) -> None:
    if partition is not None:
        raise LoweringError(
            f"backend {backend.name!r} declares keeps_state=True, and method(s) {', '.join(map(repr, state))} "
            f"keep state: partition={partition!r} cannot give a backend that keeps state the part of it that "
            "its partitions read and write. Lower these methods whole (partition=None), or declare "
            "keeps_state=False so that the lowered module keeps the state and passes it to execute"
        )


def _method_spec(program: ExportedProgram, name: str, spec: dict, params: tuple[ParamSpec, ...]) -> MethodSpec:
    example_inputs, example_outputs = user_inputs(program), user_outputs(program)
    inputs = [value_spec(n, v) for n, v in example_inputs]
    outputs = [value_spec(n, v) for n, v in example_outputs]
    return MethodSpec(
        dynamic_shapes=shapes.DynamicShapes.from_program(example_inputs, example_outputs, program.range_constraints),
        name=name,
        compile_spec=spec,
        params=params,
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
