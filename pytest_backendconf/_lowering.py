"""`to_backend`: lower methods of a module to a backend, and the modules that run them.

The flow (docs/backend-contract.md): copy the module, export each method named in
the method compile spec, give every node a debug handle, ``preprocess`` each
program into a blob, ``compile`` now if the backend is available (else warn),
and return a `WrapperModule` around the `LoweredModule` that runs the blobs.
"""

from __future__ import annotations

import copy
import threading
import types
import warnings
from typing import Any, Mapping

import torch
import torch.nn.modules.module as _module_hooks

from . import _compat, _exec_sources, _shapes
from . import _structure as structure
from ._debug_handles import DebugHandleRecorder
from ._program_io import user_inputs, user_outputs
from .backend import Backend
from ._debug_info import DebugInfo, build_debug_infos, format_missing, format_runtime
from ._method_spec import MethodSpec, params_of, value_spec
from ._lowering_args import availability, check_compile_spec, check_examples, normalize, resolve_backend
from .errors import (
    BackendContractError,
    BackendError,
    BackendRuntimeError,
    BackendUnavailableError,
    BackendUnavailableWarning,
    InputSpecError,
    LoweringError,
    OutputSpecError,
    UnsupportedNodeError,
)


def to_backend(
    module: torch.nn.Module,
    backend: str | object,
    method_compile_spec: Mapping[str, Mapping[str, Any]],
    *,
    example_inputs: tuple | Mapping[str, tuple],
    example_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    partition: Any = None,
    dynamic_shapes: Any = None,
) -> "WrapperModule":
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
    dynamic = _shapes.per_method(dynamic_shapes, specs, module)
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


def export_method(module: torch.nn.Module, name: str, args: tuple, kwargs: dict, *, dynamic_shapes: Any = None) -> Any:
    """Export one method of ``module`` the way `to_backend` does (defaults bound, checked).

    The suite calls this once per (model, input signature) and lowers the
    cached program many times with `lower_programs`.
    """
    args, kwargs = normalize(getattr(type(module), name), name, args, kwargs)
    options = {} if dynamic_shapes is None else {"dynamic_shapes": _shapes.fit_positional(dynamic_shapes, len(args))}
    program = _export(module, name, args, kwargs, **options)
    _reject_mutations(program, name)
    return program


def lower_programs(
    programs: Mapping[str, Any],
    backend: Backend,
    method_compile_spec: Mapping[str, Mapping[str, Any]],
    *,
    module_type: type,
    backend_version: str | None = None,
    stacklevel: int = 2,
    partition: Any = None,
) -> "WrapperModule":
    """Lower already exported programs (one per method) to ``backend``.

    Every call issues fresh debug handles, so two lowerings of the same
    programs never share a handle.
    """
    from ._versions import declared_version

    # The backend's own `version` names its blob format better than its distribution's.
    backend_version = declared_version(backend, backend_version)
    methods: dict[str, MethodSpec] = {}
    blobs: dict[str, bytes] = {}
    debug: dict[int, DebugInfo] = {}
    partitioned: dict[str, Any] = {}
    whole: dict[str, tuple[str, ...]] = {}
    for name, spec in method_compile_spec.items():
        program = programs[name]
        handles = DebugHandleRecorder.default().assign(program.graph_module)
        infos = build_debug_infos(program.graph_module, handles, method=name, top_class=module_type.__name__)
        debug.update(infos)
        try:
            if partition is None:
                blobs[name] = _preprocess(backend, program, dict(spec), handles, infos, name)
                nodes = tuple(n.name for n in program.graph.nodes if n.op == "call_function")
                whole[name] = nodes
            else:
                partitioned[name] = _lower_partitioned(backend, program, dict(spec), handles, infos, name, partition)
                blobs.update(partitioned[name].delegated_blobs)
        except (UnsupportedNodeError, BackendContractError, LoweringError):
            raise
        except Exception as exc:
            # Name the backend and the method: a bare ValueError from deep inside
            # a vendor's compiler does not say whose it is.
            raise LoweringError(
                f"preprocess() of backend {backend.name!r} failed for method {name!r}: {type(exc).__name__}: {exc}"
            ) from exc
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
    backend: Any, program: Any, spec: dict, handles: Any, infos: dict[int, DebugInfo], name: str, partition: Any
) -> Any:
    from . import _fallback, _partition

    selected = _partition.select_nodes(program, partition, backend, spec, handles, name)
    units = _partition.plan_units(program, selected)

    def preprocess(piece: Any, unit_spec: dict, unit_handles: Any, key: str) -> bytes:
        return _preprocess(backend, piece, unit_spec, unit_handles, infos, key)

    return _fallback.lower_units(program, units, handles, infos, name, spec, preprocess)


def delegation(module: "WrapperModule | LoweredModule") -> dict[str, Any]:
    """``{method: Delegation}``: which op nodes each partition runs and which stay on the CPU fallback."""

    lowered = module.lowered if isinstance(module, WrapperModule) else module
    if not isinstance(lowered, LoweredModule):
        raise TypeError(f"delegation() needs a lowered module (from to_backend or load), got {type(module).__name__}")
    return {name: lowered.delegation_of(name) for name in lowered.methods}


def debug_info(module: "WrapperModule | LoweredModule") -> dict[int, DebugInfo]:
    """``{debug_handle: DebugInfo}`` for every node of every lowered method."""
    lowered = module.lowered if isinstance(module, WrapperModule) else module
    return dict(lowered.debug)


class LoweredModule(torch.nn.Module):
    """Runs lowered methods through a backend: availability, checks, symbolicated errors."""

    def __init__(
        self,
        backend: Backend,
        methods: dict[str, MethodSpec],
        blobs: dict[str, bytes],
        debug: dict[int, DebugInfo],
        *,
        backend_version: str | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.backend_name: str = backend.name
        self.backend_version = backend_version
        self.methods = methods
        self.blobs = blobs
        self.debug = debug
        self.handles: dict[str, Any] | None = None
        self._runners = {name: _MethodRunner(spec) for name, spec in methods.items()}
        # Partial delegation (see _fallback): per partitioned method, its plan,
        # the compile spec of each delegated partition, the fallback's blobs,
        # and once compiled, the runner of the plan.
        self.plans: dict[str, Any] = {}
        self.partition_specs: dict[str, dict] = {}
        self.fallback_blobs: dict[str, bytes] = {}
        self._plan_runners: dict[str, Any] = {}
        #: Op node names of each whole-method lowering, for `delegation` (None when unknown).
        self.whole_method_nodes: dict[str, tuple[str, ...]] = {}
        #: Loaded from a handles-only archive (`_sidecar`): its debug_info field, handles and the
        #: symbolicate command for its .debug file; ``debug`` is empty unless the sidecar was loaded.
        self.separate_debug: dict[str, Any] | None = None

    def add_plan(
        self, method: str, plan: Any, compile_specs: dict[str, dict], fallback_blobs: dict[str, bytes]
    ) -> None:
        """Make ``method`` a partitioned one (at lowering, and by the archive reader at load)."""
        self.plans[method] = plan
        self.partition_specs.update(compile_specs)
        self.fallback_blobs.update(fallback_blobs)

    def delegation_of(self, method: str) -> Any:
        from ._plan import Delegation

        plan = self.plans.get(method)
        if plan is not None:
            return plan.delegation
        nodes = self.whole_method_nodes.get(method)
        if nodes is None:  # an archive written before partial delegation: from its debug info
            nodes = tuple(
                info.node
                for _, info in sorted(self.debug.items())
                if info.method == method and info.op not in ("placeholder", "output", "get_attr")
            )
        return Delegation(1, nodes, (), (nodes,))

    def _compile_specs(self) -> dict[str, dict]:
        """The compile spec of every blob the backend compiles: whole methods and partitions."""
        specs = {n: m.compile_spec for n, m in self.methods.items() if n not in self.plans}
        specs.update(self.partition_specs)
        return specs

    def compile_now(self, *, at: str = "load") -> None:
        """Compile every blob; `BackendUnavailableError` if the backend is not available."""
        available = availability(self.backend)
        if not available:
            raise BackendUnavailableError(self._unavailable_text(f"cannot {at} the module"))
        fallbacks = self._load_fallbacks()
        try:
            handles = self.backend.compile(dict(self.blobs), self._compile_specs()) if self.blobs else {}
        except BackendUnavailableError:
            raise
        except Exception as exc:
            if at == "load":
                # The blobs come from a file: a blob the backend rejects is as likely damaged (the
                # checksums only prove it is the file that was written) or from another backend
                # version as the sign of a backend that cannot compile here. Say all three.
                raise BackendContractError(
                    f"backend {self.backend_name!r}: compile() failed at load: {type(exc).__name__}: {exc}. "
                    "It failed on this archive's blobs: the file may be damaged or written by another "
                    f"version of the backend (the archive records version {self.backend_version or 'unknown'}); "
                    "lower and save the model again with this backend. If instead the backend cannot "
                    "compile on this machine, it must report is_available() == False here."
                ) from exc
            raise BackendContractError(
                f"backend {self.backend_name!r} reports is_available() == True, but compile() "
                f"failed at {at}: {type(exc).__name__}: {exc}. A backend that cannot compile "
                "here must return False from is_available() (docs/backend-contract.md#availability)."
            ) from exc
        missing = sorted(set(self.blobs) - set(handles if isinstance(handles, dict) else ()))
        if not isinstance(handles, dict) or missing:
            raise BackendContractError(
                f"compile() of backend {self.backend_name!r} must return a dict with a handle "
                f"for every method; got {type(handles).__name__}"
                + (f" without {missing}" if isinstance(handles, dict) else "")
            )
        if self.plans:
            from ._fallback import PlanRunner

            self._plan_runners = {
                name: PlanRunner(plan, self.backend.execute, handles, fallbacks, name, self.backend_name)
                for name, plan in self.plans.items()
            }
        self.handles = handles

    def _load_fallbacks(self) -> dict[str, Any]:
        from ._fallback import load_fallback

        return {key: load_fallback(blob, key, self.debug) for key, blob in self.fallback_blobs.items()}

    def run(self, method: str, args: tuple, kwargs: dict) -> Any:
        # The hot path: every call of a lowered method comes through here
        # (benchmarks/run.py holds it to a few microseconds over execute).
        runner = self._runners.get(method)
        if runner is None:
            raise AttributeError(
                f"this lowered module has no method {method!r}; its methods: {', '.join(self.methods)}"
            )
        backend = self.backend
        if backend.is_available() is not True:
            # Never call execute on an unavailable backend (§3.4).
            raise BackendUnavailableError(self._unavailable_text(f"cannot run method {method!r}"))
        handles = self.handles
        if handles is None:
            self.compile_now(at="call")
            handles = self.handles
        inputs = runner.flatten(args, kwargs)
        sizes = runner.check_sizes(inputs) if runner.dynamic is not None else None
        try:
            if method in self._plan_runners:
                outputs = self._plan_runners[method].run(inputs)
            else:
                outputs = backend.execute(handles[method], inputs)  # type: ignore[index]
        except BackendError as exc:
            raise self._symbolicate(exc, method) from exc
        except Exception as exc:
            _add_note(exc, f"(raised by backend {self.backend_name!r} executing method {method!r})")
            raise
        result = runner.unflatten(outputs, self.backend_name)
        if sizes is not None:
            runner.dynamic.check_outputs(method, self.backend_name, outputs, sizes)  # type: ignore[union-attr]
        return result

    def _symbolicate(self, exc: BackendError, method: str) -> BackendRuntimeError:
        handle = exc.debug_handle
        if handle is None:
            text = f"{exc.message}\n  (backend {self.backend_name!r}, method {method!r}: no debug handle given)"
        elif handle in self.debug:
            text = format_runtime(exc.message, self.debug[handle])
        elif self.separate_debug is not None and handle in self.separate_debug["handles"]:
            # A handles-only archive, loaded without its .debug file: say how to symbolicate later.
            text = f"{exc.message} (debug_handle={handle}; symbolicate with: {self.separate_debug['hint']} {handle})"
        else:
            text = f"{exc.message}\n{format_missing([handle])}"
        return BackendRuntimeError(text, exc.message, handle)

    def _unavailable_text(self, what: str) -> str:
        reason = ""
        explain = getattr(self.backend, "unavailable_reason", None)
        if callable(explain):
            try:
                reason = str(explain())
            except Exception as exc:  # the error must still be raised
                reason = f"unavailable_reason() raised {exc!r}"
        because = f": {reason}" if reason else ""
        return (
            f"Backend is not available. Backend {self.backend_name!r} reports "
            f"is_available() == False here{because}, so it {what}. Load the saved module "
            "on a device where the backend is available."
        )

    def extra_repr(self) -> str:
        return f"backend={self.backend_name!r}, methods={list(self.methods)}"

    def __repr__(self) -> str:
        # One line: "LoweredModule(backend='x', methods=['forward']; forward: 3 partitions, 41/47 nodes delegated)"
        parts = [f"{name}: {self.delegation_of(name).summary()}" for name in self.methods]
        return f"LoweredModule({self.extra_repr()}; {'; '.join(parts)})"


class WrapperModule(torch.nn.Module):
    """What `to_backend` returns: one method per compile-spec key, around a `LoweredModule`.

    Attributes set on it after lowering (tensors, numbers, strings, and
    lists or dicts of them) are saved with it and restored by `load`.
    """

    #: The lowered module, kept in ``__dict__`` (not a registered submodule) for the fast call path.
    _core: LoweredModule

    def __init__(self, lowered: LoweredModule) -> None:
        super().__init__()
        self.lowered = lowered
        # The same module, in __dict__: `self.lowered` goes through
        # nn.Module.__getattr__ (a Python call) on every access.
        self.__dict__["_core"] = lowered
        # Instance attributes win over nn.Module's own methods, so a lowered
        # method called `double` or `half` is the user's, not Module.double.
        for name, spec in lowered.methods.items():
            self.__dict__[name] = _method_caller(lowered, name, spec)
        self._baseline = frozenset(self.__dict__) | {"_baseline"}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # Reached only when forward was not lowered: run() names the methods that were.
        return self.lowered.run("forward", args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # nn.Module.__call__ costs about a microsecond of hook checks and
        # argument repacking before reaching forward; without hooks (the
        # usual case) go straight to the lowered module. With any hook
        # registered, on this module or globally, or under the JIT tracer,
        # nn.Module's own path runs them as usual.
        if (
            self._forward_hooks
            or self._forward_pre_hooks
            or self._backward_hooks
            or self._backward_pre_hooks
            or _module_hooks._global_forward_hooks
            or _module_hooks._global_forward_pre_hooks
            or _module_hooks._global_backward_hooks
            or _module_hooks._global_backward_pre_hooks
            or _compat.tracing_state()
        ):
            return super().__call__(*args, **kwargs)
        return self._core.run("forward", args, kwargs)

    def __repr__(self) -> str:
        lowered = self.lowered
        parts = [f"{name}: {lowered.delegation_of(name).summary()}" for name in lowered.methods]
        return f"WrapperModule(backend={lowered.backend_name!r}; {'; '.join(parts)})"

    def extra_attributes(self) -> dict[str, Any]:
        """The attributes set after lowering, by name."""
        extra = {k: v for k, v in self.__dict__.items() if k not in self._baseline}
        extra.update(self._parameters)
        extra.update(self._buffers)
        modules = [k for k in self._modules if k != "lowered"]
        if modules:
            raise LoweringError(
                f"attribute(s) {modules} of the lowered module are Modules, which cannot be "
                "saved with it; keep tensors, numbers, strings, or lists/dicts of them"
            )
        return dict(sorted(extra.items()))


def _method_caller(lowered: LoweredModule, name: str, spec: MethodSpec) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        return lowered.run(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    call.__signature__ = spec.signature()  # type: ignore[attr-defined]
    return call


class _MethodRunner:
    """Turns a call into the flat input list and the flat outputs back into the structure.

    Everything that does not depend on the call is worked out here, once:
    the checks of each tensor are ``(dtype, torch.Size)`` pairs compared in
    C, and the output structure is rebuilt directly when it is a
    tensor, or a flat tuple, list or dict of them.
    """

    def __init__(self, spec: MethodSpec) -> None:
        self.spec = spec
        self.signature = spec.signature()
        n = len(spec.inputs)
        positional = all(
            p.kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD") and not p.has_default for p in spec.params
        )
        # The common call, all inputs positional tensors, skips binding and the structure walk.
        self.fast_arity = n if positional and len(spec.params) == n else -1
        self.tensor_checks = [
            (i, _torch_dtype(v.dtype), _expected_shape(v.shape), v)
            for i, v in enumerate(spec.inputs)
            if v.kind == "tensor"
        ]
        self.constants = [(i, v) for i, v in enumerate(spec.inputs) if v.kind != "tensor"]
        self.n_outputs = len(spec.outputs)
        self.output_checks = [
            (_torch_dtype(v.dtype), _expected_shape(v.shape)) if v.kind == "tensor" else (None, v.value)
            for v in spec.outputs
        ]
        self.rebuild = structure.rebuilder(spec.out_structure)
        self.dynamic = spec.dynamic_shapes
        self.input_names = [v.name for v in spec.inputs]

    def flatten(self, args: tuple, kwargs: dict) -> list:
        if not kwargs and len(args) == self.fast_arity:
            flat = list(args)
        else:
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise InputSpecError(f"method {self.spec.name!r}: {exc}; its signature is {self.signature}") from None
            bound.apply_defaults()
            call = (bound.args, bound.kwargs)
            leaves = structure.flatten(self.spec.in_structure, call)
            if leaves is None:
                raise InputSpecError(
                    f"method {self.spec.name!r} was lowered for inputs shaped like "
                    f"{structure.describe(self.spec.in_structure)}, but was called with "
                    f"{structure.describe_value(call)}; lower it again for this call's structure"
                )
            flat = leaves
        for i, dtype, shape, spec in self.tensor_checks:
            value = flat[i]
            if (
                not isinstance(value, torch.Tensor)
                or value.dtype is not dtype  # dtypes are singletons: identity is the cheap test
                or (value.shape != shape and not _shape_matches(value.shape, shape))
            ):
                raise InputSpecError(
                    f"method {self.spec.name!r} input {i} ({spec.name!r}) must be {spec.describe()} as "
                    f"when it was exported, got {_describe_value(value)}; lower it again for these inputs"
                )
        if self.constants:
            self._check_constants(flat)
        return flat

    def check_sizes(self, inputs: list) -> list[int | None]:
        """The exported ranges and equalities of the symbolic sizes (dynamic shapes only)."""
        return self.dynamic.check_inputs(self.spec.name, self.input_names, inputs)  # type: ignore[union-attr]

    def _check_constants(self, flat: list) -> None:
        for i, spec in self.constants:
            value = flat[i]
            if type(value) is not type(spec.value) or value != spec.value:
                raise InputSpecError(
                    f"method {self.spec.name!r} was lowered with {spec.name}={spec.value!r} (a Python "
                    f"value is baked into the exported program) but called with {spec.name}={value!r}; "
                    "lower it again with that value, or pass it as a tensor"
                )

    def unflatten(self, outputs: Any, backend_name: str) -> Any:
        if not isinstance(outputs, (list, tuple)) or len(outputs) != self.n_outputs:
            got = f"{len(outputs)} outputs" if isinstance(outputs, (list, tuple)) else type(outputs).__name__
            raise OutputSpecError(
                f"method {self.spec.name!r}: execute() of backend {backend_name!r} must return a list "
                f"of {self.n_outputs} outputs, got {got}"
            )
        for value, (dtype, expected) in zip(outputs, self.output_checks):
            if dtype is None:
                if value != expected:
                    self._bad_output(outputs, backend_name)
            elif (
                not isinstance(value, torch.Tensor)
                or value.dtype is not dtype
                or (value.shape != expected and not _shape_matches(value.shape, expected))
            ):
                self._bad_output(outputs, backend_name)
        return self.rebuild(outputs)

    def _bad_output(self, outputs: Any, backend_name: str) -> None:
        """Raise the error for the first output that does not match its spec."""
        for i, (value, spec, (dtype, _)) in enumerate(zip(outputs, self.spec.outputs, self.output_checks)):
            if dtype is None:
                if value != spec.value:
                    raise OutputSpecError(
                        f"method {self.spec.name!r} output {i}: expected {spec.describe()}, got {value!r} "
                        f"from backend {backend_name!r}"
                    )
            elif (
                not isinstance(value, torch.Tensor)
                or value.dtype != dtype
                or not _shape_matches(value.shape, spec.shape)
            ):
                raise OutputSpecError(
                    f"method {self.spec.name!r} output {i}: expected {spec.describe()}, got "
                    f"{_describe_value(value)} from backend {backend_name!r}"
                )


def _expected_shape(shape: Any) -> Any:
    """A `torch.Size` for a static shape, else the tuple with ``None`` for each symbolic dimension.

    The checks compare ``value.shape != expected`` first (one comparison in
    C, false for a match of a static shape) and only then `_shape_matches`.
    """
    if shape is not None and all(d is not None for d in shape):
        return torch.Size(shape)
    return shape


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` where Python has it (3.11+); 3.10 keeps the exception as it is."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)


def _torch_dtype(name: str | None) -> torch.dtype:
    """The torch dtype a tensor spec names (the archive reader checked the name)."""
    dtype = getattr(torch, name or "", None)
    if not isinstance(dtype, torch.dtype):
        raise LoweringError(f"a tensor spec names dtype {name!r}, which is not a torch dtype")
    return dtype


def _shape_matches(actual: Any, expected: Any) -> bool:
    if len(actual) != len(expected):
        return False
    return all(e is None or a == e for a, e in zip(actual, expected))


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}] tensor"
    return f"{type(value).__name__} {value!r}"


# torch.export keeps global tracing state (mode stacks, the module hierarchy)
# and fails when two threads export at once; lowering from threads is safe
# because exports take turns. Preprocess and compile still run concurrently.
_EXPORT_LOCK = threading.Lock()


def _export(work: torch.nn.Module, name: str, args: tuple, kwargs: dict, **options: Any) -> Any:
    original = type(work)
    if name != "forward":
        work.__class__ = _class_exporting(original, name)
    try:
        with _EXPORT_LOCK, _exec_sources.traceable(work):
            return _compat.export(work, args, kwargs, **options)
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


def _reject_mutations(program: Any, name: str) -> None:
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


def _written_arguments(node: Any) -> list[Any]:
    """The graph nodes an in-place op writes to (from its schema's alias annotations)."""
    schema = _compat.op_schema(node.target) if node.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return []
    written = []
    for i, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            if isinstance(value, torch.fx.Node):
                written.append(value)
    return written


def _preprocess(
    backend: Backend, program: Any, spec: dict, handles: Any, infos: dict[int, DebugInfo], name: str
) -> bytes:
    try:
        blob = backend.preprocess(program, copy.deepcopy(spec), handles)
    except UnsupportedNodeError as exc:
        handle = handles.get(exc.node) if _hashable(exc.node) else None
        if handle is not None:
            exc.debug_info = infos[handle]
        raise
    if not isinstance(blob, bytes):
        raise BackendContractError(
            f"preprocess() of backend {backend.name!r} returned {type(blob).__name__} for method "
            f"{name!r}; it must return bytes"
        )
    return blob


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _method_spec(program: Any, name: str, spec: dict, function: Any) -> MethodSpec:
    example_inputs, example_outputs = user_inputs(program), user_outputs(program)
    inputs = [value_spec(n, v) for n, v in example_inputs]
    outputs = [value_spec(n, v) for n, v in example_outputs]
    return MethodSpec(
        dynamic_shapes=_shapes.DynamicShapes.from_program(example_inputs, example_outputs, program.range_constraints),
        name=name,
        compile_spec=spec,
        params=params_of(function),
        in_structure=_structure_of(program.call_spec.in_spec, name, "inputs"),
        out_structure=_structure_of(program.call_spec.out_spec, name, "outputs"),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
    )


def _structure_of(spec: Any, method: str, what: str) -> Any:
    """The archive's structure JSON of an exported program's input or output pytree."""
    try:
        return structure.from_treespec(spec, f"the {what} of method {method!r}")
    except structure.StructureError as exc:
        raise LoweringError(f"{exc}; change the method's signature or return value") from None
