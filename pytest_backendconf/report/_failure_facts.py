"""What a generated known-failures entry records of a failure: where it starts and its figures, as data.

A failing check's report entry carries its verdict as data (`CheckOutcome`'s details): the comparison's
numerics, the node where the outputs first diverge (``details.divergence``) and the operators of its
minimal reproduction. An entry written from it keeps them as keys of their own beside the reason (the
failure's first line), so that nothing is cut to fit one string:
``node``, ``op``, ``output`` and ``figures`` (docs/ci-gating.md, "What an entry records").
Never imports torch or pytest.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .._diagnostic import diagnostic_line

#: The numbers ``figures`` may hold: the worst output's error, its closeness and the tolerance it had.
FIGURE_KEYS = ("max_abs_error", "max_rel_error", "closeness", "ulp", "rtol", "atol")
#: The longest reason written from a failure's first line: a backend's message is foreign text of any
#: length, and a known-failures file is read by people (the rest of the failure is in the report).
MAX_REASON = 1000


def reason_of(error: Mapping[str, Any] | None, outcome: str | None, verdict_type: str) -> str:
    """The failure's diagnostic line (with its exception type unless it is the suite's own verdict), whole.

    The suite's own verdict gives its first line; an exception its diagnostic
    line (`diagnostic_line`: the first line naming an op or giving a
    compiler's ``error:``, else its first line), so that a wrapper such as
    ``CompilerToolError: Error invoking … iree-compile`` is not the reason
    when the compiler's ``'arith.constant' op failed to verify …`` is below it.
    A trailing colon, which introduced the lines of detail that follow it in
    the failure text, is dropped; only a line longer than `MAX_REASON` is cut,
    and then it says so with a final ``…``.
    """
    if error is None:
        return outcome or "failed"
    message = str(error.get("message", ""))
    kind = str(error.get("type", ""))
    if kind == verdict_type:
        first = (message.splitlines() or [""])[0]
    else:
        first = diagnostic_line(message)
        said = _compiler_diagnostic(message) if kind == "CompilerError" else None
        if said:
            # "The node of aten::tanh failed in this compiler, which claims it" and the compiler's own words.
            first = f"{first.removesuffix(' Source code:').rstrip('.')}: {said}"
    first = first.strip().removesuffix(":").rstrip()
    line = first if kind == verdict_type and first else f"{kind}: {first}" if first else kind
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def _compiler_diagnostic(message: str) -> str | None:
    """The ``Diagnostic: …`` line of a `CompilerError`'s text (its first node's), without the label."""
    for line in message.splitlines():
        if line.startswith("Diagnostic: "):
            return line.removeprefix("Diagnostic: ").strip() or None
    return None


def facts_of(details: Mapping[str, Any] | None, reproduction: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"node", "op", "output", "figures"}`` (each only when known) of a failure's report details.

    ``node`` and ``op``: where the outputs first diverge (``details.divergence``),
    else the one operator of a one-node minimal reproduction. ``output`` and
    ``figures``: the output furthest out of tolerance and its numbers
    (``details.numerics``), rounded to four significant digits.
    """
    found: dict[str, Any] = {}
    details = details or {}
    reproduction = reproduction or {}
    divergence = details.get("divergence")
    if isinstance(divergence, Mapping):
        if isinstance(divergence.get("node"), str) and divergence["node"]:
            found["node"] = divergence["node"]
        if isinstance(divergence.get("op"), str) and divergence["op"]:
            found["op"] = divergence["op"]
    ops = reproduction.get("ops")
    if "op" not in found and reproduction.get("script") and isinstance(ops, list) and len(ops) == 1:
        found["op"] = str(ops[0])
    worst = _worst_output(details.get("numerics"))
    if worst is not None:
        if isinstance(worst.get("output"), int) and not isinstance(worst["output"], bool):
            found["output"] = worst["output"]
        given = worst.get("tolerance")
        tolerance: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        figures = []
        for key in FIGURE_KEYS:
            value = _number(tolerance.get(key) if key in ("rtol", "atol") else worst.get(key))
            if value is not None:
                figures.append((key, value if key == "ulp" else _rounded(value)))
        if figures:
            found["figures"] = tuple(figures)
    return found


def _worst_output(numerics: object) -> Mapping[str, Any] | None:
    """The output of a failed comparison that is furthest out of tolerance (None: no output is out)."""
    if not isinstance(numerics, Mapping) or not isinstance(numerics.get("outputs"), list):
        return None
    failing = [
        o
        for o in numerics["outputs"]
        if isinstance(o, Mapping) and (_number(o.get("closeness")) or 0.0) >= 1 and o.get("passed_by") is None
    ]
    return max(failing, key=lambda o: _number(o.get("closeness")) or 0.0, default=None)


def _number(value: object) -> float | int | None:
    """A report's number (an infinity is the string ``"inf"`` there), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if value in ("inf", "-inf", "nan"):
        return float(value)
    return None


def _rounded(value: float | int) -> float:
    value = float(value)
    return value if not math.isfinite(value) or value == 0 else float(f"{value:.4g}")


def number_toml(value: float | int) -> str:
    """A number as TOML writes it: ``0.0874``, ``1e-05``, ``358``, ``inf``, ``nan``."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)
