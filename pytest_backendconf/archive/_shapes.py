"""Dynamic shapes: the sizes a lowered method accepts, read from its exported program.

`torch.export` with ``dynamic_shapes`` gives each varying dimension a symbol
with a range (``program.range_constraints``); two dimensions that must be
equal share one symbol, and a derived dimension is an expression of one
(``2*s0 + 1``). `DynamicShapes` keeps exactly that, in the project's own
JSON (symbols by position, never torch's symbol names or sympy text), so
that the lowered module (and a module loaded from an archive, on any
machine) checks every call before the backend sees it, and checks the
backend's outputs against the sizes the inputs bound.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import TYPE_CHECKING, Any, Hashable, Mapping, Sequence, SupportsInt, cast

from ..errors import InputSpecError, OutputSpecError

if TYPE_CHECKING:
    from typing import TypeGuard

    import torch

    from .._compat import ValueRanges


@dataclasses.dataclass(frozen=True)
class Symbol:
    """One varying size: its inclusive range (``max`` None: unbounded) and where it first occurs."""

    min: int
    max: int | None

    def describe(self) -> str:
        return f"[{self.min}, {'inf' if self.max is None else self.max}]"


@dataclasses.dataclass(frozen=True)
class SymbolicDim:
    """Dimension ``dim`` of flat input or output ``index`` is ``times * symbol + plus``."""

    index: int
    dim: int
    symbol: int
    times: int = 1
    plus: int = 0

    def size_for(self, value: int) -> int:
        return self.times * value + self.plus

    def to_json(self, key: str) -> dict[str, int]:
        out = {key: self.index, "dim": self.dim, "symbol": self.symbol}
        if (self.times, self.plus) != (1, 0):
            out.update(times=self.times, plus=self.plus)
        return out


@dataclasses.dataclass(frozen=True)
class DynamicShapes:
    """The symbols of one lowered method and the input and output dimensions they size.

    The first dimension in ``inputs`` with ``times == 1`` and ``plus == 0``
    for a symbol binds its value; every other use of the symbol must agree.
    """

    symbols: tuple[Symbol, ...]
    inputs: tuple[SymbolicDim, ...]
    outputs: tuple[SymbolicDim, ...] = ()

    def __post_init__(self) -> None:
        # Plain uses first: they bind the symbols, so a derived dimension is
        # checked (and reported) against its root's size.
        ordered = sorted(self.inputs, key=lambda u: ((u.times, u.plus) != (1, 0), u.index, u.dim))
        object.__setattr__(self, "inputs", tuple(ordered))

    # --- reading a program -----------------------------------------------------

    @classmethod
    def from_program(
        cls,
        inputs: list[tuple[str, object]],
        outputs: list[tuple[str, object]],
        range_constraints: Mapping[object, ValueRanges],
    ) -> "DynamicShapes | None":
        """From the example values (fake tensors) of a program's user inputs and outputs.

        ``None`` when no input dimension is symbolic. Dimensions whose size
        is no affine expression of one input symbol (data-dependent output
        sizes, products of two symbols) are left to the backend.
        """
        import sympy

        order: dict[Hashable, int] = {}
        symbols: list[Symbol] = []
        found_inputs: list[SymbolicDim] = []
        for index, (_, value) in enumerate(inputs):
            for dim, size in enumerate(getattr(value, "shape", ()) if hasattr(value, "dtype") else ()):
                affine = _affine(size, sympy)
                if affine is None:
                    continue
                symbol, times, plus = affine
                if symbol not in order:
                    order[symbol] = len(symbols)
                    symbols.append(_symbol_range(symbol, range_constraints))
                found_inputs.append(SymbolicDim(index, dim, order[symbol], times, plus))
        if not found_inputs:
            return None
        found_outputs = []
        for index, (_, value) in enumerate(outputs):
            for dim, size in enumerate(getattr(value, "shape", ()) if hasattr(value, "dtype") else ()):
                affine = _affine(size, sympy)
                if affine is not None and affine[0] in order:
                    symbol, times, plus = affine
                    found_outputs.append(SymbolicDim(index, dim, order[symbol], times, plus))
        return cls(tuple(symbols), tuple(found_inputs), tuple(found_outputs))

    # --- checking calls ----------------------------------------------------------

    def check_inputs(self, method: str, names: list[str], flat: list) -> list[int | None]:
        """The symbols' values for this call; `InputSpecError` naming the input, dimension and range."""
        values: list[int | None] = [None] * len(self.symbols)
        first: list[SymbolicDim | None] = [None] * len(self.symbols)
        for use in self.inputs:
            size = flat[use.index].shape[use.dim]
            symbol = self.symbols[use.symbol]
            bound = values[use.symbol]
            if bound is None and (use.times, use.plus) == (1, 0):
                if size < symbol.min or (symbol.max is not None and size > symbol.max):
                    raise InputSpecError(
                        f"method {method!r} input {names[use.index]!r}: dimension {use.dim} is {size}, outside "
                        f"the range {symbol.describe()} it was exported with; call it with a size in "
                        f"{symbol.describe()}, or lower it again with a wider torch.export.Dim"
                    )
                values[use.symbol], first[use.symbol] = size, use
                continue
            if bound is None:
                # Only derived uses of this symbol: solve for it.
                root, rest = divmod(size - use.plus, use.times)
                if rest or root < symbol.min or (symbol.max is not None and root > symbol.max):
                    raise InputSpecError(
                        f"method {method!r} input {names[use.index]!r}: dimension {use.dim} is {size}, but it "
                        f"must be {_formula(use, 'n')} for an n in {symbol.describe()} (the exported constraint)"
                    )
                values[use.symbol], first[use.symbol] = root, use
                continue
            if size != use.size_for(bound):
                origin = first[use.symbol]
                assert origin is not None
                source = f"input {names[origin.index]!r} dimension {origin.dim}"
                if (use.times, use.plus) == (1, 0):
                    rule = f"must equal {source}, which is {bound} (the exported program declares them equal)"
                else:
                    rule = (
                        f"must be {_formula(use, f'({source})')} = {use.size_for(bound)} (a derived "
                        f"dimension of the exported program; {source} is {bound})"
                    )
                raise InputSpecError(
                    f"method {method!r} input {names[use.index]!r}: dimension {use.dim} is {size}, but it {rule}"
                )
        return values

    def check_outputs(self, method: str, backend: str, outputs: Sequence[object], values: list[int | None]) -> None:
        """Output sizes must follow the call's input sizes (a backend that kept the first shape does not).

        ``outputs`` passed their specs' checks: the ones a symbol sizes are tensors.
        """
        for use in self.outputs:
            value = values[use.symbol]
            if value is None:
                continue
            size = cast("torch.Tensor", outputs[use.index]).shape[use.dim]
            if size != use.size_for(value):
                raise OutputSpecError(
                    f"method {method!r} output {use.index}: dimension {use.dim} is {size} from backend "
                    f"{backend!r}, but this call's input sizes make it {use.size_for(value)}; does the backend "
                    "keep the shapes of an earlier call (a cached buffer, a program specialised on the "
                    "example inputs)?",
                    output=use.index,
                    differs=("shape",),
                )

    def example_sizes(self, preferred: int = 2) -> dict[tuple[int, int], int]:
        """``{(input, dim): size}`` for example inputs: each symbol at ``preferred`` moved into its range.

        Every use of a symbol gets the same value (derived dimensions follow
        it), so the sizes pass `check_inputs`: an archive lowered with
        ``Dim(min=3)`` gets 3, not the 2 that suits most others.
        """
        values = []
        for symbol in self.symbols:
            value = max(preferred, symbol.min)
            values.append(value if symbol.max is None else min(value, symbol.max))
        return {(use.index, use.dim): use.size_for(values[use.symbol]) for use in self.inputs}

    def ranges(self, names: list[str]) -> dict[str, tuple[int, int | None]]:
        """``{"x[0]": (min, max)}`` for every plainly used input dimension, for messages and the suite."""
        out = {}
        for use in self.inputs:
            if (use.times, use.plus) == (1, 0):
                symbol = self.symbols[use.symbol]
                out[f"{names[use.index]}[{use.dim}]"] = (symbol.min, symbol.max)
        return out

    # --- JSON ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "symbols": [{"min": s.min, "max": s.max} for s in self.symbols],
            "inputs": [u.to_json("input") for u in self.inputs],
            "outputs": [u.to_json("output") for u in self.outputs],
        }

    @classmethod
    def from_json(cls, data: object, inputs: tuple, outputs: tuple) -> "DynamicShapes":
        """Read and check the JSON against the method's value specs; `ValueError` says what is wrong."""
        if not isinstance(data, dict) or set(data) != {"symbols", "inputs", "outputs"}:
            raise ValueError("dynamic_shapes must be an object with symbols, inputs and outputs")
        symbols = []
        for i, record in enumerate(_list(data["symbols"], "dynamic_shapes.symbols")):
            if not isinstance(record, dict) or set(record) != {"min", "max"}:
                raise ValueError(f"dynamic_shapes.symbols[{i}] must be an object with min and max")
            low, high = record["min"], record["max"]
            if not _size(low) or not (high is None or (_size(high) and high >= low)):
                raise ValueError(f"dynamic_shapes.symbols[{i}] has range [{low!r}, {high!r}]; need 0 <= min <= max")
            symbols.append(Symbol(low, high))
        uses = {
            key: tuple(
                _use(r, key, i, specs, len(symbols))
                for i, r in enumerate(_list(data[f"{key}s"], f"dynamic_shapes.{key}s"))
            )
            for key, specs in (("input", inputs), ("output", outputs))
        }
        bound = {u.symbol for u in uses["input"]}
        if len(bound) != len(symbols):
            raise ValueError("dynamic_shapes.symbols has a symbol that sizes no input dimension")
        return cls(tuple(symbols), uses["input"], uses["output"])


def _affine(size: object, sympy: ModuleType) -> tuple[Hashable, int, int] | None:
    """``(symbol, times, plus)`` when ``size`` is a SymInt ``times*symbol + plus``, else None (the symbol: sympy's)."""
    node = getattr(size, "node", None)
    expr = getattr(node, "expr", None)
    if expr is None:
        return None
    free = expr.free_symbols
    if len(free) != 1:
        return None
    (symbol,) = free
    try:
        poly = sympy.Poly(expr, symbol)
    except sympy.PolynomialError:
        return None
    if poly.degree() != 1:
        return None
    times, plus = poly.all_coeffs()
    if not (getattr(times, "is_Integer", False) and getattr(plus, "is_Integer", False)) or times <= 0:
        return None
    return symbol, int(times), int(plus)


def _symbol_range(symbol: Hashable, range_constraints: Mapping[object, ValueRanges]) -> Symbol:
    bounds = range_constraints.get(symbol) if range_constraints else None
    if bounds is None:
        return Symbol(0, None)
    return Symbol(max(0, _finite(bounds.lower) or 0), _finite(bounds.upper))


def _finite(value: SupportsInt) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _formula(use: SymbolicDim, of: str) -> str:
    text = of if use.times == 1 else f"{use.times} * {of}"
    if use.plus:
        text += f" {'+' if use.plus > 0 else '-'} {abs(use.plus)}"
    return text


def _size(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list")
    return value


def _use(record: object, key: str, i: int, specs: tuple, n_symbols: int) -> SymbolicDim:
    where = f"dynamic_shapes.{key}s[{i}]"
    allowed = {key, "dim", "symbol", "times", "plus"}
    if not isinstance(record, dict) or not {key, "dim", "symbol"} <= set(record) <= allowed:
        raise ValueError(f"{where} must be an object with {key}, dim and symbol (times and plus optional)")
    index, dim, symbol = record[key], record["dim"], record["symbol"]
    times, plus = record.get("times", 1), record.get("plus", 0)
    if not all(type(v) is int for v in (index, dim, symbol, times, plus)) or times < 1:
        raise ValueError(f"{where} must hold integers, times >= 1")
    if not 0 <= symbol < n_symbols:
        raise ValueError(f"{where} names symbol {symbol}; there are {n_symbols}")
    if not 0 <= index < len(specs) or specs[index].kind != "tensor":
        raise ValueError(f"{where} names {key} {index}, which is not a tensor {key}")
    shape = specs[index].shape or ()
    if not 0 <= dim < len(shape) or shape[dim] is not None:
        raise ValueError(f"{where} names dimension {dim} of {key} {index}, which is not a symbolic dimension")
    return SymbolicDim(index, dim, symbol, times, plus)


# --- to_backend's argument -------------------------------------------------------------


def per_method(dynamic_shapes: Any, methods: Mapping[str, object], module: torch.nn.Module) -> dict[str, Any]:
    """``to_backend``'s ``dynamic_shapes`` as ``{method: torch.export's form}``.

    One method lowered: ``torch.export.export``'s own form (a dict by
    parameter name, or a tuple by position), or ``{method: that}``. Several
    methods: always ``{method: that}``; a method not named has static shapes.
    """
    import inspect

    from ..errors import LoweringError

    if dynamic_shapes is None:
        return {}
    names = list(methods)
    keyed = isinstance(dynamic_shapes, dict) and bool(dynamic_shapes) and all(k in methods for k in dynamic_shapes)
    if len(names) == 1 and keyed:
        # {"forward": ...} is per method unless forward takes a parameter of that name.
        params = inspect.signature(getattr(type(module), names[0])).parameters
        keyed = not any(k in params for k in dynamic_shapes)
    if keyed:
        return dict(dynamic_shapes)
    if len(names) == 1:
        return {names[0]: dynamic_shapes}
    unknown = sorted(map(str, set(dynamic_shapes) - set(methods))) if isinstance(dynamic_shapes, dict) else []
    raise LoweringError(
        f"dynamic_shapes must be a dict {{method_name: dynamic shapes of that method}} when several methods "
        f"are lowered ({', '.join(names)})"
        + (f"; {unknown} are not among them" if unknown else f", got {type(dynamic_shapes).__name__}")
        + "; e.g. dynamic_shapes={'encode': {'x': {0: torch.export.Dim('batch', min=1, max=64)}}}"
    )


def fit_positional(dynamic_shapes: Any, n_args: int) -> Any:
    """A tuple form padded with ``None`` (static) for positional parameters filled in from defaults."""
    if isinstance(dynamic_shapes, (tuple, list)) and len(dynamic_shapes) < n_args:
        return type(dynamic_shapes)([*dynamic_shapes, *[None] * (n_args - len(dynamic_shapes))])
    return dynamic_shapes
