"""The TorchScript target: saved files loaded and run in a fresh process with host-only modules blocked.

The child (`TargetHandler`, run by `pytest_backendconf.target.ChildProcess`)
imports no plugin: like a device, it has only torch and the backend's shared
library, which it loads before anything else. Each file is loaded with
``torch.jit.load`` or the lite interpreter, its calls run on the inputs the
parent sent (in the archive's non-executable encoding, never a pickle), and
the outputs sent back for the parent to compare. A load
or call that fails comes back as its exception type and full text; so do
the results of the wrapper's methods and bundled inputs the parent asks about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from ..target import ChildProcess, Ended, blocked_modules, error_record, pack_value, unpack_value

if TYPE_CHECKING:
    from torch.jit.mobile import LiteScriptModule

    from ..capabilities import Capabilities

#: Seconds the target child may take to start (import torch) and to answer.
TARGET_TIMEOUT = 240.0


def run_torchscript_target(
    library: str | None,
    models: Sequence[Mapping[str, Any]],
    capabilities: Capabilities,
    *,
    timeout: float = TARGET_TIMEOUT,
) -> dict[str, Any]:
    """Load and run ``models`` in a target child; ``{"models": [...], "blocked": [...]}`` or ``{"ended": text}``.

    Each model is ``{"path", "kind": "jit" | "lite", "inputs": the calls' argument lists (`pack_value`),
    "methods_called": the method of each call, "methods": [names of methods without arguments to call],
    "bundled": bool}``. Its reply: ``{"error": None | {type, module, message}, "methods": {name: repr of the
    result}, "outputs": the calls' outputs (packed), "bundled": the bundled inputs' outputs (packed) | None}``.
    """
    child = ChildProcess(
        "pytest_backendconf.torchscript._target:TargetHandler",
        {"library": library, "models": [dict(m) for m in models]},
        blocked=blocked_modules(capabilities),
        plugins=[],
        startup_timeout=timeout,
        refuse_tracing=True,
    )
    try:
        reply = child.request({"kind": "run"}, timeout=timeout)
        if isinstance(reply, Ended):
            return {"ended": reply.describe(), "stderr": child.stderr()[-4000:]}
        return dict(reply)
    finally:
        child.close()


class TargetHandler:
    """In the target child: load the library, then answer the one request.

    ``channel`` is the child's ``target`` Channel, a type that room does not export (hence ``Any``).
    """

    def __init__(self, options: dict, channel: Any) -> None:
        self.options = options
        self.blocker = channel.blocker
        if options.get("library"):
            torch.ops.load_library(options["library"])

    def __call__(self, request: dict, channel: Any) -> dict:
        results = [self._run(model) for model in self.options["models"]]
        return {"kind": "result", "models": results, "blocked": list(self.blocker.names)}

    def _run(self, model: Mapping[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"error": None, "methods": {}, "bundled": None}
        try:
            if model["kind"] == "lite":
                from torch.jit import mobile

                loaded = mobile._load_for_lite_interpreter(model["path"])
            else:
                loaded = torch.jit.load(model["path"])
            arguments = unpack_value(model["inputs"], "the target's inputs") if model.get("inputs") else []
            lite = model["kind"] == "lite"
            outputs = [_call(loaded, m, tuple(a), lite) for m, a in zip(model["methods_called"], arguments)]
            reply["outputs"] = pack_value(outputs, "the target's outputs")
            for name in model.get("methods", ()):
                reply["methods"][name] = repr(loaded.run_method(name) if lite else getattr(loaded, name)())
            if model.get("bundled"):
                bundled = loaded.run_method("get_all_bundled_inputs") if lite else loaded.get_all_bundled_inputs()
                reply["bundled"] = pack_value([loaded(*args) for args in bundled], "the bundled inputs' outputs")
        except Exception as exc:  # the parent reports it: type and full text
            reply["error"] = error_record(exc)
        return reply


def _call(loaded: torch.jit.ScriptModule | LiteScriptModule, method: str, args: tuple, lite: bool) -> object:
    if method == "forward":
        return loaded(*args)
    return loaded.run_method(method, *args) if lite else getattr(loaded, method)(*args)


# --- lowering in a fresh process (is preprocess deterministic?) -------------------------------------


def lower_in_fresh_process(
    library: str | None, backend: str, scripted: Sequence[Mapping[str, Any]], *, timeout: float = TARGET_TIMEOUT
) -> dict[str, Any]:
    """Lower each ``{"path": a torch.jit.save'd scripted module, "spec": method compile spec}`` in a fresh
    process; ``{"fingerprints": [sha256 of its processed module | {error}]}`` or ``{"ended": text}``.

    Debug handles come from a counter of the process: two fresh processes
    lowering the same files in the same order hand out the same ones, so a
    deterministic preprocess gives the same fingerprints in both.
    """
    child = ChildProcess(
        "pytest_backendconf.torchscript._target:LoweringHandler",
        {"library": library, "backend": backend, "scripted": [dict(s) for s in scripted]},
        plugins=[],
        startup_timeout=timeout,
    )
    try:
        reply = child.request({"kind": "lower"}, timeout=timeout)
        if isinstance(reply, Ended):
            return {"ended": reply.describe(), "stderr": child.stderr()[-4000:]}
        return dict(reply)
    finally:
        child.close()


class LoweringHandler:
    """In a fresh child: load the library, lower each scripted file, fingerprint its processed module."""

    def __init__(self, options: dict, channel: Any) -> None:
        self.options = options
        if options.get("library"):
            torch.ops.load_library(options["library"])

    def __call__(self, request: dict, channel: Any) -> dict:
        from .. import _compat

        prints: list[str | dict[str, str]] = []
        for item in self.options["scripted"]:
            try:
                lowered = _compat.jit_to_backend(self.options["backend"], torch.jit.load(item["path"]), item["spec"])
                prints.append(fingerprint(getattr(lowered.__loweredModule__, "__processed_module")))
            except Exception as exc:
                prints.append(error_record(exc))
        return {"kind": "result", "fingerprints": prints}


def fingerprint(value: object) -> str:
    """A sha256 of a processed module's value: its structure, scalars and tensors' dtypes, shapes and bytes."""
    import hashlib

    digest = hashlib.sha256()

    def visit(v: object) -> None:
        if isinstance(v, torch.Tensor):
            flat = v.detach().cpu().contiguous().flatten()
            digest.update(f"T{flat.dtype}{list(v.shape)}".encode())
            digest.update(bytes(flat.view(torch.uint8).tolist()) if flat.numel() else b"")
        elif isinstance(v, dict):
            digest.update(f"D{len(v)}".encode())
            for key in sorted(v, key=repr):
                visit(key)
                visit(v[key])
        elif isinstance(v, (list, tuple)):
            digest.update(f"{type(v).__name__[0]}{len(v)}".encode())
            for item in v:
                visit(item)
        else:
            digest.update(f"{type(v).__name__}:{v!r}".encode())

    visit(value)
    return digest.hexdigest()
