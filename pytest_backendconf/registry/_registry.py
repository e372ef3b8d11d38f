"""The backend registry: a pluggy plugin manager, discovery, and validation.

Backends come from three places (docs/backend-contract.md#registration): the ``backendconf``
entry-point group, any plugin module or ``conftest.py`` defining a
``backendconf_*`` hook, and `register_backend` calls. Every backend is
recorded with where it came from, so that each error names its culprit.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
import os
import re
import sys
import types
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable, Iterable, cast

import pluggy

from .. import hookspecs
from ..backend import Backend, TorchScriptBackend
from ..capabilities import Capabilities
from ..cases import ModelCase
from ..errors import DuplicateBackendError, InvalidBackendError, PluginLoadError, RegistryError, UnknownBackendError

if TYPE_CHECKING:
    from pluggy import HookimplOpts

ENTRY_POINT_GROUP = "backendconf"
BACKEND_METHODS = ("is_available", "preprocess", "compile", "execute")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


class PluginLoadWarning(UserWarning):
    """A backend plugin that was not selected failed to import."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a backend came from, for messages and the report header."""

    description: str
    distribution: str | None = None
    version: str | None = None
    #: The file of the code that registered the backend (a conftest, a plugin module, an entry point's
    #: module, the caller of `register_backend`), or None; the preprocess cache's key holds its bytes.
    file: str | None = None

    def __str__(self) -> str:
        if self.distribution is None:
            return self.description
        return f"{self.description} (distribution {self.distribution} {self.version})"


@dataclasses.dataclass(frozen=True)
class RegisteredBackend:
    """A validated backend and its source."""

    backend: Backend
    source: Source

    @property
    def name(self) -> str:
        return self.backend.name

    def availability(self) -> tuple[bool, str]:
        """``(available, reason)``; the reason is empty when available.

        A backend may define ``unavailable_reason()`` to explain a false
        ``is_available()``; an exception counts as unavailable.
        """
        try:
            available = self.backend.is_available()
        except Exception as exc:  # the header must print whatever the backend does
            return False, f"is_available() raised {type(exc).__name__}: {exc}"
        if available is True:
            return True, ""
        if available is not False:
            return False, f"is_available() returned {available!r}, not a bool"
        explain = getattr(self.backend, "unavailable_reason", None)
        try:
            reason = str(explain()) if callable(explain) else ""
        except Exception as exc:
            reason = f"unavailable_reason() raised {type(exc).__name__}: {exc}"
        return False, reason or "is_available() returned False"


class _PluginManager(pluggy.PluginManager):
    """Accepts unmarked ``backendconf_*`` functions, as pytest does for ``pytest_*``,

    so that a ``conftest.py`` needs no import to register a backend.
    """

    def parse_hookimpl_opts(self, plugin: object, name: str) -> HookimplOpts | None:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("backendconf_"):
            if inspect.isroutine(getattr(plugin, name, None)):
                return cast("HookimplOpts", {})  # pluggy fills in every option's default
        return opts


def defines_hooks(plugin: object) -> bool:
    """Whether ``plugin`` (a module or object) implements a backendconf hook."""
    return any(
        name.startswith("backendconf_") and inspect.isroutine(getattr(plugin, name, None)) for name in dir(plugin)
    )


# Backends given to register_backend() by code, before any registry exists.
_EXPLICIT: list[RegisteredBackend] = []


def register_backend(backend: object) -> object:
    """Register ``backend`` for this process; returns it (usable as a decorator on an instance).

    Meant for scripts and notebooks; packages should use the entry-point
    group so that the backend is found without importing their code first.
    """
    globals_ = sys._getframe(1).f_globals
    caller = globals_.get("__name__", "?")
    source = Source(
        f"register_backend() in module {caller!r}", *_distribution_of(caller), file=globals_.get("__file__")
    )
    checked = check_backend(backend, source)
    for registered in _EXPLICIT:
        if registered.name == checked.name:
            if registered.backend is backend:
                return backend  # registering the same object again changes nothing
            raise DuplicateBackendError(
                f"backend name {checked.name!r} is registered twice: by {registered.source} and by {source}. "
                "Register it once, or give one backend another name."
            )
    installed = [ep for ep in _entry_points() if ep.name == checked.name]
    if installed:
        ep = installed[0]
        dist = getattr(ep, "dist", None)
        raise DuplicateBackendError(
            f"backend name {checked.name!r} is registered twice: by {source} and by the installed entry point "
            f"'{ep.name} = {ep.value}' (group {ENTRY_POINT_GROUP!r}"
            + (f", distribution {dist.name} {dist.version}" if dist else "")
            + "). Give your backend another name, or uninstall that package."
        )
    _EXPLICIT.append(RegisteredBackend(checked, source))
    return backend


def check_backend(backend: object, source: Source) -> Backend:
    """``backend`` as a `Backend`; `InvalidBackendError` unless it has the shape of docs/backend-contract.md."""
    what = _describe(backend)
    if inspect.isclass(backend):
        raise InvalidBackendError(
            f"{what} from {source} is a class; register an instance of it, e.g. register({backend.__name__}())"
        )
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidBackendError(
            f"{what} from {source} has name {name!r}; a backend's `name` must be a "
            "string matching [a-z][a-z0-9_]* (lower case, digits, underscores)"
        )
    if isinstance(backend, TorchScriptBackend):
        return cast(Backend, _check_torchscript(backend, f"{what} (backend {name!r}) from {source}"))
    missing = [m for m in BACKEND_METHODS if not callable(getattr(backend, m, None))]
    if missing:
        listed = ", ".join(f"`{m}`" for m in missing)
        raise InvalidBackendError(
            f"{what} (backend {name!r}) from {source} has no {listed} method; a backend "
            "needs is_available(), preprocess(program, compile_spec, debug_handles), "
            "compile(processed, method_compile_spec) and execute(handle, inputs)"
        )
    declared = getattr(backend, "capabilities", None)
    if declared is not None and not isinstance(declared, Capabilities):
        raise InvalidBackendError(
            f"{what} (backend {name!r}) from {source} has `capabilities` of type "
            f"{type(declared).__name__}; make it a pytest_backendconf.Capabilities(...)"
        )
    return cast(Backend, backend)  # its shape was checked above


def _check_torchscript(backend: TorchScriptBackend, what: str) -> TorchScriptBackend:
    """A `TorchScriptBackend` record whose fields have the types and shapes lowering needs."""
    library = backend.library
    if library is not None and not isinstance(library, (str, os.PathLike)):
        raise InvalidBackendError(
            f"{what} has library {library!r}; give the path of its shared library (a str) or None"
        )
    spec = backend.compile_spec
    if spec is not None:
        if not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec):
            raise InvalidBackendError(
                f"{what} has compile_spec {spec!r}; give a dict of method name -> dict of options, "
                'e.g. {"forward": {"": ""}}'
            )
        for method, options in spec.items():
            if not isinstance(options, Mapping) or not options:
                raise InvalidBackendError(
                    f"{what} has compile_spec[{method!r}] = {options!r}; each method's spec must be a non-empty "
                    'dict (torch._C._jit_to_backend cannot type an empty one): e.g. {"": ""}'
                )
    declared = backend.capabilities
    if declared is not None and not isinstance(declared, Capabilities):
        raise InvalidBackendError(
            f"{what} has `capabilities` of type {type(declared).__name__}; make it a "
            "pytest_backendconf.Capabilities(...)"
        )
    return backend


class BackendRegistry:
    """The backends known in this process, by name, each with its source."""

    def __init__(self) -> None:
        self.plugin_manager = _PluginManager(hookspecs.PROJECT_NAME)
        self.plugin_manager.add_hookspecs(hookspecs)
        self._sources: dict[int, Source] = {}
        self._backends: dict[str, RegisteredBackend] | None = None
        self._loaded_entry_points: set[tuple[str, str]] = set()
        self._all_entry_points_loaded = False
        #: Entry points that failed to import (not the selected one): ``{name: (source, error)}``.
        self.failed_entry_points: dict[str, tuple[Source, str]] = {}

    # --- discovery ------------------------------------------------------------

    def add_plugin(self, plugin: object, source: Source) -> bool:
        """Register ``plugin`` if it defines backendconf hooks; return whether it did."""
        if not defines_hooks(plugin):
            return False
        if not self.plugin_manager.is_registered(plugin):
            self.plugin_manager.register(plugin)
            self._sources[id(plugin)] = source if source.file else dataclasses.replace(source, file=file_of(plugin))
            self._backends = None
        return True

    def load_entry_points(self, select: str | None = None) -> None:
        """Load the ``backendconf`` entry points: only those named ``select`` if given.

        A failure to import the selected backend's entry point is an error;
        any other one only warns, so that one broken package does not stop
        the rest.
        """
        for ep in _entry_points():
            if select is not None and ep.name != select:
                continue
            if (ep.name, ep.value) in self._loaded_entry_points:
                continue
            self._loaded_entry_points.add((ep.name, ep.value))
            dist = getattr(ep, "dist", None)
            source = Source(
                f"entry point '{ep.name} = {ep.value}' (group {ENTRY_POINT_GROUP!r})",
                dist.name if dist else None,
                dist.version if dist else None,
            )
            try:
                loaded = ep.load()
                source = dataclasses.replace(source, file=file_of(sys.modules.get(ep.module)))
            except Exception as exc:
                text = f"{source} failed to import: {type(exc).__name__}: {exc}"
                if select is not None:
                    raise PluginLoadError(f"{text}. Fix or reinstall that package, or pick another backend.") from exc
                self.failed_entry_points[ep.name] = (source, f"{type(exc).__name__}: {exc}")
                warnings.warn(PluginLoadWarning(text), stacklevel=2)
                continue
            self._add_loaded(loaded, source)
        if select is None:
            self._all_entry_points_loaded = True

    def _add_loaded(self, loaded: object, source: Source) -> None:
        if self.add_plugin(loaded, source):
            return
        # An entry point may name a backend instance directly.
        check_backend(loaded, source)
        self.add_plugin(_SingleBackend(loaded), source)

    # --- lookup ------------------------------------------------------------------

    def backends(self) -> dict[str, RegisteredBackend]:
        """Every registered backend by name, validated; duplicate names are an error."""
        if self._backends is None:
            found: dict[str, RegisteredBackend] = {}
            for registered in self._collect():
                previous = found.get(registered.name)
                if previous is not None and previous.backend is not registered.backend:
                    raise DuplicateBackendError(
                        f"backend name {registered.name!r} is registered twice: by "
                        f"{previous.source} and by {registered.source}. Uninstall or "
                        "unregister one of them, or give one backend another name."
                    )
                found.setdefault(registered.name, registered)
            self._backends = found
        return self._backends

    def get(self, name: str) -> RegisteredBackend:
        """The backend called ``name``, or `UnknownBackendError` listing the known ones."""
        backends = self.backends()
        if name in backends:
            return backends[name]
        if not self._all_entry_points_loaded:
            # Only the selected entry point was imported; import the rest to
            # list what is there (their failures only warn).
            self.load_entry_points()
            return self.get(name)
        known = ", ".join(f"{n} (from {b.source})" for n, b in sorted(backends.items()))
        raise UnknownBackendError(
            f"unknown backend {name!r}. Registered backends: {known or 'none'}. "
            "Install a package that provides it (entry-point group 'backendconf'), "
            "define backendconf_register_backends in a conftest.py or a plugin given "
            "with -p, or check the spelling."
        )

    def _collect(self) -> Iterable[RegisteredBackend]:
        caller = self.plugin_manager.hook.backendconf_register_backends
        # Call each implementation ourselves so that every backend is tied to
        # the plugin that registered it: a duplicate must name both sources.
        for impl in reversed(caller.get_hookimpls()):
            source = self._sources.get(id(impl.plugin)) or Source(
                f"plugin {impl.plugin_name}", file=file_of(impl.plugin)
            )
            collected: list[RegisteredBackend] = []

            def register(backend: object, _into=collected, _source=source) -> None:
                _into.append(RegisteredBackend(check_backend(backend, _source), _source))

            impl.function(**{arg: register for arg in impl.argnames})
            yield from collected
        yield from _EXPLICIT

    def cases(self) -> list[ModelCase]:
        """Everything registered through ``backendconf_register_cases``; anything but a `ModelCase` is a
        `RegistryError` naming it and the fix."""
        collected: list[object] = []
        self.plugin_manager.hook.backendconf_register_cases(register=collected.append)
        for case in collected:
            if not isinstance(case, ModelCase):
                raise RegistryError(
                    f"backendconf_register_cases registered {type(case).__name__} {str(case)[:60]!r}, not a model "
                    "case: register pytest_backendconf.ModelCase objects"
                )
        return [case for case in collected if isinstance(case, ModelCase)]


class _SingleBackend:
    """Adapts a backend object named directly by an entry point into a plugin."""

    def __init__(self, backend: object) -> None:
        self.backend = backend

    @hookspecs.hookimpl
    def backendconf_register_backends(self, register: Callable[[object], None]) -> None:
        register(self.backend)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    # One installed distribution can be visible twice on sys.path (an
    # editable install plus a build directory); load each entry point once.
    seen: set[tuple[str, str, str | None]] = set()
    unique = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        key = (ep.name, ep.value, dist.name if dist else None)
        if key not in seen:
            seen.add(key)
            unique.append(ep)
    return unique


def _describe(obj: object) -> str:
    kind = obj if inspect.isclass(obj) else type(obj)
    return f"object {kind.__module__}.{kind.__qualname__}"


@functools.cache
def _packages_to_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def _distribution_of(module_name: str) -> tuple[str | None, str | None]:
    """The installed distribution that provides ``module_name``, if any."""
    top = module_name.split(".")[0]
    names = _packages_to_distributions().get(top)
    if not names:
        return None, None
    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return names[0], None


def file_of(plugin: object) -> str | None:
    """The file a plugin's code is in: a module's own, else the module of its class."""
    if not isinstance(plugin, types.ModuleType):
        plugin = sys.modules.get(type(plugin).__module__)
    found = getattr(plugin, "__file__", None)
    return found if isinstance(found, str) else None


def source_of_module(module: object, description: str) -> Source:
    """A `Source` for a plugin module, with its distribution when installed."""
    return Source(description, *_distribution_of(getattr(module, "__name__", "") or ""))


# The registry of the running pytest session (set by the plugin), so that
# to_backend("name") inside a test sees backends from conftests and -p plugins.
_ACTIVE: BackendRegistry | None = None


def set_active_registry(registry: BackendRegistry | None) -> None:
    """Make ``registry`` the one `lookup_backend` asks first (None: none), as the plugin does per session."""
    global _ACTIVE
    _ACTIVE = registry


def active_registry() -> BackendRegistry | None:
    """The registry `set_active_registry` last set: the running pytest session's, or None outside one."""
    return _ACTIVE


# Backends found through entry points outside pytest, by name: scanning the
# installed distributions costs milliseconds, and load() asks on every call.
_FOUND: dict[str, RegisteredBackend] = {}


def lookup_backend(name: str) -> RegisteredBackend:
    """The backend called ``name``: from the active pytest session's registry if it
    has it, else from `register_backend` calls and the entry points of this process."""
    if _ACTIVE is not None and name in _ACTIVE.backends():
        return _ACTIVE.get(name)
    for registered in _EXPLICIT:
        if registered.name == name:
            return registered
    if name not in _FOUND:
        registry = BackendRegistry()
        registry.load_entry_points(select=name)
        _FOUND[name] = registry.get(name)
    return _FOUND[name]
