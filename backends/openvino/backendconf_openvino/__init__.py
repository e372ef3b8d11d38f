"""An OpenVINO backend for pytest-backendconf: torch.export programs on OpenVINO's CPU plugin.

``preprocess`` converts each method's program with OpenVINO's PyTorch
frontend (what ``openvino.convert_model(exported_program)`` does, with the
program's static shapes pinned) and stores the IR (``.xml`` and ``.bin``)
with a table from IR layers to debug handles (``conversion``, host only).
``compile`` reads the IR and compiles it on ``"CPU"`` with an explicit
inference precision, and ``execute`` runs it (``runtime``, target side:
openvino's runtime, numpy and torch only). Check it with::

    pytest --backend=openvino --backendconf-known-failures=backends/openvino/known-failures.toml

Compile spec (per method): ``{"inference_precision": "f32" | "bf16" | "f16"}``
overrides the precision (default: float32 for every floating dtype, see
``conversion.PRECISION_BY_DTYPE``).

This module stays importable without openvino (``is_available`` then says
why): it imports ``conversion`` only inside ``preprocess`` and ``runtime``
only where a model is compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest_backendconf as bc
from pytest_backendconf.vendor import EngineBackend

__version__ = "0.1.0"
__all__ = ["OpenVinoBackend"]

#: The recipe that installs OpenVINO beside the torch you have (its PyTorch
#: frontend imports ``packaging``, which the wheel does not declare).
INSTALL_HINT = "pip install openvino==2026.4.1 packaging"


class OpenVinoBackend(EngineBackend):
    """The delegate-backend protocol (docs/writing-a-backend.md) over OpenVINO's CPU plugin."""

    name = "openvino"
    version = __version__
    runtime_module = "backendconf_openvino.runtime"
    capabilities = bc.Capabilities(
        # None: the frontend's coverage moves with OpenVINO's version; the
        # suite finds out by trying, and preprocess rejects at the FX node.
        supported_ops=None,
        dtypes=None,
        # Every floating program runs with INFERENCE_PRECISION_HINT f32
        # (conversion.PRECISION_BY_DTYPE): float16 and bfloat16 programs keep
        # their dtypes at the inputs, outputs and weights and compute in
        # float32 in between, so they are at least as accurate as eager
        # (which rounds after every op) and the suite's defaults apply.
        tolerances=None,
        # batch_ops: every lowering runs OpenVINO's frontend, its conversion passes and a
        # CPU-plugin compile (0.35-0.5 s of CPU each, however small the program), so the
        # ops checks share their lowerings; outcomes stay per check.
        batch_ops=True,
        host_only_modules=(
            "backendconf_openvino.conversion",
            # OpenVINO's PyTorch frontend (its FX decoder and decompositions)
            # and the conversion API. `import openvino` tries the latter and
            # goes on without `convert_model` when it cannot be imported.
            "openvino.frontend.pytorch",
            "openvino.tools.ovc",
        ),
        # One InferRequest per method, calls taking turns on its lock.
        thread_safe=True,
        fault_injection=True,
    )

    def preprocess(self, program: Any, compile_spec: dict, debug_handles: Mapping[Any, int]) -> bytes:
        """Convert ``program`` to an IR blob (host only; see ``conversion``)."""
        from .conversion import convert_program  # host only: never imported on the target

        return convert_program(program, compile_spec, debug_handles)

    def accepts_blob_version(self, version: str) -> bool:
        """Blobs of the same major release, up to this minor (a newer minor may write what this cannot run)."""
        from pytest_backendconf.backend import same_major_not_newer

        return same_major_not_newer(version, self.version)

    @staticmethod
    def _probe() -> str:
        """Available when openvino imports and offers the CPU device."""
        try:
            import openvino  # noqa: F401  (before the cached Core: a missing openvino is found here)

            from .runtime import core

            devices = core().available_devices
        except Exception as exc:  # ImportError, or a native library that does not load
            return f"openvino cannot be imported ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        if "CPU" not in devices:
            return f"openvino offers no CPU device (it has {', '.join(devices) or 'none'})"
        return ""
