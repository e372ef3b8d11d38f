"""quantized: int8 programs, the way NPU delegates take them, against eager PyTorch running the same Q/DQ program.

Every zoo model with quantizable ops (``[quantized]`` in ``suite.toml``; the
real-world models too under ``--backendconf-zoo``) is quantized per scheme
with PT2E: the backend's own ``quantizer(scheme)`` when it has one (``None``:
the scheme is *unsupported*), else the project's reference quantizer;
calibrated on seeded inputs drawn as parity draws them (uniform, and edge
values mixed in); exported again; and lowered whole, or with
``partition="supported"`` where the backend rejects the whole (as the
``delegation`` category does). The reference is the Q/DQ program itself run
by eager PyTorch: the backend's error is stated in steps of each output's
quantization scale beside the SQNR of both against the float model, and
must be no more than legitimate rounding explains (``QuantizedRule``).
In a deep network a neighbouring integer in one layer is carried on by
the next, so outputs off by more than the rule are judged again layer by
layer (`judge_layers`: each layer alone on the backend, fed eager's
integers): they pass if every layer is within the rule, and fail naming
the first layer that is not. Where the layers cannot be judged, a failure
names the node where the backend first departs from the reference.

Without torchao (the ``[quant]`` extra) the category has no checks and the
run prints one notice naming the extra.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

from pytest_backendconf import _compat
from pytest_backendconf.diagnostics import LayerVerdict, judge_layers, locate_in_program
from pytest_backendconf.errors import LoweringError
from pytest_backendconf.lowering import export_method
from pytest_backendconf.lowering import normalize as normalize_call
from pytest_backendconf.quant import (
    EXTRA_NOTICE,
    SCHEMES,
    QuantizedRule,
    QuantizeError,
    judge_quantized,
    output_steps,
    quantize,
    reference_quantizer,
    torchao_installed,
)
from pytest_backendconf.checks import Check, CheckFailed, Unsupported
from pytest_backendconf.suite import SuiteContext

from . import quantized_llm
from ._spec import section

#: Quantization starts from the float32 model.
DTYPE = "float32"


def checks(ctx: SuiteContext) -> Iterator[Check]:
    if not torchao_installed():
        from .ops import notice

        notice(ctx, EXTRA_NOTICE)
        return
    spec = section("quantized")
    static = [s for s in SCHEMES if s != "int8-dynamic"]
    chosen = {name: list(SCHEMES) for name in spec["cases"]}
    chosen.update({name: static for name in spec["static_cases"]})
    # The real-world models (present only under --backendconf-zoo) are all convolutions and linear layers.
    chosen.update({name: list(SCHEMES) for name, case in ctx.cases.items() if "real_model" in case.tags})
    for name, schemes in chosen.items():
        if name not in ctx.cases or DTYPE not in ctx.dtypes_for(ctx.cases[name]):
            continue
        for scheme in schemes:
            yield Check(
                category="quantized",
                name=f"{name}[{scheme}]",
                run=functools.partial(check_quantized, case_name=name, scheme=scheme),
                stage="execute",
                case=name,
            )
    yield from quantized_llm.checks(ctx)


def rule() -> QuantizedRule:
    found = section("quantized")["rule"]
    return QuantizedRule(
        max_steps=float(found["max_steps"]),
        max_share=float(found["max_share"]),
        sqnr_margin_db=float(found["sqnr_margin_db"]),
    )


def check_quantized(ctx: SuiteContext, *, case_name: str, scheme: str) -> dict[str, Any]:
    programs = quantized_programs(ctx, case_name, scheme)
    lowered, how = _lowered(ctx, case_name, scheme)
    module = ctx.module(case_name, DTYPE)
    module_type = type(module)
    judged_all = []
    carried: list[dict[str, Any]] = []  # outputs off only by rounding carried through layers each within the rule
    for method, program in programs.items():
        steps = output_steps(program)
        reference_module = _reference_module(ctx, case_name, scheme, method)
        for seed, mode in _draws("seeds"):
            args, kwargs = ctx.example(case_name, DTYPE, method, seed=seed, mode=mode)
            flat_args, flat_kwargs = normalize_call(getattr(module_type, method), method, args, kwargs)
            reference = _compat.tree_leaves(reference_module(*flat_args, **flat_kwargs))
            actual = _compat.tree_leaves(getattr(lowered, method)(*args, **kwargs))
            floats = _compat.tree_leaves(getattr(module, method)(*args, **kwargs))
            judged = judge_quantized(actual, reference, floats, steps, rule())
            judged_all.extend(judged)
            failing = [j for j in judged if not j.passed]
            if failing:
                inputs = _compat.tree_leaves((flat_args, flat_kwargs))
                layers = _layers(ctx, program, module_type, method, inputs, failing)
                if layers is not None and layers.passed:
                    carried.append({"seed": seed, "outputs": [j.json() for j in failing], **layers.json()})
                    continue
                where = f"{case_name}.{method} [{scheme}]" if method != "forward" else f"{case_name} [{scheme}]"
                located = ""
                if layers is not None and layers.failing is not None:
                    located = f"\nThe first layer off alone, run on eager's integers: {layers.failing.text()}"
                elif layers is not None:
                    located = f"\n({layers.summary()})"
                located += _locate(ctx, program, module_type, method, inputs)
                raise CheckFailed(
                    f"{where}: the backend's quantized outputs differ from eager PyTorch running the same Q/DQ "
                    f"program by more than rounding explains ({rule_text(failing)}), {how}, for example seed "
                    f"{seed} ({mode} inputs):\n" + "\n".join("  " + j.text() for j in failing) + located,
                    details={"quantized": [j.json() for j in judged]},
                )
    return {
        "quantized": {
            "scheme": scheme,
            "lowered": how,
            "max_steps": max((j.max_steps for j in judged_all), default=0.0),
            "outputs": [j.json() for j in judged_all[: len(judged_all) // max(len(_draws("seeds")), 1)]],
            **({"carried_through_layers": carried} if carried else {}),
        }
    }


def rule_text(failing: list) -> str:
    """The rule the failing outputs broke: in steps, and by SQNR where no dequantize produces one of them."""
    return rule().text(float_output=any(j.by_sqnr for j in failing))


# --- the quantized programs and their lowering, once per (model, scheme) ------------------------


def quantized_programs(ctx: SuiteContext, case_name: str, scheme: str) -> dict[str, Any]:
    """Each method of the model quantized with ``scheme`` and exported again; shared per session."""
    outcome = ctx.memo(("quantized", case_name, scheme), lambda: _quantize(ctx, case_name, scheme))
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _quantizer(ctx: SuiteContext, scheme: str) -> Any:
    own = getattr(ctx.backend, "quantizer", None)
    if not callable(own):
        try:
            return reference_quantizer(scheme)
        except QuantizeError as exc:  # torchao is installed (the category exists) but broken
            return CheckFailed(str(exc))
    found = own(scheme)
    if found is None:
        return Unsupported(f"backend {ctx.name!r} has no quantizer for scheme {scheme!r} (its quantizer() gave None)")
    return found


def _quantize(ctx: SuiteContext, case_name: str, scheme: str) -> Any:
    case = ctx.cases[case_name]
    module_type = type(ctx.module(case_name, DTYPE))
    programs = {}
    for method in case.methods:
        quantizer = _quantizer(ctx, scheme)
        if isinstance(quantizer, BaseException):
            return quantizer
        calibration = []
        for seed, mode in _draws("calibration"):
            args, kwargs = ctx.example(case_name, DTYPE, method, seed=seed, mode=mode)
            calibration.append(normalize_call(getattr(module_type, method), method, args, kwargs))
        # A fresh module of the session's float program: quantizing rewrites the graph module it is
        # given, never the program's parameters (the contract checks see any change to those).
        graph_module = ctx.program(case_name, DTYPE, method).module()
        try:
            converted = quantize(graph_module, quantizer, calibration)
            args, kwargs = calibration[0]
            program = export_method(converted, "forward", args, kwargs)
        except (QuantizeError, LoweringError) as exc:
            return CheckFailed(f"{case_name}.{method} could not be quantized with scheme {scheme!r}: {exc}")
        if not any("quantize" in str(n.target) for n in program.graph_module.graph.nodes if n.op == "call_function"):
            return Unsupported(f"{quantizer!r} quantizes nothing of {case_name}.{method} with scheme {scheme!r}")
        programs[method] = program
    return programs


def _reference_module(ctx: SuiteContext, case_name: str, scheme: str, method: str) -> Any:
    """The Q/DQ program as an eager module: the reference every backend is judged against."""
    return ctx.memo(
        ("quantized-eager", case_name, scheme, method),
        lambda: quantized_programs(ctx, case_name, scheme)[method].module(),
    )


def _lowered(ctx: SuiteContext, case_name: str, scheme: str) -> tuple[Any, str]:
    outcome = ctx.memo(("quantized-lowered", case_name, scheme), lambda: _lower(ctx, case_name, scheme))
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _lower(ctx: SuiteContext, case_name: str, scheme: str) -> Any:
    programs = quantized_programs(ctx, case_name, scheme)
    module_type = type(ctx.module(case_name, DTYPE))
    return quantized_llm.lower_layer_or_model(ctx, programs, module_type, f"{case_name} [{scheme}]")


def _draws(which: str) -> list[tuple[int, str]]:
    """The (seed, input mode) pairs of ``[quantized]``'s ``calibration`` or ``seeds``."""
    return [(int(seed), str(mode)) for seed, mode in section("quantized")[which]]


def _layers(
    ctx: SuiteContext, program: Any, module_type: type, method: str, inputs: list, failing: list
) -> LayerVerdict | None:
    """Each layer of a static program alone, when every failing output is on a grid (not a mismatch)."""
    if any(j.mismatch or j.float_output for j in failing):
        return None
    try:
        return judge_layers(program, ctx.backend, inputs, rule(), top_class=module_type.__name__, method=method)
    except Exception as exc:  # a diagnosis: never hide the failure behind it
        return LayerVerdict(reason=f"{type(exc).__name__}: {exc}")


def _locate(ctx: SuiteContext, program: Any, module_type: type, method: str, inputs: list) -> str:
    """Where the backend first departs from the Q/DQ program: the node and its source."""
    try:
        found = locate_in_program(program, ctx.backend, inputs, top_class=module_type.__name__, method=method)
    except Exception as exc:  # a diagnosis: never hide the failure behind it
        return f"\n(could not locate the divergence: {type(exc).__name__}: {exc})"
    return f"\n{found.text()}" if found is not None else "\n(no single node or group of nodes departs alone)"
