"""quantized, LLM schemes: torchao's weight-only int8/int4 and 8da4w programs against eager's *quantized* model.

LLM decoders ship with their linear layers quantized by torchao's
``quantize_`` (``LLM_SCHEMES``: ``Int8WeightOnlyConfig``,
``IntxWeightOnlyConfig(int4, PerGroup(g))`` and
``Int8DynamicActivationIntxWeightConfig`` "8da4w", groups of 32 and 128
columns). Two small models take them: ``llm_linears`` (three linear layers
of other shapes on one input) and ``llm_mlp`` (a SwiGLU block). Each
(model, scheme) is quantized once, exported, and lowered whole, or with
``partition="supported"`` where the backend rejects the whole; the
lowering unwraps torchao's tensor subclasses, so the backend receives the
integer weights, scales and zero points.

The reference is the quantized model run by eager PyTorch (torchao's own
kernels). Weight-only: the dequantized weights are exact, so every output
must be within float32's tolerances (the backend's declared ones, if any).
8da4w: activations are quantized per token at run time; each token of each
output is judged in steps of int8 over its range, by the quantized rule.
A failure runs each quantized layer alone on the backend with unit inputs
to read its weights back, and names the first layer, row and group off and
by how many steps of that group's scale (and the defect, where the error
has a known shape); with every weight right, the first layer whose output
is off alone, fed eager's input, and the token.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterator

import torch
from torch import nn

from pytest_backendconf import _compat
from pytest_backendconf.checks import Check, CheckFailed, Unsupported
from pytest_backendconf.errors import LoweringError, UnsupportedNodeError
from pytest_backendconf.lowering import DEFAULT_TOLERANCES, export_method, lower_programs
from pytest_backendconf.quant import (
    LLM_SCHEMES,
    QuantizedRule,
    QuantizeError,
    WeightParts,
    close_per_token,
    judge_tokens,
    judge_weights,
    quantize_llm,
    sqnr_db,
)
from pytest_backendconf.suite import SuiteContext

from ._spec import section

import pytest_backendconf as bc


class LlmLinears(nn.Module):
    """Three linear layers of other shapes on one input of tokens (one without bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(256, 384)
        self.narrow = nn.Linear(256, 40, bias=False)
        self.square = nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.wide(x), self.narrow(x), self.square(x[..., :128])


class LlmMlp(nn.Module):
    """A decoder's SwiGLU MLP block: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(128, 256, bias=False)
        self.up = nn.Linear(128, 256, bias=False)
        self.down = nn.Linear(256, 128, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


#: name -> (class, input shape (batch, tokens, features)).
MODELS: dict[str, tuple[type[nn.Module], tuple[int, ...]]] = {
    "llm_linears": (LlmLinears, (2, 5, 256)),
    "llm_mlp": (LlmMlp, (2, 4, 128)),
}


def checks(ctx: SuiteContext) -> Iterator[Check]:
    spec = section("quantized")
    for name in spec["llm_cases"]:
        for scheme in spec["llm_schemes"]:
            yield Check(
                category="quantized",
                name=f"{name}[{scheme}]",
                run=functools.partial(check_llm, model=name, scheme=scheme),
                stage="execute",
                case=name,
            )


def _float_model(model: str) -> nn.Module:
    cls, _ = MODELS[model]
    torch.manual_seed(sum(map(ord, cls.__name__)))  # the same weights in every process
    return cls().eval()


def tokens(model: str, seed: int) -> torch.Tensor:
    """Seeded tokens whose magnitudes differ from token to token (by up to 30x), as a decoder's do."""
    shape = MODELS[model][1]
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    return x * torch.exp(torch.randn(*shape[:-1], 1, generator=generator) * 1.2)


def quantized_model(ctx: SuiteContext, model: str, scheme: str) -> tuple[nn.Module, nn.Module]:
    """(the float model, its quantized copy): eager's reference, once per session."""

    def make() -> Any:
        floats = _float_model(model)
        try:
            return floats, quantize_llm(_float_model(model), scheme)
        except (QuantizeError, ImportError, AssertionError, RuntimeError) as exc:
            return CheckFailed(f"{model} could not be quantized with {LLM_SCHEMES[scheme].describe()}: {exc}")

    found = ctx.memo(("quantized-llm", model, scheme), make)
    if isinstance(found, BaseException):
        raise found
    return found


def _lowered(ctx: SuiteContext, model: str, scheme: str) -> tuple[Any, str]:
    def make() -> Any:
        _, quantized = quantized_model(ctx, model, scheme)
        try:
            program = export_method(quantized, "forward", (tokens(model, 0),), {})
        except LoweringError as exc:
            return CheckFailed(f"{model} [{scheme}] could not be exported: {exc}")
        return lower_layer_or_model(ctx, {"forward": program}, type(quantized), f"{model} [{scheme}]")

    found = ctx.memo(("quantized-llm-lowered", model, scheme), make)
    if isinstance(found, BaseException):
        raise found
    return found


def lower_layer_or_model(ctx: SuiteContext, programs: dict, module_type: type, what: str) -> Any:
    """``(lowered, how)``: whole, else partitioned; `Unsupported` when the backend takes none of it.

    The quantized category's models lower the same way (`quantized._lower`).
    """
    lower = functools.partial(lower_programs, module_type=module_type, backend_version=ctx.registered.source.version)
    spec: dict[str, dict] = {m: {} for m in programs}
    try:
        return lower(programs, ctx.backend, spec), "lowered whole"
    except UnsupportedNodeError as exc:
        rejection = exc
    try:
        lowered = lower(programs, ctx.backend, spec, partition="supported")
    except (UnsupportedNodeError, LoweringError) as exc:
        return Unsupported(f"{what}: rejected whole ({rejection.reason}) and in partitions: {exc}")
    records = bc.delegation(lowered)
    delegated = sum(len(r.delegated) for r in records.values())
    total = sum(r.total for r in records.values())
    if delegated == 0:
        return Unsupported(f"{what}: the backend accepts none of its {total} op nodes")
    return lowered, f"partially delegated ({delegated} of {total} op nodes)"


def rule() -> QuantizedRule:
    found = section("quantized")["rule"]
    return QuantizedRule(
        max_steps=float(found["max_steps"]),
        max_share=float(found["max_share"]),
        sqnr_margin_db=float(found["sqnr_margin_db"]),
    )


def tolerance(ctx: SuiteContext) -> tuple[float, float]:
    """float32's tolerance: the backend's declared one, else the suite's default."""
    declared = ctx.capabilities.tolerances or {}
    return tuple(declared.get(torch.float32, DEFAULT_TOLERANCES["float32"]))  # type: ignore[return-value]


def check_llm(ctx: SuiteContext, *, model: str, scheme: str) -> dict[str, Any]:
    found = LLM_SCHEMES[scheme]
    floats, quantized = quantized_model(ctx, model, scheme)
    lowered, how = _lowered(ctx, model, scheme)
    judged: list[dict[str, Any]] = []
    for seed in section("quantized")["llm_seeds"]:
        x = tokens(model, int(seed))
        with torch.no_grad():
            reference = _flat(quantized(x))
            wide = _flat(floats(x))
        actual = _flat(lowered(x))
        if found.dynamic:
            verdicts = judge_tokens(actual, reference, wide, rule())
            failing: list[str] = [v.text() for v in verdicts if not v.judged.passed]
            judged = judged or [{"token": v.token, **v.judged.json()} for v in verdicts]
            verdict = f"in steps per token ({rule().text(float_output=True)})"
        else:
            failing, judged = _within_tolerance(ctx, actual, reference, wide)
            rtol, atol = tolerance(ctx)
            verdict = (
                f"within float32's tolerance (rtol={rtol:g}, atol={atol:g} times the token's largest output): the "
                "dequantized weights are exact"
            )
        if failing:
            located = locate(ctx, quantized, floats, scheme, x)
            raise CheckFailed(
                f"{model} [{scheme}]: the backend's outputs differ from eager PyTorch running the model quantized "
                f"with {found.describe()}, judged {verdict}, {how}, for example seed {seed}:\n"
                + "\n".join("  " + line for line in failing[:2])
                + (f"\n  ... and {len(failing) - 2} more off" if len(failing) > 2 else "")
                + f"\n{located}",
                details={"quantized": {"scheme": scheme, "outputs": judged[:8]}},
            )
    return {"quantized": {"scheme": scheme, "lowered": how, "outputs": judged[:8]}}


def _flat(value: object) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]  # type: ignore[list-item]


def _within_tolerance(ctx: SuiteContext, actual: list, reference: list, floats: list) -> tuple[list[str], list[dict]]:
    rtol, atol = tolerance(ctx)
    failing: list[str] = []
    judged: list[dict] = []
    for index, want in enumerate(reference):
        got = actual[index] if index < len(actual) else None
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            failing.append(f"output {index}: the backend gives {_describe(got)}, the reference {_describe(want)}")
            continue
        close = close_per_token(got, want, rtol, atol)
        error = (got.double() - want.double()).abs()
        most = float(error.max()) if error.numel() else 0.0
        sqnr_backend, sqnr_reference = sqnr_db(floats[index], got), sqnr_db(floats[index], want)
        judged.append(
            {"index": index, "max_abs_error": most, "sqnr_backend": sqnr_backend, "sqnr_reference": sqnr_reference}
        )
        if not bool(close.all()):
            share = 1 - float(close.double().mean())
            failing.append(
                f"output {index}: max abs error {most:.4g}, {share:.1%} of elements outside the tolerance; SQNR "
                f"against the float model: backend {_db(sqnr_backend)}, reference {_db(sqnr_reference)}"
            )
    return failing, judged


def _db(value: float) -> str:
    return "inf dB" if math.isinf(value) and value > 0 else f"{value:.1f} dB"


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return f"{type(value).__name__}"


# --- where it departs: the layers alone ---------------------------------------------------------


class _Layer(nn.Module):
    """One quantized linear layer of the model, alone."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def quantized_layers(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The linear layers whose weight torchao replaced with a tensor subclass, by module path."""
    return [
        (name, layer)
        for name, layer in module.named_modules()
        if isinstance(layer, nn.Linear) and _compat.is_tensor_subclass(layer.weight)
    ]


def weight_parts(layer: nn.Linear, bits: int) -> WeightParts:
    """The integers, scales and zero points of a torchao-quantized layer's weight."""
    weight: Any = layer.weight  # torchao's subclass (untyped): qdata, scale, zero_point, block_size
    qdata, scale = weight.qdata, weight.scale
    zero_point = getattr(weight, "zero_point", None)
    block = list(getattr(weight, "block_size", [1, qdata.shape[1]]))
    return WeightParts(qdata=qdata, scale=scale, zero_point=zero_point, group=int(block[-1]), bits=bits)


def locate(ctx: SuiteContext, quantized: nn.Module, floats: nn.Module, scheme: str, x: torch.Tensor) -> str:
    """The first layer whose weights the backend runs wrong (row, group, steps), else whose output is off."""
    try:
        return _locate(ctx, quantized, floats, scheme, x)
    except Exception as exc:  # a diagnosis: never hide the failure behind it
        return f"(could not run the layers alone: {type(exc).__name__}: {exc})"


def _locate(ctx: SuiteContext, quantized: nn.Module, floats: nn.Module, scheme: str, x: torch.Tensor) -> str:
    found = LLM_SCHEMES[scheme]
    inputs: dict[str, torch.Tensor] = {}
    hooks = [
        layer.register_forward_pre_hook(lambda _, args, name=name: inputs.setdefault(name, args[0].detach()))
        for name, layer in quantized_layers(quantized)
    ]
    try:
        with torch.no_grad():
            quantized(x)
    finally:
        for hook in hooks:
            hook.remove()
    notes: list[str] = []
    for name, layer in quantized_layers(quantized):
        alone = _Layer(layer)
        unit = torch.cat([torch.zeros(1, layer.in_features), torch.eye(layer.in_features)])  # row 0: the bias
        got = _alone_on_backend(ctx, alone, name, unit, notes)
        if got is None:
            continue
        with torch.no_grad():
            want = alone(unit)
        weights = judge_weights(name, (got[1:] - got[:1]).T, (want[1:] - want[:1]).T, weight_parts(layer, found.bits))
        if weights is not None:
            # 8da4w quantizes the unit rows too (exactly, when the kernels are right): a defect there shows here.
            through = " (through its per-token activation quantization)" if found.dynamic else ""
            return weights.text().replace("read back through unit inputs", "read back through unit inputs" + through)
        given = inputs[name].reshape(-1, layer.in_features)  # tokens as rows: quantized one by one all the same
        actual = _alone_on_backend(ctx, alone, name, given, notes)
        if actual is None:
            continue
        with torch.no_grad():
            reference, wide = alone(given), floats.get_submodule(name)(given)
        right = "alone, fed eager's input (its weights, read back through unit inputs, are right)"
        if found.dynamic:
            off = [v for v in judge_tokens([actual], [reference], [wide], rule()) if not v.judged.passed]
            if off:
                return f"layer {name!r} {right}: " + off[0].text().replace("output 0, ", "")
        else:
            rtol, atol = tolerance(ctx)
            if not bool(close_per_token(actual, reference, rtol, atol).all()):
                most = float((actual.double() - reference.double()).abs().max())
                return f"layer {name!r} {right}: max abs error {most:.4g}"
    return "(every layer's weights are right, and every layer alone is within the rule)" + "".join(
        "\n" + note for note in notes
    )


def _alone_on_backend(
    ctx: SuiteContext, alone: nn.Module, name: str, x: torch.Tensor, notes: list[str]
) -> torch.Tensor | None:
    """The layer lowered alone for inputs shaped as ``x``, run on ``x``; None (and a note) if it cannot be."""
    program = export_method(alone, "forward", (x,), {})
    lowered = lower_layer_or_model(ctx, {"forward": program}, _Layer, f"layer {name!r}")
    if isinstance(lowered, BaseException):
        notes.append(f"layer {name!r} alone: {lowered}")
        return None
    with torch.no_grad():
        return lowered[0](x)
