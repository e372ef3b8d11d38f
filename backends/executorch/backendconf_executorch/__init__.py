"""An ExecuTorch backend for pytest-backendconf: the XNNPACK delegate on ExecuTorch's runtime.

``preprocess`` lowers each method's program with ExecuTorch's own flow
(``to_edge_transform_and_lower`` with the XNNPACK partitioner, then
``to_executorch``) to a ``.pte`` and checks that the runtime can load it
(``lowering``, host only). ``compile`` loads the ``.pte`` with
``executorch.runtime`` and ``execute`` runs it (``runtime``, target side).
Nodes XNNPACK does not take run on ExecuTorch's portable CPU kernels.
Check it with::

    pytest --backend=executorch --backendconf-known-failures=backends/executorch/known-failures.toml

Compile spec (per method): ``{"partitioners": ["xnnpack"]}`` (the default)
or ``{"partitioners": []}`` for portable kernels only.

This module stays importable without ExecuTorch (``is_available`` then says
why): it imports ``lowering`` only inside ``preprocess`` and ``runtime``
only where a method is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import pytest_backendconf as bc
from pytest_backendconf.vendor import EngineBackend

__version__ = "0.1.0"
__all__ = ["ExecuTorchBackend"]

#: The recipe that installs ExecuTorch without changing torch (README.md, "Install").
INSTALL_HINT = (
    "pip install --no-deps executorch==1.5.1 torchao==0.18.0 && "
    "pip install numpy ruamel.yaml flatbuffers tabulate packaging pyyaml"
)


class ExecuTorchBackend(EngineBackend):
    """The delegate-backend protocol (docs/writing-a-backend.md) over ExecuTorch's runtime."""

    name = "executorch"
    version = __version__
    runtime_module = "backendconf_executorch.runtime"
    capabilities = bc.Capabilities(
        # None: which ops XNNPACK takes, and which the portable kernels cover,
        # move with ExecuTorch's version; the suite finds out by trying, and
        # preprocess rejects what the runtime cannot load at the FX node.
        supported_ops=None,
        dtypes=None,
        # float32 keeps the suite's defaults. XNNPACK computes float16 in
        # float16 (and ExecuTorch's portable kernels round bfloat16 per
        # step), where eager computes each op in float32 and rounds once:
        # results differ by one or two ulps (float16 exp_log: 2 ulps at 4-8),
        # and near cancellation one ulp of an operand is all of a small
        # result, hence an absolute term (bfloat16 linear: 6e-4 at 0.02).
        # The same pairs as the onnxruntime backend, float16's rtol one ulp
        # wider. See README.md, "Declared tolerances".
        tolerances={torch.float16: (3e-3, 1e-3), torch.bfloat16: (1.6e-2, 4e-3)},
        # Not executorch.exir: executorch.runtime imports it (the target
        # check found that), so only the partitioner and our lowering are
        # host-only.
        host_only_modules=(
            "backendconf_executorch.lowering",
            "executorch.backends.xnnpack.partition",
        ),
        # ExecuTorch's runtime package imports torch._dynamo (through its
        # pybindings' helpers) without tracing anything.
        target_runtime_modules=("torch._dynamo",),
        # One ExecuTorch Method owns its planned memory: calls of one method
        # take turns on a lock (runtime.CompiledMethod), so concurrent
        # callers are safe.
        thread_safe=True,
        fault_injection=True,
        # batch_ops: every lowering runs ExecuTorch's whole flow (edge dialect, XNNPACK
        # partitioning, the .pte program: a second or more however small the program): the ops checks
        # share lowerings (docs/conformance-suite.md, "Batched operator checks").
        batch_ops=True,
    )

    def preprocess(self, program: Any, compile_spec: dict, debug_handles: Mapping[Any, int]) -> bytes:
        """Lower ``program`` to a ``.pte`` blob (host only; see ``lowering``)."""
        from .lowering import lower_program  # host only: never imported on the target

        return lower_program(program, compile_spec, debug_handles, self)

    def quantizer(self, scheme: str) -> Any:
        """XNNPACK's own PT2E quantizer for a scheme of the ``quantized`` category (None: XNNPACK has none).

        The programs it quantizes are what XNNPACK's partitioner takes into its
        int8 kernels: symmetric int8, per tensor or per channel, static or
        dynamic (host only, like lowering).
        """
        configs = {
            "int8-static-per-tensor": {"is_per_channel": False},
            "int8-static-per-channel": {"is_per_channel": True},
            "int8-dynamic": {"is_per_channel": True, "is_dynamic": True},
        }
        if scheme not in configs:
            return None
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(**configs[scheme]))

    @staticmethod
    def _probe() -> str:
        """Available when ExecuTorch's runtime imports here, with XNNPACK."""
        try:
            from executorch.runtime import Runtime

            runtime = Runtime.get()
        except Exception as exc:  # ImportError, or a native library that does not load
            text = f"{type(exc).__name__}: {exc}"
            if "_C" in str(exc) or "flatbuffers" in str(exc):
                # ExecuTorch reports a missing Python dependency of its pybindings
                # (flatbuffers, most often) as a missing prebuilt extension.
                text += " (this message also appears when flatbuffers is not installed)"
            return f"ExecuTorch's runtime cannot be imported ({text}); {INSTALL_HINT}"
        try:
            backends = runtime.backend_registry.registered_backend_names
        except Exception as exc:
            return f"ExecuTorch's backend registry cannot be read: {exc}"
        if "XnnpackBackend" not in backends:
            return f"ExecuTorch's runtime has no XnnpackBackend (it has {', '.join(backends) or 'none'})"
        return ""
