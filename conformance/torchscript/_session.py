"""What the TorchScript checks of one session share: the library, scripted and lowered models, inputs.

Everything is built on first use and cached in the `SuiteContext`'s memo, in
the process that runs the checks (the backend host, or pytest's with
``--backendconf-in-process``): only there is the backend's library loaded.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, cast

import pytest
import torch

from ... import _compat
from ...backend import TorchScriptBackend
from ...checks import CheckFailed, Unsupported
from ...torchscript import Scripted, backend_is_available, load_library, lower, script_case
from .._spec import section

if TYPE_CHECKING:
    from pytest_backendconf.capabilities import Pair
    from pytest_backendconf.suite import SuiteContext

#: The text the seed's demo compiler opens a rejection with.
REJECTION_PREFIX = "The node of "
REJECTION_MIDDLE = " is not supported in this compiler."


def spec() -> dict[str, Any]:
    return section("torchscript")


def backend(ctx: SuiteContext) -> TorchScriptBackend:
    found = ctx.backend
    assert isinstance(found, TorchScriptBackend), "a TorchScript check needs a TorchScriptBackend"
    return found


def loaded(ctx: SuiteContext) -> TorchScriptBackend:
    """The backend with its library loaded in this process (once)."""
    record = backend(ctx)

    def load() -> bool:
        load_library(record)
        return True

    ctx.memo(("torchscript", "library"), load)
    return record


def available(ctx: SuiteContext) -> object:
    """What the C++ ``is_available()`` returns here (asked once per session)."""
    record = loaded(ctx)
    return ctx.memo(("torchscript", "available"), lambda: backend_is_available(record.name))


def require_available(ctx: SuiteContext) -> TorchScriptBackend:
    """The loaded backend; *not applicable* (a skip, never a pass) when its ``is_available()`` is false here."""
    record = loaded(ctx)
    if available(ctx) is not True:
        pytest.skip(
            f"not applicable: backend {record.name!r}'s is_available() returned {available(ctx)!r} in the "
            "process that loaded its library (availability::host_is_available says more)"
        )
    return record


def scripted(ctx: SuiteContext, case: str, dtype: str) -> Scripted:
    """The case in ``dtype`` as TorchScript; `Unsupported` when neither scripting nor tracing takes it."""

    def make() -> Scripted | str:
        try:
            return script_case(
                ctx.module(case, dtype), ctx.cases[case].methods, lambda: tuple(inputs(ctx, case, dtype))
            )
        except RuntimeError as exc:
            return str(exc)

    made = ctx.memo(("torchscript", "scripted", case, dtype), make)
    if isinstance(made, str):
        raise Unsupported(f"TorchScript cannot take model {case}: {made}")
    return made


def inputs(ctx: SuiteContext, case: str, dtype: str, method: str = "forward", seed: int = 0) -> list[Any]:
    """A call's positional arguments (keyword arguments and defaults bound, as TorchScript takes them)."""
    return list(ctx.flat_inputs(case, dtype, method, seed=seed))


def rejection_text(exc: BaseException) -> str | None:
    """The backend's rejection (``The node of X is not supported in this compiler. ...``), or None."""
    text = str(exc)
    if REJECTION_PREFIX in text and REJECTION_MIDDLE in text:
        # Its sentence, without the source it quotes (on the same line or the next ones).
        return text[text.index(REJECTION_PREFIX) :].splitlines()[0].split(" Source code:")[0].rstrip()
    return None


def lower_or_unsupported(module: Any, record: TorchScriptBackend, methods: tuple[str, ...], what: str) -> Any:
    """``module`` lowered; `Unsupported` with the backend's text when preprocess rejects a node of it,
    `CheckFailed` naming ``what`` for any other failure."""
    try:
        return lower(module, record, methods)
    except Exception as exc:
        raise lowering_failure(exc, record, what) from None


def lowering_failure(exc: BaseException, record: TorchScriptBackend, what: str) -> Exception:
    """What a failed lowering of ``what`` means to a check that is not about rejections."""
    rejected = rejection_text(exc)
    if rejected is not None:
        return Unsupported(rejected)
    return CheckFailed(f"torch._C._jit_to_backend({record.name!r}, {what}) failed: {type(exc).__name__}: {exc}")


def lowered(ctx: SuiteContext, case: str, dtype: str, *, fresh: bool = False) -> tuple[Any, Scripted]:
    """The case lowered with ``torch._C._jit_to_backend`` (shared unless ``fresh``).

    `Unsupported` for the seed compiler's rejection; any other failure of the
    lowering fails the check with the backend's text.
    """
    record = loaded(ctx)
    model = scripted(ctx, case, dtype)

    def make() -> Any:
        try:
            return lower(model.module, record, model.methods)
        except Exception as exc:
            return exc

    made = make() if fresh else ctx.memo(("torchscript", "lowered", case, dtype), make)
    if isinstance(made, Exception):
        raise lowering_failure(made, record, f"model {case} in {dtype}")
    return made, model


def runtime_probe(ctx: SuiteContext) -> tuple[dict[str, Any], Any]:
    """The first runtime-error probe (``suite.toml``) the backend lowers, and its lowered module.

    Found by trying, once per session: a backend that compiles two operators
    still gets a probe made of them. `Unsupported` with the backend's texts
    when it rejects every variant; `CheckFailed` when a lowering fails
    otherwise.
    """
    from ._probe_models import probe_model

    record = loaded(ctx)

    def pick() -> tuple[dict[str, Any], Any] | Exception:
        refused: list[str] = []
        for variant in spec()["runtime_error"]:
            try:
                return variant, lower_or_unsupported(
                    torch.jit.script(probe_model(variant["model"])), record, ("forward",), f"probe {variant['model']}"
                )
            except Unsupported as exc:
                refused.append(f"{variant['model']}: {exc}")
            except CheckFailed as exc:
                return exc
        return Unsupported("the backend rejects every variant of the probe: " + "; ".join(refused))

    made = ctx.memo(("torchscript", "runtime probe"), pick)
    if isinstance(made, Exception):
        raise made
    return made


def probe_inputs(shapes: list[list[int]], make: Callable[..., Any] = torch.ones) -> list[Any]:
    return [make(shape) for shape in shapes]


def call(module: Any, method: str, args: list[Any]) -> Any:
    if method == "forward":
        return module(*args)
    return getattr(module, method)(*args)


def leaves(value: Any) -> list[Any]:
    return list(_compat.tree_leaves(value))


def tolerance(ctx: SuiteContext, dtype: str) -> tuple[float, float]:
    declared = ctx.capabilities.tolerances or {}
    for key in (getattr(torch, dtype, None), dtype):
        if key is not None and key in declared:
            rtol, atol = cast("Pair", declared[key])  # a dtype's entry is a pair (Capabilities.tolerances)
            return float(rtol), float(atol)
    default = spec()["tolerances"].get(dtype, [0.0, 0.0])
    return float(default[0]), float(default[1])


def differences(expected: Any, actual: Any, rtol: float = 0.0, atol: float = 0.0) -> str | None:
    """Why ``actual`` is not ``expected`` (leaf by leaf), or None; zero tolerances mean bit for bit."""
    want, got = leaves(expected), leaves(actual)
    if len(want) != len(got):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"output {i} is {type(g).__name__}, expected a tensor"
            if g.dtype != w.dtype or g.shape != w.shape:
                return f"output {i} is {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
            try:
                torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as exc:
                return f"output {i}: " + " ".join(str(exc).split())
        elif w != g:
            return f"output {i} is {g!r}, expected {w!r}"
    return None


def source_line(path: str, expression: str, model: str) -> tuple[int, str]:
    """The 1-based line of ``path`` holding ``expression`` in the class ``model``, and the line."""
    with open(path, encoding="utf-8") as f:
        inside = False
        for number, line in enumerate(f, 1):
            if line.startswith("class "):
                inside = line.startswith(f"class {model}(")
            elif inside and expression in line and not line.lstrip().startswith(('"', "#")):  # code, not its doc
                return number, line.rstrip("\n")
    raise AssertionError(f"{expression!r} is not in class {model} of {path}")


def probe_file() -> str:
    from . import _probe_models as _ts_probe_models

    return os.path.abspath(_ts_probe_models.__file__)


def torchscript_check(run: Callable[..., Any]) -> Callable[..., Any]:
    """A check of the TorchScript form: torch's "`torch.jit.script` is deprecated" warnings (and the like for
    trace, save, load) are not the backend's doing, and this flow is TorchScript's by definition."""

    @functools.wraps(run)
    def quietly(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
            return run(*args, **kwargs)

    return quietly
