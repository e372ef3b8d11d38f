"""The simulated target (docs/backend-contract.md#availability): load an archive in a fresh interpreter that cannot import host-only modules.

`run_on_target` starts ``python -m pytest_backendconf._target`` with a
request directory. Before anything else the child installs an import
blocker for:

- the backend's ``capabilities.host_only_modules`` (read in the parent when
  it knows the backend; else the child reads them after importing the
  plugins, and fails if importing the backend already imported one),
- ``torch._dynamo`` and ``torch.export._trace``, torch's tracing entry points
  (``torch.export.export``, ``torch.compile`` and dynamo's export all import
  them on first use; ``import torch`` itself imports neither, and loading and
  running an archive needs neither), and
- any extra ``blocked_modules``.

Importing a blocked module raises ``ImportError("blocked on the target:
<module> is host-only")``. The child then imports the plugins that
registered the backend in the parent (entry points are found as usual),
loads the archive with `pytest_backendconf.load`, runs the given inputs, and
writes the outputs back. Inputs and outputs travel as JSON plus raw tensor
files, the archive's own non-executable encoding; errors come back as their
type name and full text.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
from typing import Any, Mapping, Sequence

from ._compat import TRACING_MODULES

#: TRACING_MODULES (from _compat, where torch's private names live): torch's
#: tracing entry points, not needed to load or run an archive.
_REQUEST = "request.json"
_RESULT = "result.json"


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
    from ._archive import ValueEncoder, decode_value, tensor_from_bytes

    archive_path = os.path.abspath(os.fspath(archive_path))
    calls = {str(m): [tuple(args) for args in calls] for m, calls in (inputs_by_method or {}).items()}
    blocked = _blocked_modules(archive_path, blocked_modules)
    if plugins is None:
        plugins = active_plugins()
    with tempfile.TemporaryDirectory(prefix="backendconf-target-") as workdir:
        encoder = ValueEncoder()
        encoded = encoder.encode(calls, "target inputs")
        os.mkdir(os.path.join(workdir, "in"))
        for i, data in enumerate(encoder.data):
            with open(os.path.join(workdir, "in", f"{i}.bin"), "wb") as f:
                f.write(data)
        request = {
            "archive": archive_path,
            "calls": encoded,
            "tensors": encoder.meta,
            "blocked": list(blocked),
            "plugins": [os.path.abspath(p) if is_path(p) else p for p in plugins],
            "sys_path": [p for p in sys.path if p],
        }
        with open(os.path.join(workdir, _REQUEST), "w", encoding="utf-8") as f:
            json.dump(request, f)
        result: dict[str, Any] = {
            "ok": False, "loaded": False, "error": None, "backend": None, "methods": [],
            "outputs": {}, "errors": {}, "blocked": list(blocked), "returncode": None, "stderr": "",
        }
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pytest_backendconf._target", workdir],
                capture_output=True, text=True, timeout=timeout, env=env,
            )
        except subprocess.TimeoutExpired as exc:
            result["error"] = {
                "type": "TargetTimeoutError",
                "message": f"the target process did not finish within {timeout} s and was killed "
                f"(loading {archive_path!r}); stderr: {tail_text(exc.stderr)}",
            }
            result["stderr"] = tail_text(exc.stderr)
            return result
        result["returncode"] = done.returncode
        result["stderr"] = done.stderr
        path = os.path.join(workdir, _RESULT)
        if not os.path.exists(path):
            result["error"] = {
                "type": "TargetCrashError",
                "message": f"the target process exited with code {done.returncode} without a result "
                f"(loading {archive_path!r}); stderr: {tail_text(done.stderr)}",
            }
            return result
        with open(path, encoding="utf-8") as f:
            reply = json.load(f)
        tensors = []
        for i, meta in enumerate(reply["tensors"]):
            with open(os.path.join(workdir, "out", f"{i}.bin"), "rb") as f:
                tensors.append(tensor_from_bytes(f.read(), meta, f"target output tensor {i}"))
        result.update(
            loaded=reply["loaded"], error=reply["error"], backend=reply["backend"],
            methods=reply["methods"], blocked=reply["blocked"],
        )
        ok = reply["loaded"]
        for method, records in reply["results"].items():
            result["outputs"][method] = [
                decode_value(r["value"], tensors, "target output") if r["ok"] else None for r in records
            ]
            result["errors"][method] = [
                None if r["ok"] else {"type": r["type"], "message": r["message"]} for r in records
            ]
            ok = ok and all(r["ok"] for r in records)
        result["ok"] = ok
        return result


def _blocked_modules(archive_path: str, extra: Sequence[str]) -> tuple[str, ...]:
    from ._archive import read_archive
    from .errors import ArchiveError

    names: list[str] = []
    try:
        names.extend(_host_only_modules(read_archive(archive_path).backend_name))
    except (ArchiveError, OSError):
        pass  # the child reports the archive's problem itself
    names.extend(TRACING_MODULES)
    names.extend(extra)
    return tuple(dict.fromkeys(names))


def _host_only_modules(backend_name: str) -> tuple[str, ...]:
    """The backend's declared host-only modules, if this process can find the backend.

    Looks in the active registry, then at the entry point of that name only:
    an unknown backend is the child's to report, without importing every
    other installed backend here.
    """
    from . import _registry
    from .capabilities import capabilities_of

    found = None
    try:
        if _registry._ACTIVE is not None:
            found = _registry._ACTIVE.backends().get(backend_name)
        if found is None:
            registry = _registry.BackendRegistry()
            registry.load_entry_points(select=backend_name)
            found = registry.backends().get(backend_name)
    except Exception:  # a broken plugin is reported by the child, when it loads
        return ()
    return capabilities_of(found.backend).host_only_modules if found else ()


def active_plugins() -> list[str]:
    from . import _registry

    registry = _registry._ACTIVE
    if registry is None:
        return []
    found = []
    for plugin in registry.plugin_manager.get_plugins():
        if not isinstance(plugin, types.ModuleType) or not _registry.defines_hooks(plugin):
            continue
        file = getattr(plugin, "__file__", None)
        if file and (os.path.basename(file) == "conftest.py" or plugin.__name__ == "__main__"):
            found.append(os.path.abspath(file))
        else:
            found.append(plugin.__name__)
    return found


def is_path(plugin: str) -> bool:
    return plugin.endswith(".py") or os.sep in plugin


def tail_text(text: Any, limit: int = 2000) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text or ""
    return text if len(text) <= limit else "..." + text[-limit:]


# --- the child ------------------------------------------------------------------------------------


class ImportBlocker(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that refuses the given modules and their submodules."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(dict.fromkeys(names))

    def add(self, names: Sequence[str]) -> list[str]:
        """Block ``names`` too; return those of them that are imported already."""
        self.names = tuple(dict.fromkeys(self.names + tuple(names)))
        new = ImportBlocker(names)
        return sorted(m for m in sys.modules if new.blocks(m))

    def blocks(self, fullname: str) -> bool:
        return any(fullname == n or fullname.startswith(n + ".") for n in self.names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if self.blocks(fullname):
            raise ImportError(f"blocked on the target: {fullname} is host-only", name=fullname)
        return None


def install_blocker(names: Sequence[str]) -> ImportBlocker:
    blocker = ImportBlocker(names)
    sys.meta_path.insert(0, blocker)
    for loaded in [m for m in sys.modules if blocker.blocks(m)]:
        del sys.modules[loaded]
    return blocker


def import_plugins(specs: Sequence[str]) -> None:
    from ._registry import BackendRegistry, Source, set_active_registry, source_of_module
    from .errors import PluginLoadError

    registry = BackendRegistry()
    for spec in specs:
        try:
            if is_path(spec):
                module = _import_file(spec)
                kind = "conftest" if os.path.basename(spec) == "conftest.py" else "plugin file"
                source = Source(f"{kind} {spec}")
            else:
                module = importlib.import_module(spec)
                source = source_of_module(module, f"plugin {spec}")
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {spec!r} failed to import on the target: {type(exc).__name__}: {exc}. A plugin "
                "that registers a backend must import without the backend's host-only modules."
            ) from exc
        registry.add_plugin(module, source)
    set_active_registry(registry)


def _import_file(path: str) -> types.ModuleType:
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # as pytest's default "prepend" import mode does
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def error_record(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def main(argv: Sequence[str] | None = None) -> int:
    """The child: ``python -m pytest_backendconf._target WORKDIR``."""
    import faulthandler

    faulthandler.enable()
    argv = list(sys.argv[1:] if argv is None else argv)
    workdir = argv[0]
    with open(os.path.join(workdir, _REQUEST), encoding="utf-8") as f:
        request = json.load(f)
    for entry in request["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    blocker = install_blocker(request["blocked"])
    reply: dict[str, Any] = {
        "loaded": False, "error": None, "backend": None, "methods": [], "results": {}, "tensors": [],
        "blocked": list(blocker.names),
    }
    try:
        import_plugins(request["plugins"])
        from ._archive import read_archive
        from .errors import BackendContractError

        archive = read_archive(request["archive"])
        reply["backend"], reply["methods"] = archive.backend_name, list(archive.methods)
        # The parent may not know the backend (a plugin only the child imports): ask it here.
        host_only = _host_only_modules(archive.backend_name)
        already = blocker.add(host_only)
        reply["blocked"] = list(blocker.names)
        if already:
            raise BackendContractError(
                f"importing backend {archive.backend_name!r} imported its host-only module(s) "
                f"{', '.join(already)}; a target does not have them, so the backend may import them "
                "only inside preprocess()"
            )
        wrapper = archive.instantiate()
        reply["loaded"] = True
    except Exception as exc:
        reply["error"] = error_record(exc)
    if reply["loaded"]:
        from ._archive import ValueEncoder, decode_value, tensor_from_bytes

        tensors = []
        for i, meta in enumerate(request["tensors"]):
            with open(os.path.join(workdir, "in", f"{i}.bin"), "rb") as f:
                tensors.append(tensor_from_bytes(f.read(), meta, f"target input tensor {i}"))
        calls = decode_value(request["calls"], tensors, "target inputs")
        encoder = ValueEncoder()
        for method, arg_tuples in calls.items():
            records = reply["results"].setdefault(method, [])
            for args in arg_tuples:
                try:
                    value = getattr(wrapper, method)(*args)
                    records.append({"ok": True, "value": encoder.encode(value, f"output of method {method!r}")})
                except Exception as exc:
                    records.append({"ok": False, **error_record(exc)})
        os.mkdir(os.path.join(workdir, "out"))
        for i, data in enumerate(encoder.data):
            with open(os.path.join(workdir, "out", f"{i}.bin"), "wb") as f:
                f.write(data)
        reply["tensors"] = encoder.meta
    temporary = os.path.join(workdir, _RESULT + ".tmp")
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(reply, f)
    os.replace(temporary, os.path.join(workdir, _RESULT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
