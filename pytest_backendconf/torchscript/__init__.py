"""The TorchScript flow: a C++ backend behind ``torch._C._jit_to_backend`` (`TorchScriptBackend`).

Loading its library, scripting (or tracing) a model case, lowering it,
saving and loading it with ``torch.jit`` and the lite interpreter, and the
simulated target that loads those files in a fresh process.

May import: target, lowering and the layers below.
"""

from ._library import backend_is_available, load_library, loaded_libraries
from ._lowering import (
    TORCHSCRIPT_UNAVAILABLE,
    LITE_DEBUG_INFO_MISSING,
    Scripted,
    lite_round_trip,
    lower,
    save_load,
    script_case,
)
from ._target import fingerprint, lower_in_fresh_process, run_torchscript_target

__all__ = [
    "LITE_DEBUG_INFO_MISSING",
    "Scripted",
    "TORCHSCRIPT_UNAVAILABLE",
    "backend_is_available",
    "fingerprint",
    "lower_in_fresh_process",
    "lite_round_trip",
    "load_library",
    "loaded_libraries",
    "lower",
    "run_torchscript_target",
    "save_load",
    "script_case",
]
