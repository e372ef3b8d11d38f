"""The suite's TorchScript form: the checks for a `TorchScriptBackend` (a C++ backend behind
``torch._C._jit_to_backend``), in the categories of the export suite.

Every check runs where the backend's library is loaded (the backend host, or
pytest's process with ``--backendconf-in-process``). A check that cannot
apply to a TorchScript backend says so as *not applicable* with the reason
(a skip), never as a pass: ``delegation`` (``_jit_to_backend`` lowers whole
modules: there is no partitioner to check) and ``ops`` (its samples are
``torch.export`` programs of single ATen overloads, which TorchScript does not
lower).
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Iterator

import pytest
import torch

from ...checks import Check, CheckFailed
from ...torchscript import LITE_DEBUG_INFO_MISSING, TORCHSCRIPT_UNAVAILABLE, backend_is_available, lite_round_trip
from ...torchscript import lower
from . import _session as ts
from ._probe_models import accepted_part, probe_model
from ._reliability import reliability_checks
from ._serialization import serialization_checks

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

NOT_APPLICABLE = {
    "delegation": "torch._C._jit_to_backend lowers whole modules (no partitioner, no CPU fallback to check)",
    "ops": "its samples are torch.export programs of single ATen overloads, which TorchScript does not lower",
}


def checks(ctx: SuiteContext) -> Iterator[Check]:
    """Every TorchScript check, category by category, in a stable order."""
    cases = sorted(ctx.cases)
    yield Check("contract", "library_registers_backend", _library_registers_backend, stage="declaration")
    for case in cases:
        first = ctx.first_dtype(case)
        if first is not None:
            yield Check(
                "contract",
                f"lowers[{case}]",
                functools.partial(_lowers, case=case, dtype=first),
                stage="lowering",
                case=case,
            )
    for case in cases:
        for dtype in ctx.dtypes_for(ctx.cases[case]):
            yield Check(
                "parity",
                f"{case}[{dtype}]",
                functools.partial(_parity, case=case, dtype=dtype),
                stage="execute",
                case=case,
            )
    yield Check("availability", "host_is_available", _host_is_available, stage="is_available")
    yield Check("availability", "unavailable_rows", _unavailable_rows, stage="is_available", needs_available=False)
    yield from serialization_checks(ctx)
    yield Check("symbolication", "rejection_text", _rejection_text, stage="preprocess")
    yield Check("symbolication", "runtime_error_lite", _runtime_error_lite, stage="execute")
    yield Check("symbolication", "runtime_error_without_debug_info", _runtime_error_without_debug_info, stage="execute")
    yield from reliability_checks(ctx)
    for category, reason in NOT_APPLICABLE.items():
        yield Check(
            category,
            "torchscript",
            functools.partial(_not_applicable, reason=reason),
            stage="declaration",
            needs_available=False,
        )


@ts.torchscript_check
def _not_applicable(ctx: SuiteContext, reason: str) -> None:
    pytest.skip(f"not applicable to a TorchScript backend: {reason}")


# --- contract -------------------------------------------------------------------------------------


@ts.torchscript_check
def _library_registers_backend(ctx: SuiteContext) -> None:
    """Loading the library registers the backend class and its preprocess; is_available() is a stable bool."""
    record = ts.loaded(ctx)  # a BackendConfError naming the library and the registration it lacks
    answers = [backend_is_available(record.name) for _ in range(3)]
    if not all(isinstance(a, bool) for a in answers) or len(set(answers)) != 1:
        raise CheckFailed(f"is_available() of fresh {record.name!r} instances returned {answers}; expected one bool")


@ts.torchscript_check
def _lowers(ctx: SuiteContext, case: str, dtype: str) -> None:
    """The case lowers (or is rejected with the seed compiler's text: unsupported) into a LoweredWrapper."""
    module, model = ts.lowered(ctx, case, dtype)
    children = [name for name, _ in module.named_children()]
    if children != ["__loweredModule__"]:
        raise CheckFailed(f"the lowered module's children are {children}; expected ['__loweredModule__']")
    for method in model.methods:
        if not hasattr(module, method):
            raise CheckFailed(f"the lowered module has no method {method!r}")


# --- parity ---------------------------------------------------------------------------------------


@ts.torchscript_check
def _parity(ctx: SuiteContext, case: str, dtype: str) -> dict:
    """Every method on every seed agrees with eager PyTorch within the dtype's tolerance."""
    ts.require_available(ctx)
    module, model = ts.lowered(ctx, case, dtype)
    eager = ctx.module(case, dtype)
    rtol, atol = ts.tolerance(ctx, dtype)
    for method in model.methods:
        for seed in ts.spec()["seeds"]:
            args = ts.inputs(ctx, case, dtype, method, seed)
            with torch.no_grad():
                expected = ts.call(eager, method, args)
                actual = ts.call(module, method, args)
            why = ts.differences(expected, actual, rtol, atol)
            if why:
                raise CheckFailed(
                    f"model {case} ({model.how}d) in {dtype}, method {method!r}, seed {seed}: the lowered module "
                    f"differs from eager PyTorch (rtol={rtol}, atol={atol}): {why}"
                )
    return {"torchscript": model.how, **({"traced_because": model.why} if model.why else {})}


# --- availability (the seed's tables, PR 53068) ---------------------------------------------------


@ts.torchscript_check
def _host_is_available(ctx: SuiteContext) -> None:
    """Where its library is loaded, the backend says it can run: else every check that runs it is not applicable."""
    record = ts.loaded(ctx)
    answer = ts.available(ctx)
    if answer is not True:
        raise CheckFailed(
            f"backend {record.name!r}'s is_available() returned {answer!r} in the process that loaded its library "
            f"{record.library_path()}; the checks that run the backend are not applicable until it is available"
        )


@ts.torchscript_check
def _unavailable_rows(ctx: SuiteContext) -> None:
    """The seed's table for a backend whose is_available() is false: lowering (preprocess) still works on the
    host; calling the lowered module raises "Backend is not available."; torch.jit.save works; loading raises
    "Backend is not available." (from the wrapper's __setstate__)."""
    record = ts.loaded(ctx)
    if ts.available(ctx) is True:
        pytest.skip(
            f"not applicable: backend {record.name!r} is available here; these rows are for a host where "
            "is_available() is false"
        )
    try:
        data, lowered = ts.runtime_probe(ctx)
    except CheckFailed as exc:
        raise CheckFailed(
            f"lowering failed while the backend is not available: {exc}. Preprocess runs on the host, which "
            "need not have the device: it must not need the backend available"
        ) from None
    good = ts.probe_inputs(data["input_shapes"])
    _expect_unavailable("calling the lowered module", lambda: lowered(*good))
    import io

    buffer = io.BytesIO()
    torch.jit.save(lowered, buffer)  # saving needs only the processed module
    buffer.seek(0)
    _expect_unavailable("torch.jit.load", lambda: torch.jit.load(buffer))


def _expect_unavailable(what: str, action: Any) -> None:
    try:
        action()
    except Exception as exc:
        if TORCHSCRIPT_UNAVAILABLE not in str(exc):
            raise CheckFailed(
                f"{what} raised {type(exc).__name__}: {exc}; expected {TORCHSCRIPT_UNAVAILABLE!r}"
            ) from None
        return
    raise CheckFailed(f"{what} succeeded although is_available() is false; expected {TORCHSCRIPT_UNAVAILABLE!r}")


# --- symbolication (the seeds' texts) -------------------------------------------------------------


@ts.torchscript_check
def _rejection_text(ctx: SuiteContext) -> None:
    """Preprocess rejects an operator it cannot know with the demo compiler's text, the model's line and carets."""
    record = ts.loaded(ctx)
    data = ts.spec()["rejection"]
    variant = _rejection_variant(ctx)
    scripted = torch.jit.script(probe_model(variant))
    try:
        lower(scripted, record, ("forward",))
    except Exception as exc:
        text = str(exc)
    else:
        raise CheckFailed(
            f"lowering {variant}, which calls {data['kind']} (an operator no backend can know), succeeded; "
            "preprocess must reject it"
        )
    wanted = f"{ts.REJECTION_PREFIX}{data['kind']}{ts.REJECTION_MIDDLE} Source code:"
    _expect_source(text, wanted, data["expression"], variant)


def _rejection_variant(ctx: SuiteContext) -> str:
    """The first rejection probe whose operators before the mystery op the backend lowers on their own
    (once per session): the mystery op is then the first node it must refuse."""
    record = ts.loaded(ctx)

    def pick() -> str:
        variants = ts.spec()["rejection"]["variants"]
        for variant in variants:
            part = accepted_part(variant)
            if part is None:
                return variant
            try:
                lower(torch.jit.script(part), record, ("forward",))
            except Exception:
                continue
            return variant
        return variants[-1]

    return ctx.memo(("torchscript", "rejection probe"), pick)


def _expect_source(text: str, wanted: str, expression: str, model: str) -> None:
    """``text`` holds ``wanted``, then the probe file's line with ``expression`` and carets under it."""
    if wanted not in text:
        raise CheckFailed(f"the text does not say {wanted!r}:\n{text}")
    path = ts.probe_file()
    number, line = ts.source_line(path, expression, model)
    if f'File "{path}", line {number}' not in text:
        raise CheckFailed(f"the text does not name {path}, line {number} (the model's line):\n{text}")
    # TorchScript shows the function's source shifted left: find the line by its text, carets by column there.
    lines = text.splitlines()
    try:
        at = next(i for i, shown in enumerate(lines) if shown.strip() == line.strip())
    except StopIteration:
        raise CheckFailed(f"the text does not show the model's line {line.strip()!r}:\n{text}") from None
    shown, carets = lines[at], lines[at + 1] if at + 1 < len(lines) else ""
    start = shown.index(expression)
    if carets[start : start + len(expression)] != "~" * len(expression) or "<--- HERE" not in carets:
        raise CheckFailed(f"no carets under {expression!r} in the model's line:\n{shown}\n{carets}")


def _runtime_setup(ctx: SuiteContext, *, debug_info: bool) -> tuple[Any, str]:
    """The runtime-error probe lowered, round-tripped through the lite interpreter, and its failing call's text."""
    ts.require_available(ctx)
    data, lowered = ts.runtime_probe(ctx)
    lowered(*ts.probe_inputs(data["input_shapes"]))  # it runs on good inputs
    lite = lite_round_trip(lowered, ctx.tmp_dir("torchscript-lite"), debug_info=debug_info)
    try:
        lite(*ts.probe_inputs(data["bad_shapes"]))
    except Exception as exc:
        return data, str(exc)
    raise CheckFailed(f"{data['model']} ran on inputs of shapes {data['bad_shapes']}; the backend must fail there")


@ts.torchscript_check
def _runtime_error_lite(ctx: SuiteContext) -> None:
    """A failure inside execute carries its node's debug handle: the lite interpreter (saved with debug info)
    shows the module hierarchy and the model's own line with carets."""
    data, text = _runtime_setup(ctx, debug_info=True)
    if LITE_DEBUG_INFO_MISSING in text:
        raise CheckFailed(f"the lite interpreter found no debug info for the backend's handle:\n{text}")
    hierarchy = f"Module hierarchy:{data['hierarchy']}"
    if hierarchy not in text or f".{data['node']}" not in text:
        raise CheckFailed(
            f"the text has no module hierarchy {hierarchy}...{data['node']}: did execute throw with the "
            f"node's debug handle (TORCH_DELEGATED_BACKEND_THROW)?\n{text}"
        )
    _expect_source(text, "Traceback of TorchScript", data["expression"], data["source"])


@ts.torchscript_check
def _runtime_error_without_debug_info(ctx: SuiteContext) -> None:
    """Saved without debug info, the backend's handle is named as the seed says: "Debug info for handle(s):
    debug_handles:{...}, was not found."."""
    data, text = _runtime_setup(ctx, debug_info=False)
    found = re.search(r"debug_handles:\{([^}]*)\}, was not found\.", text)
    # The interpreter lists the handles it was given; -1 is its own "none" (a throw that carried no handle).
    handles = [int(h) for h in re.findall(r"-?\d+", found[1])] if found and LITE_DEBUG_INFO_MISSING in text else []
    if not any(h >= 0 for h in handles):
        raise CheckFailed(
            "the lite interpreter did not report the backend's debug handle as missing "
            f"({LITE_DEBUG_INFO_MISSING} debug_handles:{{<handle>}}, was not found.): did execute throw with the "
            f"node's debug handle?\n{text}"
        )


__all__ = ["checks"]
