"""Replay: run an archive's bundled inputs on a target and compare with the expected outputs stored beside them.

`replay_archives` loads each archive in a target child (`_target`: the
backend's host-only modules and torch's tracing entry points blocked, the
same child `run-target` uses), runs every bundle there, and compares the
outputs with the bundle's expected outputs (eager PyTorch's, computed on the
host when the archive was saved) under the bundle's own tolerance, with the
numerics of `numerics` (max abs/rel error, worst element, closeness).
A runtime error comes back with its symbolicated text; a bundle whose inputs
are in a dtype the backend does not declare is an error that says so, and is
not run. One child serves every archive of a backend; one that crashes or
hangs costs that archive, and the next archive gets a fresh child.

Nothing here imports pytest or Hypothesis: a board has torch, the backend's
runtime and this package.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ._child import Child, Ended, error_record, tail_text
from ._link import open_child
from ._target import _blocked_for, call_on_target, load_on_target, prepare_target

if TYPE_CHECKING:
    from ..archive import Bundle
    from ..backend import Backend
    from ..lowering import LoweredModule
    from ._child import Channel


@dataclasses.dataclass
class BundleResult:
    """The verdict on one bundle: ``passed``, ``failed`` (outputs out of tolerance) or ``error``."""

    archive: str
    method: str
    index: int
    outcome: str
    message: str | None = None
    #: The error's ``{type, module, message}`` (outcome ``error``).
    error: dict[str, str] | None = None
    #: `numerics.summary_json` of the comparison (when the outputs could be compared).
    numerics: dict[str, Any] | None = None
    #: The conformance check that wrote the bundle (golden folders), else None.
    check: str | None = None
    backend: str | None = None
    duration: float = 0.0

    @property
    def name(self) -> str:
        """``model.bcpt::forward[0]``: the archive's file name, the method and the bundle's index."""
        return f"{os.path.basename(self.archive)}::{self.method}[{self.index}]"


def replay_archives(
    paths: Sequence[str],
    *,
    plugins: Sequence[str] | None = (),
    blocked_modules: Sequence[str] = (),
    timeout: float = 120,
) -> list[BundleResult]:
    """Replay the bundles of every archive in ``paths``; one `BundleResult` per bundle (or per unreadable archive)."""
    from ..archive import read_archive
    from ..errors import ArchiveError

    results: list[BundleResult] = []
    children: dict[str, Child] = {}
    try:
        for path in paths:
            started = time.monotonic()
            try:
                archive = read_archive(path)
            except (ArchiveError, OSError) as exc:
                results.append(_archive_error(path, "-", error_record(exc), None))
                continue
            bundles = archive.bundles
            if bundles is None:
                results.append(
                    _archive_error(
                        path,
                        "-",
                        {
                            "type": "ReplayError",
                            "module": __name__,
                            "message": f"archive {path!r} has no bundled inputs: save it with "
                            "save(..., bundled_inputs=...) or write it with pytest --backendconf-golden=DIR",
                        },
                        archive.backend_name,
                    )
                )
                continue
            backend = archive.backend_name
            child = children.get(backend)
            if child is None or child.ended is not None:
                child = children[backend] = open_child(
                    "pytest_backendconf.target._replay:ReplayHandler",
                    blocked=_blocked_for(os.path.abspath(path), blocked_modules),
                    plugins=plugins,
                    startup_timeout=timeout,
                    refuse_tracing=True,
                    on_target=True,
                )
            reply = child.request({"archive": child.file(path)}, timeout=timeout)
            expected = [(m, i, r["check"]) for m, records in bundles.records.items() for i, r in enumerate(records)]
            if isinstance(reply, Ended):
                error = {
                    "type": "TargetCrashError" if reply.timed_out is None else "TargetTimeoutError",
                    "module": __name__,
                    "message": f"the target process {reply.describe()} while replaying {path!r}; "
                    f"stderr: {tail_text(reply.stderr)}",
                }
                if reply.unreachable:
                    error = {"type": "TargetUnreachable", "module": __name__, "message": reply.describe()}
                elif reply.setup_error is not None:
                    error = dict(reply.setup_error)
                for method, index, check in expected:
                    results.append(
                        BundleResult(path, method, index, "error", error["message"], error, None, check, backend)
                    )
                children.pop(backend).close()
                continue
            if reply["error"] is not None:
                for method, index, check in expected:
                    results.append(
                        BundleResult(
                            path,
                            method,
                            index,
                            "error",
                            reply["error"]["message"],
                            reply["error"],
                            None,
                            check,
                            backend,
                        )
                    )
                continue
            elapsed = (time.monotonic() - started) / max(len(reply["results"]), 1)
            for record in reply["results"]:
                results.append(BundleResult(archive=path, backend=backend, duration=elapsed, **record))
    finally:
        for child in children.values():
            child.close()
    return results


def _archive_error(path: str, method: str, error: dict[str, str], backend: str | None) -> BundleResult:
    return BundleResult(path, method, 0, "error", error["message"], error, None, None, backend)


# --- the child ------------------------------------------------------------------------------------


class ReplayHandler:
    """In the target child: load one archive per request and run its bundles."""

    def __init__(self, options: Mapping[str, Any], channel: Channel) -> None:
        self.channel = channel

    def __call__(self, request: Mapping[str, Any], channel: Channel) -> dict[str, Any]:
        from ..archive import read_archive
        from ..lowering import instantiate

        reply: dict[str, Any] = {"error": None, "results": []}
        try:
            archive = read_archive(request["archive"])
            prepare_target(self.channel, archive.backend_name)
            wrapper = load_on_target(self.channel, lambda: instantiate(archive))
        except Exception as exc:
            reply["error"] = error_record(exc)
            return reply
        declared = _declared_dtypes(wrapper.lowered.backend)
        bundles = archive.bundles
        for method in bundles.methods():
            for index, bundle in enumerate(bundles.decode(method)):
                record: dict[str, Any] = {"method": method, "index": index, "check": bundle.check}
                undeclared = [
                    d for d in bundles.input_dtypes(method, index) if declared is not None and d not in declared
                ]
                if undeclared:
                    message = (
                        f"bundle {method}[{index}] has {', '.join(undeclared)} inputs, but backend "
                        f"{archive.backend_name!r} declares the dtypes {', '.join(sorted(declared or ()))} "
                        "(Capabilities.dtypes); it was not run. Bundle inputs in a declared dtype, or declare "
                        "the dtype if the backend executes it"
                    )
                    record.update(
                        outcome="error",
                        message=message,
                        error={"type": "UndeclaredDtypeError", "module": __name__, "message": message},
                    )
                else:
                    # The method runs by its name in the manifest, which the reader checked against the methods.
                    call = functools.partial(_call_method, wrapper.lowered, method)
                    record.update(_run_bundle(self.channel, call, method, index, bundle))
                reply["results"].append(record)
        return reply


def _call_method(lowered: LoweredModule, method: str, *args: object) -> object:
    return lowered.run(method, args, {})


def _declared_dtypes(backend: Backend) -> set[str] | None:
    from ..capabilities import capabilities_of

    dtypes = capabilities_of(backend).dtypes
    return None if dtypes is None else {str(d).removeprefix("torch.") for d in dtypes}


def _run_bundle(
    channel: Channel, method: Callable[..., object], name: str, index: int, bundle: Bundle
) -> dict[str, Any]:
    from .. import _compat
    from ..numerics import StructureMismatch, Tolerance, compare_outputs, summary_json

    try:
        actual = call_on_target(channel, method, bundle.inputs)
    except Exception as exc:  # the backend's runtime error, its text symbolicated by the lowered module
        record = error_record(exc)
        return {"outcome": "error", "message": f"{record['type']}: {record['message']}", "error": record}
    where = f"bundle {name}[{index}]"
    if _compat.tree_structure(actual) != _compat.tree_structure(bundle.expected):
        message = f"{where}: the outputs have another structure than the expected outputs"
        return {"outcome": "failed", "message": message, "error": _failure(message)}
    tolerance = Tolerance(bundle.rtol, bundle.atol, bundle.tolerance)
    try:
        results = compare_outputs(actual, bundle.expected, tolerance)
    except StructureMismatch as exc:
        message = f"{where}: {exc}"
        return {"outcome": "failed", "message": message, "error": _failure(message)}
    numerics = summary_json(results)
    failing = [r for r in results if not r.passed]
    if not failing:
        return {"outcome": "passed", "numerics": numerics}
    message = (
        f"{where}: the outputs on the target differ from the expected outputs (eager PyTorch on the host):\n"
        + "\n".join(r.text() for r in failing)
    )
    return {"outcome": "failed", "message": message, "error": _failure(message), "numerics": numerics}


def _failure(message: str) -> dict[str, str]:
    return {"type": "ReplayMismatch", "module": __name__, "message": message}
