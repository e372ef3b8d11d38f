"""An ONNX Runtime backend for pytest-backendconf: torch.export programs run by a real engine.

``preprocess`` exports each method's program to ONNX with PyTorch's own
exporter (``torch.onnx``, the ``ExportedProgram`` path) and records, for
every ONNX node, the debug handle of the FX node it came from (``exporter``,
host only). ``compile`` creates an ``onnxruntime.InferenceSession`` on the
CPU provider per method and ``execute`` runs it (``runtime``, target side:
onnxruntime, numpy and torch only). Check it with::

    pytest --backend=onnxruntime

This module stays importable without onnxruntime (``is_available`` then
says why) and without the exporter: it imports ``exporter`` only inside
``preprocess`` and ``runtime`` only where a session is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import pytest_backendconf as bc
from pytest_backendconf.vendor import EngineBackend

__version__ = "0.1.0"
__all__ = ["OnnxRuntimeBackend"]

PROVIDER = "CPUExecutionProvider"


class OnnxRuntimeBackend(EngineBackend):
    """The delegate-backend protocol (docs/backend-contract.md#the-four-hooks) over ONNX Runtime's CPU provider."""

    name = "onnxruntime"
    version = __version__
    runtime_module = "backendconf_onnxruntime.runtime"
    capabilities = bc.Capabilities(
        # None: the exporter's and ONNX Runtime's coverage move with their
        # versions, so the suite finds out by trying (rejections are reported
        # as unsupported, at the FX node).
        supported_ops=None,
        dtypes=None,
        # float32 keeps the suite's defaults. float16 and bfloat16 are computed
        # in float32 and rounded per op, as eager does; ONNX Runtime's float32
        # kernels (exp, erf, tanh, GEMM order) differ from eager's in the last
        # float32 bits, which after rounding moves a result by one ulp now and
        # then, and eager itself differs by one ulp between its vectorized and
        # scalar loops. Near cancellation (a - b with a ~ b) one ulp of an
        # operand is all of the result, hence an absolute term. See README.md.
        tolerances={
            torch.float16: (2e-3, 1e-3),
            torch.bfloat16: (1.6e-2, 4e-3),
            # A sum of batched matrix products, accumulated in another order
            # than eager's: seen 1e-4 relative in float32 (the ops category).
            "aten.addbmm.default": {torch.float32: (2e-4, 1e-5)},
        },
        host_only_modules=(
            "backendconf_onnxruntime.exporter",
            "backendconf_onnxruntime.passes",
            "torch.onnx",
            "onnxscript",
            "onnx_ir",
            "onnx",
        ),
        # InferenceSession.run may be called concurrently; execute keeps its
        # state local.
        thread_safe=True,
        fault_injection=True,
        # batch_ops: every lowering re-runs torch.export's decompositions and builds two
        # ONNX Runtime sessions (about 0.3 s however small the program): the ops checks share lowerings,
        # and a rejection names its own node (docs/conformance-suite.md, "Batched operator checks").
        batch_ops=True,
    )

    def preprocess(self, program: Any, compile_spec: dict, debug_handles: Mapping[Any, int]) -> bytes:
        """Export ``program`` to an ONNX blob (host only; see ``exporter``)."""
        from .exporter import export_program  # host only: never imported on the target

        return export_program(program, compile_spec, debug_handles)

    def accepts_blob_version(self, version: str) -> bool:
        """Blobs of the same major release, up to this minor (a newer minor may write what this cannot run)."""
        from pytest_backendconf.backend import same_major_not_newer

        return same_major_not_newer(version, self.version)

    @staticmethod
    def _probe() -> str:
        """Available when onnxruntime imports and offers the CPU execution provider."""
        try:
            import onnxruntime
        except Exception as exc:  # ImportError, or a broken native library
            return f"onnxruntime cannot be imported ({type(exc).__name__}: {exc}); pip install onnxruntime"
        try:
            providers = onnxruntime.get_available_providers()
        except Exception as exc:
            return f"onnxruntime.get_available_providers() failed: {exc}"
        if PROVIDER not in providers:
            return (
                f"onnxruntime {onnxruntime.__version__} offers no {PROVIDER} (it has {', '.join(providers) or 'none'})"
            )
        return ""
