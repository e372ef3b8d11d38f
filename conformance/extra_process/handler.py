"""In the suite's extra process (`_extra_process`): load the archives on the target, then lower afresh.

The target phase runs with the backend's host-only modules and torch's
tracing modules blocked, each scenario's backend (or its availability
stand-in) registered under the backend's name; the host phase lifts the
blocker and lowers cases as a fresh process does.
"""

from __future__ import annotations

import sys
from typing import Any

from pytest_backendconf import lowering as _lowering
from pytest_backendconf.registry import BackendRegistry, Source, active_registry, lookup_backend, set_active_registry
from pytest_backendconf.target import call_on_target, load_on_target, prepare_target

from .._session_work import FreshLowerer
from .stand_in import StandIn


class ExtraProcessHandler:
    """In the child: the target phase with the blocker in place, then the host phase without it."""

    def __init__(self, options: dict, channel: Any) -> None:
        self.registry = active_registry()
        self.real = lookup_backend(options["backend"])
        self.backend_version = options["backend_version"]
        self.workdir = options["workdir"]
        self.channel = channel
        self.blocker = channel.blocker
        self.lowerer: FreshLowerer | None = None
        prepare_target(channel, self.real.name)

    def __call__(self, request: dict, channel: Any) -> dict:
        for scenario in request["scenarios"]:
            channel.send({"kind": "started", "key": scenario["key"]})
            channel.send(
                {"kind": "item", "key": scenario["key"], **_run_scenario(scenario, self.real.backend, channel)}
            )
        if request["lowerings"]:
            # The host phase: lifting the blocker and the tracing guard lets the compiler and torch's
            # tracing work from here on, so a request without lowerings leaves both in place: the
            # process stays on the target for the scenarios of the next request.
            if self.blocker in sys.meta_path:
                sys.meta_path.remove(self.blocker)
            if channel.tracing_guard is not None:
                channel.tracing_guard.lift()
            set_active_registry(self.registry)
            try:
                if self.lowerer is None:  # one per process: later requests bring more cases to lower
                    self.lowerer = FreshLowerer(self.real, self.backend_version, self.registry)
                lowerer = self.lowerer
            except Exception as exc:
                for item in request["lowerings"]:
                    channel.send(
                        {"kind": "item", "key": item["key"], "error": f"setting up failed: {type(exc).__name__}: {exc}"}
                    )
                return {}
            for item in request["lowerings"]:
                channel.send({"kind": "started", "key": item["key"]})
                channel.send({"kind": "item", "key": item["key"], **lowerer.lower(item, self.workdir)})
        return {}


def _run_scenario(scenario: dict, backend: Any, channel: Any) -> dict:
    from pytest_backendconf.target import error_record, pack_value, unpack_value

    options = scenario["stand_in"]
    if options is not None:
        backend = StandIn(backend, **options, row=scenario["row"]).backend
    set_active_registry(_registry_of(backend))
    record: dict[str, Any] = {"loaded": False, "error": None, "outputs": None, "errors": {}}
    try:
        wrapper = load_on_target(channel, lambda: _lowering.load(scenario["archive"]))
        record["loaded"] = True
    except Exception as exc:
        record["error"] = error_record(exc)
        return record
    outputs: dict[str, list] = {}
    calls = unpack_value(scenario["calls"], "target inputs")
    for method, examples in calls.items():
        values, errors = outputs.setdefault(method, []), record["errors"].setdefault(method, [])
        for args, kwargs in examples:
            try:
                values.append(call_on_target(channel, getattr(wrapper, method), args, kwargs))
                errors.append(None)
            except Exception as exc:
                values.append(None)
                errors.append(error_record(exc))
    record["outputs"] = pack_value(outputs, "target outputs")
    return record


class _OneBackend:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def backendconf_register_backends(self, register: Any) -> None:
        register(self.backend)


def _registry_of(backend: Any) -> Any:
    registry = BackendRegistry()
    registry.add_plugin(_OneBackend(backend), Source("a suite's extra process"))
    return registry
