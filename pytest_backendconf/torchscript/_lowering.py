"""A model case as TorchScript, lowered with ``torch._C._jit_to_backend``, saved and loaded.

Scripting comes first: it keeps the model's own source (each node's debug
handle then points at the model's line) and every method. Where
``torch.jit.script`` refuses a model (keyword-only arguments, Python
constructs TorchScript has no type for), the case is traced instead, on its
example inputs: a trace keeps only ``forward`` and freezes control flow to the
path the example took, which `Scripted.how` and `Scripted.why` say.
"""

from __future__ import annotations

import dataclasses
import io
import os
import warnings
from typing import TYPE_CHECKING, Callable

import torch

from .. import _compat
from ..backend import TorchScriptBackend

if TYPE_CHECKING:
    from torch.jit.mobile import LiteScriptModule

#: What the lowered wrapper raises when the backend's ``is_available()`` is false: the text of
#: ``codegen_backend_module`` (seed PR 53068), in ``forward`` and in ``__setstate__`` (loading).
TORCHSCRIPT_UNAVAILABLE = "Backend is not available."
#: What the lite interpreter says of a backend's debug handle saved without ``_save_mobile_debug_info``.
LITE_DEBUG_INFO_MISSING = "Debug info for handle(s):"


@dataclasses.dataclass
class Scripted:
    """A case as a ``torch.jit.ScriptModule``: ``how`` is ``script`` or ``trace``; ``why`` why it was traced."""

    module: torch.jit.ScriptModule
    how: str
    methods: tuple[str, ...]
    why: str = ""


def script_case(eager: torch.nn.Module, methods: tuple[str, ...], example: Callable[[], tuple]) -> Scripted:
    """``eager`` scripted, or traced on ``example()`` (``forward``'s inputs) where scripting fails.

    A `RuntimeError` naming both failures when neither works.
    """
    with warnings.catch_warnings():
        # "torch.jit.script is deprecated": this flow is TorchScript's by definition.
        warnings.simplefilter("ignore", DeprecationWarning)
        return _script_or_trace(eager, methods, example)


def _script_or_trace(eager: torch.nn.Module, methods: tuple[str, ...], example: Callable[[], tuple]) -> Scripted:
    try:
        return Scripted(torch.jit.script(eager), "script", tuple(methods))
    except Exception as exc:  # torch.jit.frontend raises several types; every one means "cannot script"
        why = _first_line(exc)
    if "forward" not in methods:
        raise RuntimeError(f"torch.jit.script refused it ({why}), and it has no forward to trace")
    try:
        traced = torch.jit.trace(eager, example(), check_trace=False)
    except Exception as exc:
        raise RuntimeError(f"torch.jit.script refused it ({why}); torch.jit.trace too ({_first_line(exc)})") from None
    return Scripted(traced, "trace", ("forward",), why)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:200]


def lower(
    scripted: torch.jit.ScriptModule, backend: TorchScriptBackend, methods: tuple[str, ...]
) -> torch.jit.ScriptModule:
    """``scripted`` lowered to ``backend`` (its library loaded): the ``LoweredWrapper`` module."""
    return _compat.jit_to_backend(backend.name, scripted, backend.method_compile_spec(list(methods)))


def save_load(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """``torch.jit.save`` then ``torch.jit.load`` through memory."""
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def lite_round_trip(
    module: torch.jit.ScriptModule, folder: str | os.PathLike, *, debug_info: bool = True, name: str = "model"
) -> LiteScriptModule:
    """``_save_for_lite_interpreter`` into ``folder``, then ``_load_for_lite_interpreter``."""
    path = os.path.join(os.fspath(folder), f"{name}.ptl")
    _compat.save_for_lite_interpreter(module, path, debug_info=debug_info)
    return _compat.load_for_lite_interpreter(path)
