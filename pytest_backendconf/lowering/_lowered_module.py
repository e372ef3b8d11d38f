"""The modules that run lowered methods: `LoweredModule` (through the backend) and `WrapperModule` (the user's).

`to_backend` (`_lowering`) and `load` (`archive._archive`) build them; `delegation`
and `debug_info` read them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

import torch

from .. import _compat
from ..debuginfo import MAX_RANGE_NODES, DebugInfo, format_missing, format_range, format_runtime
from ._args import availability
from ._method_calls import MethodRunner, tensor_differences
from ..archive import MethodSpec
from ..backend import Backend
from ..errors import (
    BackendContractError,
    BackendError,
    BackendRuntimeError,
    BackendUnavailableError,
    LoweringError,
    OperatorRefusedError,
    OutputSpecError,
)

if TYPE_CHECKING:
    from ..archive import Bundles, Delegation, Plan
    from ..reference.interpreter import LoadedProgram
    from ._fallback import PlanRunner


_tracing_state = _compat.tracing_state
_global_forward_hooks, _global_forward_pre_hooks, _global_backward_hooks, _global_backward_pre_hooks = (
    _compat.MODULE_GLOBAL_HOOKS
)


def delegation(module: "WrapperModule | LoweredModule") -> dict[str, Delegation]:
    """``{method: Delegation}``: which op nodes each partition runs and which stay on the CPU fallback."""

    lowered = module.lowered if isinstance(module, WrapperModule) else module
    if not isinstance(lowered, LoweredModule):
        raise TypeError(f"delegation() needs a lowered module (from to_backend or load), got {type(module).__name__}")
    return {name: lowered.delegation_of(name) for name in lowered.methods}


def state(module: "WrapperModule | LoweredModule") -> dict[str, torch.Tensor]:
    """The current value of each buffer the lowered methods keep as state, by name (copies: changing them
    changes nothing). Empty for a module without state."""
    lowered = _lowered(module, "state")
    if lowered.state_kept_by_backend:
        raise TypeError(
            f"state() cannot read the state of method(s) {', '.join(map(repr, sorted(lowered.state_kept_by_backend)))}: "
            f"backend {lowered.backend_name!r} keeps it itself (it declares keeps_state=True). Judge such a "
            "module by what its methods return; reset() still returns it to its initial state"
        )
    with lowered._state_lock:
        return {k: v.clone() for k, v in lowered.state.items()}


def reset(module: "WrapperModule | LoweredModule") -> None:
    """Return a lowered module's state to its initial values (`LoweredModule.reset`)."""
    _lowered(module, "reset").reset()


def _lowered(module: object, what: str) -> "LoweredModule":
    lowered = module.lowered if isinstance(module, WrapperModule) else module
    if not isinstance(lowered, LoweredModule):
        raise TypeError(f"{what}() needs a lowered module (from to_backend or load), got {type(module).__name__}")
    return lowered


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
        state: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """``state``: the initial value of each buffer the methods keep as state, by fully qualified name
        (as exported, or as the archive stores them); this module keeps copies of its own."""
        super().__init__()
        self.backend = backend
        self.backend_name: str = backend.name
        self.backend_version = backend_version
        self.methods = methods
        self.blobs = blobs
        self.debug = debug
        #: The backend's handle of each blob, once compiled: opaque here, handed back to its execute.
        self.handles: dict[str, object] | None = None
        self._runners = {name: MethodRunner(spec) for name, spec in methods.items()}
        # Partial delegation (see _fallback): per partitioned method, its plan,
        # the compile spec of each delegated partition, the fallback's blobs,
        # and once compiled, the runner of the plan.
        self.plans: dict[str, Plan] = {}
        self.partition_specs: dict[str, dict] = {}
        self.fallback_blobs: dict[str, bytes] = {}
        self._plan_runners: dict[str, PlanRunner] = {}
        #: Op node names of each whole-method lowering, for `delegation` (None when unknown).
        self.whole_method_nodes: dict[str, tuple[str, ...]] = {}
        #: Loaded from a handles-only archive (`archive._sidecar`): its debug_info field, handles and the
        #: symbolicate command for its .debug file; ``debug`` is empty unless the sidecar was loaded.
        self.separate_debug: dict[str, Any] | None = None
        #: Bundled inputs read from an archive (`archive.Bundles`), written back by a re-save; None without.
        self.bundles: Bundles | None = None
        #: The state's initial values, by buffer name: what `reset` returns to and `save` stores.
        self.initial_state: dict[str, torch.Tensor] = {k: v.detach().clone() for k, v in (state or {}).items()}
        #: The state's current values; replaced (never written in place) after each call.
        self.state: dict[str, torch.Tensor] = {k: v.clone() for k, v in self.initial_state.items()}
        self._state_of = {name: spec.state for name, spec in methods.items() if spec.state}
        #: The methods whose state the backend keeps in its handles (it declares ``keeps_state``).
        self.state_kept_by_backend = frozenset(name for name, spec in methods.items() if spec.state_kept_by_backend)
        missing = sorted({s.fqn for specs in self._state_of.values() for s in specs} - set(self.state))
        if missing:
            raise LoweringError(f"no initial value for state {missing}; the methods read them as state")
        # A call reads the state and writes it back: two calls at once would lose one's update, so the
        # calls of a stateful module take turns (documented: docs/backend-contract.md, "State").
        self._state_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # A lock cannot be copied: a copy (copy.deepcopy) gets its own, with its own state tensors.
        state = dict(self.__dict__)
        state.pop("_state_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._state_lock = threading.Lock()

    def reset(self) -> None:
        """Return the state to its initial values (as exported); a module without state is unchanged."""
        with self._state_lock:
            self.state = {k: v.clone() for k, v in self.initial_state.items()}
            if self.state_kept_by_backend:
                # The backend's handles hold the state: the next call compiles the blobs again, and a
                # handle compiled from the blobs starts from the initial values they carry.
                self.handles = None

    def add_plan(
        self, method: str, plan: Plan, compile_specs: dict[str, dict], fallback_blobs: dict[str, bytes]
    ) -> None:
        """Make ``method`` a partitioned one (at lowering, and by the archive reader at load)."""
        self.plans[method] = plan
        self.partition_specs.update(compile_specs)
        self.fallback_blobs.update(fallback_blobs)

    def delegation_of(self, method: str) -> Delegation:
        from ..archive import Delegation

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
        except (BackendUnavailableError, OperatorRefusedError):
            raise  # a refused operator is the file's doing, named in the error, not the backend's
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

    def _load_fallbacks(self) -> dict[str, LoadedProgram]:
        from ._fallback import load_fallback

        return {key: load_fallback(blob, key, self.debug) for key, blob in self.fallback_blobs.items()}

    def run(self, method: str, args: tuple, kwargs: dict) -> Any:
        """``method`` called with ``args`` and ``kwargs``: what it returns (the model's own outputs)."""
        # The hot path: every call of a lowered method comes through here
        # (benchmarks/run.py holds it to a few microseconds over execute).
        runner = self._runners.get(method)
        if runner is None:
            raise AttributeError(
                f"this lowered module has no method {method!r}; its methods: {', '.join(self.methods)}"
            )
        backend = self.backend
        if backend.is_available() is not True:
            # Never call execute on an unavailable backend (the contract's availability rule).
            raise BackendUnavailableError(self._unavailable_text(f"cannot run method {method!r}"))
        if self.handles is None:
            self.compile_now(at="call")
        inputs = runner.flatten(args, kwargs)
        sizes = runner.check_sizes(inputs) if runner.dynamic is not None else None
        if method in self._state_of:
            return self._run_stateful(method, runner, inputs, sizes)
        if self.state_kept_by_backend:
            # The backend keeps the state: calls take turns as with the module's own state, and after a
            # reset (handles dropped) the first call compiles again.
            with self._state_lock:
                if self.handles is None:
                    self.compile_now(at="call")
                return self._execute(method, runner, inputs, sizes)
        return self._execute(method, runner, inputs, sizes)

    def _execute(self, method: str, runner: MethodRunner, inputs: list, sizes: list | None) -> Any:
        """A call of a method the module keeps no state for: execute (or the partitions' plan), checked."""
        outputs: Sequence[object]
        try:
            if method in self._plan_runners:
                outputs = self._plan_runners[method].run(inputs)
            else:
                outputs = self.backend.execute(self.handles[method], inputs)  # type: ignore[index]
        except BackendError as exc:
            raise self._symbolicate(exc, method) from exc
        except Exception as exc:
            _add_note(exc, f"(raised by backend {self.backend_name!r} executing method {method!r})")
            raise
        result = runner.unflatten(outputs, self.backend_name)
        if sizes is not None:
            runner.dynamic.check_outputs(method, self.backend_name, outputs, sizes)  # type: ignore[union-attr]
        return result

    def _run_stateful(self, method: str, runner: MethodRunner, inputs: list, sizes: list | None) -> Any:
        """A call of a method with state: the states go in first, their new values come out first."""
        specs = self._state_of[method]
        written = [s for s in specs if s.output is not None]
        with self._state_lock:
            state = self.state
            flat = [state[s.fqn] for s in specs] + inputs
            outputs: Sequence[object]
            try:
                if method in self._plan_runners:
                    outputs = self._plan_runners[method].run(flat)
                else:
                    outputs = self.backend.execute(self.handles[method], flat)  # type: ignore[index]
            except BackendError as exc:
                raise self._symbolicate(exc, method) from exc
            except Exception as exc:
                _add_note(exc, f"(raised by backend {self.backend_name!r} executing method {method!r})")
                raise
            if not isinstance(outputs, (list, tuple)) or len(outputs) < len(written):
                got = f"{len(outputs)}" if isinstance(outputs, (list, tuple)) else type(outputs).__name__
                raise OutputSpecError(
                    f"method {method!r}: execute() of backend {self.backend_name!r} must return the new value of "
                    f"each of {len(written)} states, then the method's {runner.n_outputs} outputs; got {got}",
                    differs=("count",),
                )
            new: dict[str, torch.Tensor] = {}
            for s in written:
                value = outputs[s.output]  # type: ignore[index]
                differs = tensor_differences(value, state[s.fqn].dtype, s.shape)
                if differs:
                    raise OutputSpecError(
                        f"method {method!r} output {s.output}: the new value of {s.describe()} came back from "
                        f"backend {self.backend_name!r} as {_describe(value)}",
                        output=s.output,
                        node=s.fqn,
                        differs=differs,
                    )
                new[s.fqn] = cast(torch.Tensor, value)  # tensor_differences found it a tensor
            user = list(outputs[len(written) :])
            if new:
                # A method returning a state (`return self.cache`) gets the kept tensor back: the caller
                # gets a copy, so that writing to it cannot change the module's state.
                kept = {id(v) for v in new.values()}
                user = [cast(torch.Tensor, v).clone() if id(v) in kept else v for v in user]
            result = runner.unflatten(user, self.backend_name)
            if sizes is not None:
                runner.dynamic.check_outputs(method, self.backend_name, user, sizes)  # type: ignore[union-attr]
            # Only a call that passed every check moves the state on.
            self.state = {**state, **new}
        return result

    def _symbolicate(self, exc: BackendError, method: str) -> BackendRuntimeError:
        # A BackendError subclass whose __init__ skipped ours may lack debug_handles.
        handles: tuple[int, ...] = tuple(getattr(exc, "debug_handles", None) or ()) or (
            () if exc.debug_handle is None else (exc.debug_handle,)
        )
        if len(handles) > 1:
            return BackendRuntimeError(self._range_text(exc.message, handles), exc.message, handles[0], handles)
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

    def _range_text(self, message: str, handles: tuple[int, ...]) -> str:
        """A fused kernel's failure: every node of the range (the text ``symbolicate --fused`` prints)."""
        separate = self.separate_debug
        if not self.debug and separate is not None and all(h in separate["handles"] for h in handles):
            listed = " ".join(str(h) for h in handles[:MAX_RANGE_NODES])
            return (
                f"{message} (debug_handles=[{', '.join(str(h) for h in handles[:MAX_RANGE_NODES])}]; "
                f"symbolicate with: {separate['hint']} {listed} --fused)"
            )
        known = [self.debug[h] for h in dict.fromkeys(handles) if h in self.debug]
        missing = [h for h in dict.fromkeys(handles) if h not in self.debug]
        return f"{message}\n{format_range(known, missing)}"

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

    def forward(self, *args: object, **kwargs: object) -> Any:
        # Reached only when forward was not lowered: run() names the methods that were.
        return self.lowered.run("forward", args, kwargs)

    def __call__(self, *args: object, **kwargs: object) -> Any:
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
            or _global_forward_hooks  # torch registers global hooks into these dicts in place
            or _global_forward_pre_hooks
            or _global_backward_hooks
            or _global_backward_pre_hooks
            or _tracing_state()
        ):
            return super().__call__(*args, **kwargs)
        return self._core.run("forward", args, kwargs)

    def __repr__(self) -> str:
        lowered = self.lowered
        parts = [f"{name}: {lowered.delegation_of(name).summary()}" for name in lowered.methods]
        return f"WrapperModule(backend={lowered.backend_name!r}; {'; '.join(parts)})"

    def reset(self) -> None:
        """Return the lowered module's state to its initial values, as exported (or as its archive stores
        them). A lowered method named ``reset`` wins over this one: `pytest_backendconf.reset` always works."""
        self._core.reset()

    def bundled_inputs(self, method: str = "forward") -> list[tuple]:
        """The inputs bundled with ``method`` in the archive this module was loaded from (``[]`` if none).

        Each is a tuple of positional arguments; `pytest_backendconf.bundles`
        gives them with their expected outputs and tolerance.
        """
        from ._bundling import bundles

        return [bundle.inputs for bundle in bundles(self, method)]

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


def _method_caller(lowered: LoweredModule, name: str, spec: MethodSpec) -> Callable[..., Any]:
    def call(*args: object, **kwargs: object) -> Any:
        return lowered.run(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    call.__signature__ = spec.signature()  # type: ignore[attr-defined]
    return call


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}] tensor"
    return f"{type(value).__name__} {value!r:.60}"


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` where Python has it (3.11+); 3.10 keeps the exception as it is."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)
