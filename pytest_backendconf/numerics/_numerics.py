"""How far a backend's outputs are from the reference, in numbers a vendor can act on.

For every output of a comparison: the max absolute and relative error, the
worst element (its index and both values), its distance in ULPs for float
types, and the *closeness*, the largest ratio of error to allowed error
(``|a - e| / (atol + rtol * |e|)``): below 1 passes, and a passing check
near 1 runs close to the limit. The tolerance travels with where it came
from (the suite's default, the backend's `Capabilities`, a per-op or
per-model override), so a failure says which knob to turn.

Low-precision outputs are judged three ways (`compare_outputs` with
``eager``): against the *truth* (eager PyTorch in float64, cast back) and
against how far eager PyTorch in the tested dtype is from that truth. An
output passes when it is within the tolerance of the truth, or when its
closeness is at most ``multiple`` times eager's own closeness: a backend
no less accurate than PyTorch's CPU kernels is never failed for PyTorch's
rounding, and a more accurate one passes too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping, cast

import torch

if TYPE_CHECKING:
    from ..capabilities import Pair, Tolerances

#: Integer views with the bit layout of each float dtype, for ULP distances.
_BITS = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``(rtol, atol)`` and where they come from (``default``, ``capabilities``, ``override 'aten.exp.default'`` …)."""

    rtol: float
    atol: float
    source: str = "default"

    def __str__(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g} ({self.source})"

    def scaled(self, factor: float, why: str) -> "Tolerance":
        return Tolerance(self.rtol * factor, self.atol * factor, f"{self.source}, {why}")


def resolve_tolerance(
    dtype: torch.dtype, keys: Iterable[str], declared: Tolerances | None, defaults: Mapping[str, Any]
) -> Tolerance:
    """The tolerance for ``dtype``, most specific first.

    ``keys`` are the names a backend may key an override by, most specific
    first (an op overload, a model case name). A key's value is either a pair
    ``(rtol, atol)`` for every dtype or ``{dtype: (rtol, atol)}``. Then the
    backend's per-dtype entry, then the suite's default for the dtype.
    """
    declared = declared or {}
    for key in keys:
        value = declared.get(key)
        if isinstance(value, Mapping):
            value = value.get(dtype)
        if value is not None:
            return Tolerance(float(value[0]), float(value[1]), f"override {key!r} in the backend's capabilities")
    if dtype in declared:
        rtol, atol = cast("Pair", declared[dtype])  # a dtype's entry is a pair (Capabilities.tolerances)
        return Tolerance(float(rtol), float(atol), "the backend's capabilities")
    rtol, atol = defaults.get(str(dtype).removeprefix("torch."), (0.0, 0.0))
    return Tolerance(float(rtol), float(atol), "default")


@dataclasses.dataclass(frozen=True)
class EagerError:
    """How far eager PyTorch in the tested dtype is from the truth, on the same scale as the backend."""

    dtype: str
    max_abs: float
    max_rel: float
    #: max |eager - truth| / allowed over the elements where eager is finite or the truth is not.
    closeness: float
    sqnr_db: float

    def as_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "max_abs_error": _json(self.max_abs),
            "max_rel_error": _json(self.max_rel),
            "closeness": _json(self.closeness),
            "sqnr_db": _json(self.sqnr_db),
        }


@dataclasses.dataclass(frozen=True)
class Closeness:
    """One output compared with its reference."""

    output: int
    dtype: str
    numel: int
    mismatched: int
    max_abs: float
    max_rel: float
    #: The element with the largest error relative to its allowance.
    index: tuple[int, ...]
    actual: float
    expected: float
    #: ULPs between the worst element's two values (float outputs only).
    ulp: int | None
    #: max |a - e| / (atol + rtol * |e|); < 1 passes (``inf``: an error where none is allowed).
    closeness: float
    tolerance: Tolerance
    #: Signal-to-quantization-noise ratio of the backend's output against the reference, in dB
    #: (``inf``: no error; ``-inf``: a non-finite value where the reference is finite).
    sqnr_db: float = math.inf
    #: Eager PyTorch in the tested dtype against the same reference (three-way comparisons only).
    eager: EagerError | None = None
    #: The backend passes when its closeness is at most this multiple of eager's.
    multiple: float = 0.0
    #: The backend's closeness on the eager rule's terms: an element where the backend
    #: reproduces eager's non-finite value exactly counts as no error.
    judged: float = math.nan
    #: What is compared when it is not an output ("input 3, written by the op").
    label: str = ""

    @property
    def passed(self) -> bool:
        return self.mismatched == 0 or self.passed_by_eager

    @property
    def passed_by_eager(self) -> bool:
        """Out of tolerance of the truth, but no worse than ``multiple`` times eager's own error."""
        return self.eager is not None and self.judged <= self.multiple * self.eager.closeness

    def text(self) -> str:
        where = (self.label or f"output {self.output}") + (f" at index {list(self.index)}" if self.index else "")
        ulp = f", {self.ulp} ULP apart" if self.ulp is not None else ""
        text = (
            f"{where} ({self.dtype}, {self.mismatched} of {self.numel} elements out of tolerance): "
            f"max abs error {_num(self.max_abs)}, max rel error {_num(self.max_rel)}; "
            f"worst element: backend {_num(self.actual)}, reference {_num(self.expected)}{ulp}\n"
            f"  tolerance {self.tolerance}; closeness {_num(self.closeness)} (error / allowed error, < 1 passes)"
        )
        if self.eager is not None:
            text += (
                f"\n  eager PyTorch in {self.eager.dtype} against the same reference: "
                f"max abs error {_num(self.eager.max_abs)}, max rel error {_num(self.eager.max_rel)}, "
                f"closeness {_num(self.eager.closeness)}; the backend's {_num(self.judged)} is more than "
                f"{self.multiple:g}x eager's, so neither rule passes it"
            )
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "dtype": self.dtype,
            "numel": self.numel,
            "mismatched": self.mismatched,
            "max_abs_error": _json(self.max_abs),
            "max_rel_error": _json(self.max_rel),
            "index": list(self.index),
            "actual": _json(self.actual),
            "expected": _json(self.expected),
            "ulp": self.ulp,
            "closeness": _json(self.closeness),
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol, "source": self.tolerance.source},
            "sqnr_db": _json(self.sqnr_db),
            "eager_error": self.eager.as_json() if self.eager is not None else None,
            "passed_by": "tolerance" if self.mismatched == 0 else ("eager" if self.passed_by_eager else None),
            **({"label": self.label} if self.label else {}),
        }


class StructureMismatch(Exception):
    """The outputs differ in count, dtype or shape: no element-wise comparison is possible.

    ``differs``: which of them, one of ``"count"``, ``"type"`` (not a tensor), ``"dtype"``, ``"shape"``.
    """

    def __init__(self, message: str, differs: str = "") -> None:
        super().__init__(message)
        self.differs = differs


def compare_outputs(
    actual: object, expected: object, tolerance: Tolerance, eager: object = None, multiple: float = 0.0
) -> list[Closeness]:
    """Compare flat lists (or single tensors) of outputs; raises `StructureMismatch` on shape or dtype.

    ``eager``: eager PyTorch's outputs in the tested dtype, when ``expected``
    is the truth (float64, cast back); floating outputs then also pass at
    most ``multiple`` times eager's own closeness.
    """
    actual_list = _as_list(actual)
    expected_list = _as_list(expected)
    eager_list = _as_list(eager) if eager is not None else [None] * len(expected_list)
    if len(actual_list) != len(expected_list):
        raise StructureMismatch(
            f"the backend returned {len(actual_list)} outputs, the reference {len(expected_list)}", "count"
        )
    return [
        compare_tensor(i, a, e, tolerance, g, multiple)
        for i, (a, e, g) in enumerate(zip(actual_list, expected_list, eager_list))
    ]


def compare_tensor(
    output: int, actual: object, expected: object, tolerance: Tolerance, eager: object = None, multiple: float = 0.0
) -> Closeness:
    if not isinstance(expected, torch.Tensor):
        expected = torch.tensor(expected)
    if not isinstance(actual, torch.Tensor):
        raise StructureMismatch(f"output {output} is a {type(actual).__name__}, the reference a tensor", "type")
    if actual.dtype != expected.dtype:
        raise StructureMismatch(f"output {output} has dtype {actual.dtype}, the reference {expected.dtype}", "dtype")
    if actual.shape != expected.shape:
        raise StructureMismatch(
            f"output {output} has shape {list(actual.shape)}, the reference {list(expected.shape)}", "shape"
        )
    dtype = str(expected.dtype).removeprefix("torch.")
    numel = expected.numel()
    if numel == 0:
        return Closeness(
            output, dtype, 0, 0, 0.0, 0.0, (), 0.0, 0.0, 0 if expected.is_floating_point() else None, 0.0, tolerance
        )
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    exact = not expected.is_floating_point()
    rtol, atol = (0.0, 0.0) if exact else (tolerance.rtol, tolerance.atol)
    diff, ratio = _errors(a, e, rtol, atol)
    mismatched = int((ratio > 1).sum()) if not exact else int((diff > 0).sum())
    flat = int(torch.argmax(torch.where(ratio.isnan(), torch.full_like(ratio, math.inf), ratio)).item())
    if float(ratio.reshape(-1)[flat]) == 0:
        flat = int(torch.argmax(diff).item())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape)) if expected.dim() else ()
    rel = _relative(diff, e)
    actual_value = float(a.reshape(-1)[flat])
    expected_value = float(e.reshape(-1)[flat])
    eager_error, judged = None, math.nan
    if isinstance(eager, torch.Tensor) and not exact and eager.shape == expected.shape:
        g = eager.detach().to(torch.float64)
        eager_diff, eager_ratio = _errors(g, e, rtol, atol)
        # Where eager itself is non-finite and the truth is not (an overflow in the
        # dtype), eager's error has no size: those elements leave eager's closeness
        # out, and a backend that reproduces eager's value there is not blamed for it.
        lost = eager_ratio.isinf()
        same = (a == g) | (a.isnan() & g.isnan())
        finite = eager_ratio[~lost]
        eager_rel = _relative(eager_diff, e)
        eager_error = EagerError(
            dtype,
            float(eager_diff.max()),
            float(eager_rel.max()),
            float(finite.max()) if finite.numel() else 0.0,
            _sqnr(e, eager_diff),
        )
        judged = float(torch.where(lost & same, torch.zeros_like(ratio), ratio).max())
    return Closeness(
        output=output,
        dtype=dtype,
        numel=numel,
        mismatched=mismatched,
        max_abs=float(diff.max()),
        max_rel=float(rel.max()),
        index=index,
        actual=actual_value,
        expected=expected_value,
        ulp=None if exact else ulp_distance(actual.reshape(-1)[flat], expected.reshape(-1)[flat]),
        closeness=float(ratio.max()) if not exact else (0.0 if mismatched == 0 else math.inf),
        tolerance=tolerance,
        sqnr_db=_sqnr(e, diff),
        eager=eager_error,
        multiple=multiple,
        judged=judged,
    )


def _errors(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``|a - e|`` (NaN against a number: ``inf``) and its ratio to the allowance ``atol + rtol * |e|``."""
    both_nan = a.isnan() & e.isnan()
    same_inf = a == e  # equal infinities (and equal finite values) have no error
    diff = torch.where(both_nan | same_inf, torch.zeros_like(a), (a - e).abs())
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)  # NaN on one side only
    allowed = atol + rtol * e.abs()
    # x / 0 = inf: an error where none is allowed; an infinite error is infinitely far
    # even where the allowance is infinite too (the reference is inf, the backend NaN).
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed)
    ratio = torch.where(diff.isinf(), torch.full_like(diff, math.inf), ratio)
    return diff, ratio


def _relative(diff: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / e.abs())
    return torch.where(diff.isinf(), torch.full_like(diff, math.inf), rel)


def _sqnr(reference: torch.Tensor, diff: torch.Tensor) -> float:
    """``10 log10(sum ref^2 / sum err^2)`` over the elements where the reference is finite."""
    finite = reference.isfinite()
    signal = float((reference[finite] ** 2).sum())
    noise = float((diff[finite] ** 2).sum())
    if noise == 0:
        return math.inf
    if not math.isfinite(noise):
        return -math.inf
    if signal == 0:
        return -math.inf
    return 10 * math.log10(signal / noise)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Representable values between two floats of the same dtype (``None`` for NaN or other dtypes)."""
    bits = _BITS.get(a.dtype)
    if bits is None or a.isnan().any() or b.isnan().any():
        return None
    return abs(_ordered(a, bits) - _ordered(b, bits))


def _ordered(x: torch.Tensor, bits: torch.dtype) -> int:
    # Sign-magnitude bits to a number line where adjacent floats differ by 1.
    raw = int(x.reshape(1).view(bits)[0])
    width = torch.iinfo(bits).bits
    return -(raw & ((1 << (width - 1)) - 1)) if raw < 0 else raw


def worst(results: Iterable[Closeness]) -> Closeness | None:
    """The result with the largest closeness (the one nearest, or furthest past, its limit)."""
    found = list(results)
    return max(found, key=lambda c: (c.closeness, c.max_abs)) if found else None


def summary_json(results: list[Closeness]) -> dict[str, Any]:
    """What the JSON report keeps of a comparison: the worst output and every output's figures."""
    top = worst(results)
    eager = [c.eager for c in results if c.eager is not None]
    return {
        "closeness": _json(top.closeness) if top else 0.0,
        "max_abs_error": _json(max((c.max_abs for c in results), default=0.0)),
        "max_rel_error": _json(max((c.max_rel for c in results), default=0.0)),
        "sqnr_db": _json(min((c.sqnr_db for c in results), default=math.inf)),
        # How far eager PyTorch in the tested dtype is from the same reference (None: the
        # reference is eager in the tested dtype itself, so eager's error is zero by definition).
        "eager_error": {
            "max_abs_error": _json(max(g.max_abs for g in eager)),
            "max_rel_error": _json(max(g.max_rel for g in eager)),
            "closeness": _json(max(g.closeness for g in eager)),
            "sqnr_db": _json(min(g.sqnr_db for g in eager)),
        }
        if eager
        else None,
        "outputs": [c.as_json() for c in results],
    }


def _as_list(value: object) -> list[object]:
    from .. import _compat

    return list(_compat.tree_leaves(value))


def _num(value: float) -> str:
    return f"{value:.6g}"


def _json(value: float) -> float | str:
    # JSON has no inf or NaN: write them as strings.
    return value if math.isfinite(value) else str(value)
