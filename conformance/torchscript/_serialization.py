"""TorchScript serialization: ``torch.jit.save``/``load``, the lite interpreter, the target, and what is
added to the wrapper after lowering (seed PR 71597: attributes, bundled inputs) surviving all three.

The target is one extra process for the whole session: it loads every saved
file with only torch and the backend's library (host-only modules blocked,
no plugin imported), runs the same calls, and the outputs must be the
host's, bit for bit.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ... import _compat
from ...checks import Check, CheckFailed, Unsupported
from ...target import pack_value, unpack_value
from ...torchscript import lite_round_trip, run_torchscript_target, save_load
from . import _session as ts

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

#: The attribute and method added to the wrapper after lowering, and the value they must keep.
NOTE_ATTRIBUTE = "backendconf_note_value"
NOTE_METHOD = "backendconf_note"
NOTE_VALUE = "added after lowering"


def serialization_checks(ctx: SuiteContext) -> Iterator[Check]:
    for case in sorted(ctx.cases):
        dtype = ctx.first_dtype(case)
        if dtype is None:
            continue
        for name, run in (("jit_save_load", _jit_save_load), ("lite_round_trip", _lite), ("target", _target)):
            yield Check(
                "serialization",
                f"{name}[{case}]",
                functools.partial(run, case=case, dtype=dtype),
                stage="target" if name == "target" else "load",
                case=case,
            )
    for case in ts.spec()["wrapper_cases"]:
        if case in ctx.cases and ctx.first_dtype(case) is not None:
            yield Check(
                "serialization",
                f"wrapper_attributes_and_bundled_inputs[{case}]",
                functools.partial(_wrapper, case=case, dtype=ctx.first_dtype(case)),
                stage="load",
                case=case,
            )


def _calls(ctx: SuiteContext, case: str, dtype: str, methods: tuple[str, ...]) -> list[tuple[str, int, list]]:
    return [(m, seed, ts.inputs(ctx, case, dtype, m, seed)) for m in methods for seed in ts.spec()["seeds"]]


def _compare(label: str, reference: Any, again: Any, calls: list[tuple[str, int, list]], *, lite: bool) -> None:
    for method, seed, args in calls:
        with torch.no_grad():
            want = ts.call(reference, method, args)
            try:
                got = again.run_method(method, *args) if lite and method != "forward" else ts.call(again, method, args)
            except Exception as exc:
                raise CheckFailed(f"after {label}, method {method!r} on seed {seed} raised: {_first(exc)}") from None
        why = ts.differences(want, got)
        if why:
            raise CheckFailed(f"after {label}, method {method!r} on seed {seed} differs from before: {why}")


def _first(exc: BaseException) -> str:
    """An exception's type and its message's first line (TorchScript appends whole tracebacks)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


@ts.torchscript_check
def _jit_save_load(ctx: SuiteContext, case: str, dtype: str) -> None:
    """torch.jit.save then load (the wrapper's __setstate__ compiles again): the same outputs, bit for bit."""
    ts.require_available(ctx)
    module, model = ts.lowered(ctx, case, dtype)
    _compare("torch.jit.save/load", module, save_load(module), _calls(ctx, case, dtype, model.methods), lite=False)


@ts.torchscript_check
def _lite(ctx: SuiteContext, case: str, dtype: str) -> None:
    """_save_for_lite_interpreter then _load_for_lite_interpreter: the same outputs, bit for bit."""
    ts.require_available(ctx)
    module, model = ts.lowered(ctx, case, dtype)
    lite = lite_round_trip(module, ctx.tmp_dir("torchscript-lite"))
    _compare("the lite interpreter round trip", module, lite, _calls(ctx, case, dtype, model.methods), lite=True)


# --- the target: one process for every file of the session ---------------------------------------


@ts.torchscript_check
def _target(ctx: SuiteContext, case: str, dtype: str) -> None:
    """The torch.jit and lite files loaded and run on the target: the host's outputs, bit for bit."""
    ts.require_available(ctx)
    ts.lowered(ctx, case, dtype)  # unsupported or failing lowerings end here, as in the other checks
    batch = ctx.memo(("torchscript", "target"), lambda: _run_target_batch(ctx, _session_models(ctx)))
    if "ended" in batch:
        raise CheckFailed(f"the target process ended before answering: {batch['ended']}\n{batch.get('stderr', '')}")
    for kind in ("jit", "lite"):
        _check_target_file(batch, f"{case}.{kind}", f"{kind} file of model {case}")


def _check_target_file(batch: dict, key: str, label: str) -> dict:
    entry = batch["files"].get(key)
    if entry is None:
        raise CheckFailed(f"the {label} was not run on the target")
    reply, host_outputs = entry
    if reply["error"] is not None:
        error = reply["error"]
        raise CheckFailed(f"on the target, the {label} failed: {error['type']}: {error['message']}")
    got = unpack_value(reply["outputs"], f"the target's outputs of the {label}")
    for i, (want, have) in enumerate(zip(host_outputs, got)):
        why = ts.differences(want, have)
        if why:
            raise CheckFailed(f"on the target, call {i} of the {label} differs from the host: {why}")
    return reply


def _session_models(ctx: SuiteContext) -> list[tuple[str, Any, list]]:
    """``(name, lowered module, forward calls)`` of every case that lowers, for the session's target run."""
    found = []
    for case in sorted(ctx.cases):
        dtype = ctx.first_dtype(case)
        if dtype is None:
            continue
        try:
            module, model = ts.lowered(ctx, case, dtype)
        except (Unsupported, CheckFailed):
            continue
        found.append((case, module, [(method, args) for method, _, args in _calls(ctx, case, dtype, model.methods)]))
    return found


def _run_target_batch(ctx: SuiteContext, lowered: list[tuple[str, Any, list]], *, extras: bool = False) -> dict:
    """Save each ``(name, module, [(method, args), ...])`` as a torch.jit and a lite file, and run them all in one target."""
    record = ts.loaded(ctx)
    folder = ctx.tmp_dir("torchscript-target")
    models: list[dict] = []
    expected: dict[str, list] = {}
    for name, module, calls in lowered:
        models += _save_for_target(module, folder, name, calls, expected, extras=extras)
    reply = run_torchscript_target(record.library_path(), models, ctx.capabilities)
    if "ended" in reply:
        return reply
    files = {}
    for model, answer in zip(models, reply["models"]):
        files[model["key"]] = (answer, expected[model["key"]])
    return {"files": files, "blocked": reply.get("blocked", [])}


def _save_for_target(
    module: Any, folder: Any, name: str, calls: list, expected: dict, *, extras: bool = False
) -> list[dict]:
    packed = pack_value([list(args) for _, args in calls], f"the inputs of {name}")
    with torch.no_grad():
        outputs = [ts.call(module, method, list(args)) for method, args in calls]
    jit_path = os.path.join(folder, f"{name}.pt")
    torch.jit.save(module, jit_path)
    _compat.save_for_lite_interpreter(module, os.path.join(folder, f"{name}.ptl"), debug_info=True)
    entries = []
    for kind, path in (("jit", jit_path), ("lite", os.path.join(folder, f"{name}.ptl"))):
        key = f"{name}.{kind}"
        expected[key] = outputs
        entries.append(
            {
                "key": key,
                "path": path,
                "kind": kind,
                "inputs": packed,
                "methods_called": [method for method, _ in calls],
                "methods": [NOTE_METHOD] if extras else [],
                "bundled": extras,
            }
        )
    return entries


# --- wrapper attributes and bundled inputs (seed PR 71597) ----------------------------------------


@ts.torchscript_check
def _wrapper(ctx: SuiteContext, case: str, dtype: str) -> None:
    """An attribute (with a method reading it) and bundled inputs added to the lowered wrapper survive
    torch.jit.save/load, the lite interpreter and the target; the bundled inputs run to the host's outputs."""
    from torch.utils.bundled_inputs import augment_model_with_bundled_inputs

    ts.require_available(ctx)
    module, model = ts.lowered(ctx, case, dtype, fresh=True)  # changed below: not the shared one
    if "forward" not in model.methods:
        raise Unsupported(f"model {case} has no forward, which bundled inputs are for")
    _compat.add_string_attribute(module, NOTE_ATTRIBUTE, NOTE_VALUE)
    module.define(f"def {NOTE_METHOD}(self) -> str:\n    return self.{NOTE_ATTRIBUTE}\n")
    bundled = [tuple(ts.inputs(ctx, case, dtype, "forward", seed)) for seed in ts.spec()["seeds"]]
    # skip_size_check: the zoo's inputs are small but not tiny; bundling them whole is what is checked.
    augment_model_with_bundled_inputs(module, inputs=bundled, skip_size_check=True)
    with torch.no_grad():
        host = [module(*args) for args in bundled]
    for label, again in (
        ("torch.jit.save/load", save_load(module)),
        ("the lite interpreter round trip", lite_round_trip(module, ctx.tmp_dir("torchscript-wrapper"))),
    ):
        try:
            _check_wrapper(label, again, bundled, host)
        except CheckFailed:
            raise
        except Exception as exc:
            raise CheckFailed(f"after {label}, the wrapped model failed: {_first(exc)}") from None
    # The target: the same files in a target process of their own.
    calls = [("forward", list(args)) for args in bundled]
    batch = _run_target_batch(ctx, [(f"wrapper-{case}", module, calls)], extras=True)
    if "ended" in batch:
        raise CheckFailed(f"the target process ended before answering: {batch['ended']}\n{batch.get('stderr', '')}")
    for kind in ("jit", "lite"):
        reply = _check_target_file(batch, f"wrapper-{case}.{kind}", f"{kind} file of the wrapped model {case}")
        if reply["methods"].get(NOTE_METHOD) != repr(NOTE_VALUE):
            raise CheckFailed(f"on the target ({kind}), {NOTE_METHOD}() returned {reply['methods'].get(NOTE_METHOD)}")
        if reply["bundled"] is None:
            raise CheckFailed(f"on the target ({kind}), the model has no bundled inputs")
        why = ts.differences(host, unpack_value(reply["bundled"], "the bundled inputs' outputs"))
        if why:
            raise CheckFailed(f"on the target ({kind}), the bundled inputs' outputs differ from the host's: {why}")


def _check_wrapper(label: str, again: Any, bundled: list, host: list) -> None:
    """The attribute's method, the bundled inputs and their outputs after one round trip."""
    lite = not hasattr(again, "get_all_bundled_inputs")
    note = again.run_method(NOTE_METHOD) if lite else getattr(again, NOTE_METHOD)()
    if note != NOTE_VALUE:
        raise CheckFailed(f"after {label}, the wrapper's {NOTE_METHOD}() returned {note!r}, not {NOTE_VALUE!r}")
    inputs = again.run_method("get_all_bundled_inputs") if lite else again.get_all_bundled_inputs()
    if ts.differences(bundled, [tuple(i) for i in inputs]):
        raise CheckFailed(f"after {label}, the bundled inputs are not those added after lowering")
    with torch.no_grad():
        outputs = [again(*args) for args in inputs]
    why = ts.differences(host, outputs)
    if why:
        raise CheckFailed(f"after {label}, the bundled inputs' outputs differ from the host's: {why}")
