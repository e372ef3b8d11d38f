"""The simulated target (docs/backend-contract.md#availability): load an archive in a fresh interpreter that cannot import host-only modules.

`run_on_target` runs the load in a child process (`pytest_backendconf.target._child`).
Before anything else the child installs an import blocker for:

- the backend's ``capabilities.host_only_modules`` (read in the parent when
  it knows the backend; else the child reads them after importing the
  plugins, and fails if importing the backend already imported one),
- ``torch._dynamo`` and ``torch.export._trace``, torch's tracing entry points
  (``torch.export.export``, ``torch.compile`` and dynamo's export all import
  them on first use; ``import torch`` itself imports neither, and loading and
  running an archive needs neither), except those the backend declares in
  ``capabilities.target_runtime_modules`` (ExecuTorch's runtime imports
  ``torch._dynamo`` and traces nothing), and
- any extra ``blocked_modules``.

Importing a blocked module raises ``ImportError("blocked on the target:
<module> is host-only")``. Whatever the blocker lets in, calling
``torch.export.export`` or ``torch.compile`` on the target fails the load
or the call (`_child.TracingCallGuard`): importing a tracing module may be a
runtime's business, a trace never is. The child then imports the plugins that
registered the backend in the parent (entry points are found as usual),
loads the archive with `pytest_backendconf.load`, runs the given inputs, and
sends the outputs back. Inputs and outputs travel in the archive's own
non-executable encoding; errors come back as their type name and full text.
`blocked_modules` is the one place that decides what a target lacks.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from ._child import Ended, error_record, tail_text
from ._link import open_child
from ._child import ImportBlocker, active_plugins, import_plugins, install_blocker, is_path  # noqa: F401  (public names)

# torch's tracing modules, not needed to load or run an archive: one list, beside target_runtime_modules.
from ..capabilities import TRACING_MODULES

if TYPE_CHECKING:
    from ..capabilities import Capabilities
    from ._child import Channel, TracingCallGuard

_T = TypeVar("_T")


def blocked_modules(capabilities: Capabilities, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """What a simulated target cannot import: the backend's host-only modules, torch's tracing
    modules less those its runtime imports (``target_runtime_modules``), and ``extra``.

    Every child that simulates a target asks here (``capabilities`` is the
    backend's `Capabilities`).
    """
    return tuple(dict.fromkeys([*capabilities.host_only_modules, *blocked_tracing_modules(capabilities), *extra]))


def blocked_tracing_modules(capabilities: Capabilities) -> tuple[str, ...]:
    """`TRACING_MODULES` less those the backend declares in ``target_runtime_modules``."""
    allowed = set(capabilities.target_runtime_modules)
    return tuple(m for m in TRACING_MODULES if m not in allowed)


def run_on_target(
    archive_path: str | os.PathLike,
    inputs_by_method: Mapping[str, Sequence[tuple]] | None = None,
    *,
    blocked_modules: Sequence[str] = (),
    plugins: Sequence[str] | None = None,
    timeout: float = 60,
) -> dict[str, Any]:
    """Load ``archive_path`` on a simulated target and call its methods there.

    :param inputs_by_method: ``{method: [args_tuple, ...]}``; each tuple is
        one call's positional arguments (tensors, scalars, and lists, tuples
        or dicts of them).
    :param blocked_modules: modules to block besides the backend's
        ``host_only_modules`` and `TRACING_MODULES`.
    :param plugins: modules (by name) or ``conftest.py``/plugin file paths
        that register the backend, imported by the child before loading.
        ``None`` passes the plugin modules of the active pytest session's
        registry (its conftests and ``-p`` plugins).
    :param timeout: seconds before the child is killed.
    :returns: a dict: ``ok`` (loaded and every call succeeded), ``loaded``,
        ``error`` (``None`` or ``{"type", "message"}`` when loading failed or
        the child crashed or timed out), ``backend``, ``methods``,
        ``outputs`` (``{method: [value or None]}``), ``errors``
        (``{method: [None or {"type", "message"}]}``), ``blocked`` (the
        modules the child blocked), ``returncode`` and ``stderr``.
    """
    from ._child import pack_value, unpack_value

    archive_path = os.path.abspath(os.fspath(archive_path))
    calls = {str(m): [tuple(args) for args in calls] for m, calls in (inputs_by_method or {}).items()}
    blocked = _blocked_for(archive_path, blocked_modules)
    result: dict[str, Any] = {
        "ok": False,
        "loaded": False,
        "error": None,
        "backend": None,
        "methods": [],
        "outputs": {},
        "errors": {},
        "blocked": list(blocked),
        "returncode": None,
        "stderr": "",
    }
    child = open_child(
        "pytest_backendconf.target._target:TargetHandler",
        blocked=blocked,
        plugins=plugins,
        startup_timeout=timeout,
        refuse_tracing=True,
        on_target=True,
    )
    try:
        archive = child.file(archive_path)
        reply = child.request({"archive": archive, "calls": pack_value(calls, "target inputs")}, timeout=timeout)
    finally:
        child.close()
    result["stderr"] = child.stderr()
    if isinstance(reply, Ended):
        result["returncode"] = reply.returncode
        if reply.unreachable:
            result["error"] = {
                "type": "TargetUnreachable",
                "message": f"{reply.unreachable} (loading {archive_path!r})",
            }
        elif reply.setup_error is not None:
            result["error"] = {"type": reply.setup_error["type"], "message": reply.setup_error["message"]}
        elif reply.timed_out is not None:
            result["error"] = {
                "type": "TargetTimeoutError",
                "message": f"the target process did not finish within {timeout} s and was killed "
                f"(loading {archive_path!r}); stderr: {tail_text(reply.stderr)}",
            }
        else:
            result["error"] = {
                "type": "TargetCrashError",
                "message": f"the target process {reply.describe()} (loading {archive_path!r}); "
                f"stderr: {tail_text(reply.stderr)}",
            }
        return result
    result["returncode"] = child.ended.returncode if child.ended else None
    result.update(
        loaded=reply["loaded"],
        error=reply["error"],
        backend=reply["backend"],
        methods=reply["methods"],
        blocked=reply["blocked"],
    )
    ok = reply["loaded"]
    outputs = unpack_value(reply["outputs"], "target outputs") if reply["loaded"] else {}
    for method, records in reply["results"].items():
        values = iter(outputs.get(method, []))
        result["outputs"][method] = [next(values) if r is None else None for r in records]
        result["errors"][method] = [
            None if r is None else {"type": r["type"], "message": r["message"]} for r in records
        ]
        ok = ok and all(r is None for r in records)
    result["ok"] = ok
    return result


def _blocked_for(archive_path: str, extra: Sequence[str]) -> tuple[str, ...]:
    from ..archive import read_archive
    from ..capabilities import Capabilities
    from ..errors import ArchiveError

    capabilities = Capabilities()
    try:
        capabilities = target_capabilities(read_archive(archive_path).backend_name)
    except (ArchiveError, OSError):
        pass  # the child reports the archive's problem itself
    return blocked_modules(capabilities, extra)


def host_only_modules(backend_name: str) -> tuple[str, ...]:
    """The backend's declared host-only modules, if this process can find the backend."""
    return target_capabilities(backend_name).host_only_modules


def target_capabilities(backend_name: str) -> Capabilities:
    """The backend's declared `Capabilities`, if this process can find the backend (else the defaults).

    Looks in the active registry, then at the entry point of that name only:
    an unknown backend is the child's to report, without importing every
    other installed backend here.
    """
    from ..registry import BackendRegistry, active_registry
    from ..capabilities import Capabilities, capabilities_of

    found = None
    try:
        active = active_registry()
        if active is not None:
            found = active.backends().get(backend_name)
        if found is None:
            registry = BackendRegistry()
            registry.load_entry_points(select=backend_name)
            found = registry.backends().get(backend_name)
    except Exception:  # a broken plugin is reported by the child, when it loads
        return Capabilities()
    return capabilities_of(found.backend) if found else Capabilities()


def prepare_target(channel: Channel, backend_name: str) -> None:
    """In a target child, once the plugins are imported: fit the blocker to the backend.

    The parent may not know the backend (a plugin only the child imports), so
    the child asks again: the backend's ``target_runtime_modules`` are let in,
    its host-only modules blocked (importing the backend must not have
    imported them), and the tracing guard names it.
    """
    from ..errors import BackendContractError

    capabilities = target_capabilities(backend_name)
    channel.blocker.allow(capabilities.target_runtime_modules)
    already = channel.blocker.add(capabilities.host_only_modules)
    if channel.tracing_guard is not None:
        channel.tracing_guard.backend_name = backend_name
    if already:
        raise BackendContractError(
            f"importing backend {backend_name!r} imported its host-only module(s) "
            f"{', '.join(already)}; a target does not have them, so the backend may import them "
            "only inside preprocess()"
        )


def load_on_target(channel: Channel, load: Callable[[], _T]) -> _T:
    """``load()`` (`lowering.instantiate`) on the target; a trace during it fails the load."""
    guard = channel.tracing_guard
    mark = guard.mark() if guard is not None else 0
    try:
        loaded = load()
    except Exception as exc:
        if guard is not None:
            # The trace is the cause, not the "damaged blob" the load's wrapping would suggest.
            _raise_traced(guard, mark, exc)
        raise
    if guard is not None:
        guard.check(mark)  # also when compile() caught the guard's error and went on
    return loaded


def call_on_target(
    channel: Channel, method: Callable[..., _T], args: Sequence[object], kwargs: Mapping[str, object] | None = None
) -> _T:
    """One call of a loaded method on the target; a trace during it fails the call."""
    guard = channel.tracing_guard
    mark = guard.mark() if guard is not None else 0
    try:
        value = method(*args, **(kwargs or {}))
    except Exception as exc:
        if guard is not None:
            _raise_traced(guard, mark, exc)
        raise
    if guard is not None:
        guard.check(mark)
    return value


def _raise_traced(guard: TracingCallGuard, mark: int, exc: Exception) -> None:
    try:
        guard.check(mark)
    except Exception as traced:
        raise traced from exc


# --- the child ------------------------------------------------------------------------------------


class TargetHandler:
    """In the child: load one archive with the blocker in place and make the calls."""

    def __init__(self, options: Mapping[str, Any], channel: Channel) -> None:
        self.channel = channel
        self.blocker = channel.blocker

    def __call__(self, request: Mapping[str, Any], channel: Channel) -> dict[str, Any]:
        from ..archive import read_archive
        from ..lowering import instantiate
        from ._child import pack_value, unpack_value

        reply: dict[str, Any] = {
            "loaded": False,
            "error": None,
            "backend": None,
            "methods": [],
            "results": {},
            "blocked": list(self.blocker.names),
            "outputs": None,
        }
        try:
            archive = read_archive(request["archive"])
            reply["backend"], reply["methods"] = archive.backend_name, list(archive.methods)
            prepare_target(self.channel, archive.backend_name)
            reply["blocked"] = list(self.blocker.names)
            wrapper = load_on_target(self.channel, lambda: instantiate(archive))
            reply["loaded"] = True
        except Exception as exc:
            reply["error"] = error_record(exc)
            return reply
        calls = unpack_value(request["calls"], "target inputs")
        outputs: dict[str, list] = {}
        for method, arg_tuples in calls.items():
            records = reply["results"].setdefault(method, [])
            for args in arg_tuples:
                try:
                    outputs.setdefault(method, []).append(call_on_target(self.channel, getattr(wrapper, method), args))
                    records.append(None)
                except Exception as exc:
                    records.append(error_record(exc))
        reply["outputs"] = pack_value(outputs, "target outputs")
        return reply
