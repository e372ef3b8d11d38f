"""Replay: run an archive's bundled inputs on a target and compare with the expected outputs stored beside them.

`replay_archives` loads each archive in a target child (`_target`: the
backend's host-only modules and torch's tracing entry points blocked, the
same child `run-target` uses, on a device when a target command is set),
which runs every bundle and returns its outputs, one ``bundle`` record each
(`ReplayHandler`). The verdicts are the host's (`judge_answers`): it holds
the outputs to the expected outputs and tolerance of the bundles it read from
the archive itself (eager PyTorch's, computed on the host when the archive
was saved), with the numerics of `numerics` (max abs/rel error, worst
element, closeness), and counts the bundles itself: a device is untrusted
(docs/security.md), so a bundle it answers for twice or not at all, or one
the archive does not hold, is an error naming it, never a pass. A runtime
error comes back with its symbolicated text; a bundle whose inputs are in a
dtype the backend does not declare is an error that says so, and is not run.
One child serves every archive of a backend; one that crashes or hangs costs
that archive, and the next archive gets a fresh child.

Nothing here imports pytest or Hypothesis: a board has torch, the backend's
runtime and this package.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .._quoting import visible
from .._validation import check_type, field
from ._child import Child, Ended, check_error_record, error_record, pack_value, tail_text, unpack_value
from ._link import open_child
from ._target import _blocked_for, call_on_target, load_on_target, prepare_target

if TYPE_CHECKING:
    from ..archive import Bundle, Bundles
    from ..backend import Backend
    from ..lowering import LoweredModule
    from ._child import Channel

#: The error type of a bundle not run because its inputs' dtype is not the backend's (its text says so whole).
UNDECLARED_DTYPE = "UndeclaredDtypeError"
#: The error type of a target's answers that do not fit the archive (missing, twice, extra, malformed).
ANSWER_ERROR = "ReplayAnswerError"
#: The fix an answer error names.
_ANSWER_FIX = (
    "the target must run this pytest-backendconf (the host's version) and answer for each bundle once; "
    "replay the archive again"
)


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
            answers: list[object] = []
            reply = child.request({"archive": child.file(path)}, timeout=timeout, on_record=answers.append)
            if isinstance(reply, Ended):
                children.pop(backend).close()
            error = _ended_error(reply, path) if isinstance(reply, Ended) else _load_error(reply, path)
            if error is not None:
                for method, index, check in _bundle_keys(bundles):
                    results.append(
                        BundleResult(path, method, index, "error", error["message"], error, None, check, backend)
                    )
                continue
            judged = judge_answers(path, bundles, answers, backend)
            elapsed = (time.monotonic() - started) / max(len(judged), 1)
            for result in judged:
                result.duration = elapsed
            results += judged
    finally:
        for child in children.values():
            child.close()
    return results


def _archive_error(path: str, method: str, error: dict[str, str], backend: str | None) -> BundleResult:
    return BundleResult(path, method, 0, "error", error["message"], error, None, None, backend)


def _answer_error(message: str) -> dict[str, str]:
    return {"type": ANSWER_ERROR, "module": __name__, "message": message}


def _bundle_keys(bundles: Bundles) -> list[tuple[str, int, str | None]]:
    """``(method, index, check)`` of every bundle, in the archive's order."""
    return [(m, i, r["check"]) for m, records in bundles.records.items() for i, r in enumerate(records)]


def _ended_error(ended: Ended, path: str) -> dict[str, str]:
    """The error of every bundle of an archive whose target process ended before it answered."""
    if ended.unreachable:
        return {"type": "TargetUnreachable", "module": __name__, "message": ended.describe()}
    if ended.setup_error is not None:
        return dict(ended.setup_error)
    return {
        "type": "TargetCrashError" if ended.timed_out is None else "TargetTimeoutError",
        "module": __name__,
        "message": f"the target process {ended.describe()} while replaying {path!r}; stderr: {tail_text(ended.stderr)}",
    }


def _load_error(reply: Mapping[str, Any], path: str) -> dict[str, str] | None:
    """The target's error loading the archive at ``path`` (its reply's ``error``), or None: it ran the bundles."""
    try:
        error = reply.get("error")
        return None if error is None else check_error_record(error, "the target's reply.error")
    except ValueError as exc:
        return _answer_error(f"replaying {path!r}: {exc}; {_ANSWER_FIX}")


# --- the host's verdicts ----------------------------------------------------------------------------


def judge_answers(path: str, bundles: Bundles, answers: Sequence[object], backend: str | None) -> list[BundleResult]:
    """The verdict on every bundle of ``bundles`` (read on the host from the archive at ``path``), from the
    target's ``answers`` (its ``bundle`` records; others are not answers): one `BundleResult` per bundle, in the
    archive's order, and one error for the archive (method ``-``) if the target answered for a bundle the
    archive does not hold or sent an answer that is not one."""
    expected = {(m, i): check for m, i, check in _bundle_keys(bundles)}
    given: dict[tuple[str, int], Mapping[str, Any]] = {}
    twice: set[tuple[str, int]] = set()
    wrong: dict[tuple[str, int], str] = {}
    stray: list[str] = []
    for n, answer in enumerate(answers):
        if not isinstance(answer, dict) or answer.get("kind") != "bundle":
            continue
        key, problem = _checked_answer(answer, f"answer {n}")
        if key not in expected:
            held = ", ".join(f"{m}[0..{len(r) - 1}]" for m, r in bundles.records.items())
            stray.append(
                problem
                or f"the target answered for bundle {_short(key[0])}[{key[1]}], which the archive "
                f"does not hold (its bundles: {held})"
            )
        elif key in given or key in wrong:
            twice.add(key)
        elif problem:
            wrong[key] = problem
        else:
            given[key] = answer
    results = []
    for method in bundles.methods():
        for index, bundle in enumerate(bundles.decode(method)):
            key = (method, index)
            result = BundleResult(path, method, index, "error", check=expected[key], backend=backend)
            if key in twice:
                _set_error(
                    result, _answer_error(f"the target answered for bundle {method}[{index}] twice; {_ANSWER_FIX}")
                )
            elif key in wrong:
                _set_error(result, _answer_error(f"bundle {method}[{index}]: {wrong[key]}; {_ANSWER_FIX}"))
            elif key not in given:
                _set_error(
                    result, _answer_error(f"the target returned no outputs for bundle {method}[{index}]; {_ANSWER_FIX}")
                )
            else:
                _judge(result, given[key], bundle)
            results.append(result)
    if stray:
        more = f" (and {len(stray) - 3} more)" if len(stray) > 3 else ""
        error = _answer_error(f"{'; '.join(stray[:3])}{more}; {_ANSWER_FIX}")
        results.append(_archive_error(path, "-", error, backend))
    return results


def _checked_answer(answer: Mapping[str, Any], where: str) -> tuple[tuple[str, int], str]:
    """The bundle an answer names, and what is wrong with it (``""``: nothing)."""
    try:
        key = (field(answer, "method", "string", where), field(answer, "index", "count", where))
    except ValueError as exc:
        return ("-", -1), f"the target sent {where}, which names no bundle: {exc}"
    try:
        if ("outputs" in answer) == ("error" in answer):
            raise ValueError(f"{where} must hold either outputs or an error")
        if "error" in answer:
            check_error_record(answer["error"], f"{where}.error")
        else:
            check_type(answer["outputs"], "object", f"{where}.outputs")
    except ValueError as exc:
        return key, f"the target's answer is malformed: {exc}"
    return key, ""


def _set_error(result: BundleResult, error: dict[str, str]) -> None:
    result.outcome, result.error = "error", error
    result.message = (
        error["message"]
        if error["type"] in (UNDECLARED_DTYPE, ANSWER_ERROR)
        else (f"{error['type']}: {error['message']}")
    )


def _judge(result: BundleResult, answer: Mapping[str, Any], bundle: Bundle) -> None:
    """Hold one answer's outputs to the bundle's expected outputs and tolerance."""
    from .. import _compat
    from ..errors import ArchiveError
    from ..numerics import StructureMismatch, Tolerance, compare_outputs, summary_json

    where = f"bundle {result.method}[{result.index}]"
    if "error" in answer:
        _set_error(result, answer["error"])
        return
    try:
        actual = unpack_value(answer["outputs"], f"the target's outputs for {where}")
    except ArchiveError as exc:
        _set_error(result, _answer_error(f"{exc}; {_ANSWER_FIX}"))
        return
    if _compat.tree_structure(actual) != _compat.tree_structure(bundle.expected):
        _fail(result, f"{where}: the outputs have another structure than the expected outputs")
        return
    tolerance = Tolerance(bundle.rtol, bundle.atol, bundle.tolerance)
    try:
        compared = compare_outputs(actual, bundle.expected, tolerance)
    except StructureMismatch as exc:
        _fail(result, f"{where}: {exc}")
        return
    result.numerics = summary_json(compared)
    failing = [r for r in compared if not r.passed]
    if not failing:
        result.outcome = "passed"
        return
    _fail(
        result,
        f"{where}: the outputs on the target differ from the expected outputs (eager PyTorch on the host):\n"
        + "\n".join(r.text() for r in failing),
    )


def _fail(result: BundleResult, message: str) -> None:
    result.outcome, result.message = "failed", message
    result.error = {"type": "ReplayMismatch", "module": __name__, "message": message}


def _short(text: str) -> str:
    """A name the target sent, on one line and cut."""
    text = visible(text)
    return text if len(text) <= 60 else text[:60] + "…"


# --- the child ------------------------------------------------------------------------------------


class ReplayHandler:
    """In the target child: load one archive per request and run its bundles; each bundle's outputs (or its
    error) go back as a ``bundle`` record, for the host to judge (`judge_answers`)."""

    def __init__(self, options: Mapping[str, Any], channel: Channel) -> None:
        self.channel = channel

    def __call__(self, request: Mapping[str, Any], channel: Channel) -> dict[str, Any]:
        from ..archive import read_archive
        from ..lowering import instantiate

        try:
            archive = read_archive(request["archive"])
            prepare_target(self.channel, archive.backend_name)
            wrapper = load_on_target(self.channel, lambda: instantiate(archive))
        except Exception as exc:
            return {"error": error_record(exc)}
        declared = _declared_dtypes(wrapper.lowered.backend)
        bundles = archive.bundles
        for method in bundles.methods():
            for index, bundle in enumerate(bundles.decode(method)):
                answer: dict[str, Any] = {"kind": "bundle", "method": method, "index": index}
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
                    answer["error"] = {"type": UNDECLARED_DTYPE, "module": __name__, "message": message}
                else:
                    # The method runs by its name in the manifest, which the reader checked against the methods.
                    call = functools.partial(_call_method, wrapper.lowered, method)
                    answer.update(_run_bundle(self.channel, call, method, index, bundle))
                self.channel.send(answer)
        return {"error": None}


def _call_method(lowered: LoweredModule, method: str, *args: object) -> object:
    return lowered.run(method, args, {})


def _declared_dtypes(backend: Backend) -> set[str] | None:
    from ..capabilities import capabilities_of

    dtypes = capabilities_of(backend).dtypes
    return None if dtypes is None else {str(d).removeprefix("torch.") for d in dtypes}


def _run_bundle(
    channel: Channel, method: Callable[..., object], name: str, index: int, bundle: Bundle
) -> dict[str, Any]:
    """``{"outputs": …}`` of one bundle, in the child protocol's tensor encoding, or ``{"error": …}``."""
    try:
        actual = call_on_target(channel, method, bundle.inputs)
        return {"outputs": pack_value(actual, f"the outputs of bundle {name}[{index}]")}
    except Exception as exc:  # the backend's runtime error, its text symbolicated by the lowered module
        return {"error": error_record(exc)}
