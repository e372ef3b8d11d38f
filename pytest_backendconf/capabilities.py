"""`Capabilities`: what a backend declares the suite may expect of it (docs/writing-a-backend.md)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    import torch

    #: An ``(rtol, atol)`` pair.
    Pair = tuple[float, float]
    #: `Capabilities.tolerances`: a dtype maps to a pair; an op overload or a model case name to a pair
    #: or to ``{dtype: pair}``.
    Tolerances = Mapping[torch.dtype | str, Pair | Mapping[torch.dtype, Pair]]


#: torch's tracing entry points, blocked on the simulated target unless a
#: backend names them in ``target_runtime_modules``: ``torch.export.export``,
#: ``torch.compile`` and dynamo's export import them on first use, and
#: ``import torch`` imports neither (true of torch 2.4-2.14).
TRACING_MODULES = ("torch._dynamo", "torch.export._trace")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """A backend's declaration; ``None`` means "make no assumption".

    With ``None`` the suite discovers support by trying and reports what it
    found. Fields may be added in later versions; these stay.
    """

    #: Op overload names the backend compiles, e.g. ``{"aten.mul.Tensor"}``.
    supported_ops: frozenset[str] | None = None
    #: Tensor dtypes the backend executes, e.g. ``{torch.float32}``.
    dtypes: frozenset[torch.dtype] | None = None
    #: ``(rtol, atol)`` per dtype (``{torch.float16: (1e-3, 1e-5)}``), and overrides keyed by an
    #: op overload or a model case name, most specific first: ``{"aten.exp.default": (rtol, atol)}``
    #: or ``{"small_cnn": {torch.float16: (rtol, atol)}}`` (docs/writing-a-backend.md, "Tolerances").
    tolerances: Tolerances | None = None
    #: Modules only ``preprocess`` needs; the target side blocks their import.
    host_only_modules: tuple[str, ...] = ()
    #: ``execute`` may be called from several threads at once.
    thread_safe: bool = False
    #: Honours the ``"__backendconf_fault__"`` compile-spec key (docs/backend-contract.md).
    fault_injection: bool = False
    #: Runs programs exported with ``dynamic_shapes`` (sizes that vary per call,
    #: within ``program.range_constraints``). ``False``: the suite reports its
    #: dynamic-shape checks as unsupported instead of running them.
    dynamic_shapes: bool = True
    #: torch's tracing modules (``torch._dynamo``, ``torch.export._trace``) that
    #: the backend's runtime imports without tracing; the target allows these
    #: imports, and still fails a ``compile`` that calls ``torch.export.export``
    #: or ``torch.compile``.
    target_runtime_modules: tuple[str, ...] = ()
    #: The ops category may lower several of its single-op checks as one program, once, and
    #: split the results per check (for an engine whose cost is per lowering). ``True``: batch
    #: them; ``False`` or ``None``: one lowering per check. ``--backendconf-batch`` overrides it.
    #: Only for a backend whose verdict on a node does not depend on the program's other nodes.
    batch_ops: bool | None = None
    #: The backend keeps a stateful program's state itself (as ExecuTorch's delegates may keep
    #: mutable buffers), instead of receiving it as inputs and returning it as outputs of ``execute``
    #: (docs/backend-contract.md, "State"). This version of the lowering refuses a stateful program
    #: for such a backend with a `LoweringError`; ``False`` (the default) is the contract every
    #: backend can meet.
    keeps_state: bool = False

    def __post_init__(self) -> None:
        # Accept any iterable for the set-like fields, store frozen copies so
        # that a declaration cannot change under the suite's feet.
        if self.supported_ops is not None:
            object.__setattr__(self, "supported_ops", frozenset(self.supported_ops))
        if self.dtypes is not None:
            object.__setattr__(self, "dtypes", frozenset(self.dtypes))
        if self.tolerances is not None:
            object.__setattr__(self, "tolerances", dict(self.tolerances))
        object.__setattr__(self, "host_only_modules", tuple(self.host_only_modules))
        object.__setattr__(self, "target_runtime_modules", tuple(self.target_runtime_modules))

    def problems(self) -> list[str]:
        """Return what is malformed in this declaration (empty when well formed)."""
        found = []
        if self.supported_ops is not None:
            bad = sorted(op for op in self.supported_ops if not _is_overload_name(op))
            if bad:
                found.append(f"supported_ops has {bad!r}: write overload names such as 'aten.mul.Tensor'")
        if self.dtypes is not None:
            not_dtypes = [d for d in self.dtypes if type(d).__name__ != "dtype"]
            if not_dtypes:
                found.append(f"dtypes has {not_dtypes!r}: write torch dtypes such as torch.float32")
        for key, value in (self.tolerances or {}).items():
            # An op overload or model name may map to a pair or to {dtype: pair}.
            pairs: Iterable[tuple[torch.dtype | None, object]] = (
                value.items() if isinstance(key, str) and isinstance(value, Mapping) else [(None, value)]
            )
            for dtype, pair in pairs:
                if not _is_pair(pair):
                    where = f"tolerances[{key}]"
                    where += f"[{dtype}]" if dtype is not None else ""
                    found.append(f"{where} is {pair!r}: write a pair (rtol, atol) of non-negative numbers")
        bad_modules = [m for m in self.host_only_modules if not isinstance(m, str) or not m]
        if bad_modules:
            found.append(f"host_only_modules has {bad_modules!r}: write module names")
        odd = [m for m in self.target_runtime_modules if m not in TRACING_MODULES]
        if odd:
            found.append(
                f"target_runtime_modules has {odd!r}: it names modules among {list(TRACING_MODULES)} "
                "that the runtime imports without tracing; other modules are not blocked on the target"
            )
        for flag in ("thread_safe", "fault_injection", "dynamic_shapes", "keeps_state"):
            if not isinstance(getattr(self, flag), bool):
                found.append(f"{flag} is {getattr(self, flag)!r}: write True or False")
        if self.batch_ops is not None and not isinstance(self.batch_ops, bool):
            found.append(f"batch_ops is {self.batch_ops!r}: write True, False or None")
        return found


def _is_pair(pair: object) -> bool:
    return isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(v, (int, float)) and v >= 0 for v in pair)


def _is_overload_name(op: object) -> bool:
    if not isinstance(op, str):
        return False
    parts = op.split(".")
    return len(parts) >= 2 and all(p.isidentifier() for p in parts)


def capabilities_of(backend: object) -> Capabilities:
    """The backend's declared capabilities, or the all-``None`` default."""
    declared = getattr(backend, "capabilities", None)
    return declared if isinstance(declared, Capabilities) else Capabilities()
