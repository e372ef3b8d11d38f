"""PT2E quantization of one exported method: prepare, calibrate, convert.

torchao is imported here only, and only when a model is quantized: the
suite runs without it (the ``quantized`` category is then skipped with
`EXTRA_NOTICE`).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Iterable

import torch

#: The one-line notice of a run without torchao; it names the extra that installs it.
EXTRA_NOTICE = (
    "quantized: skipped, torchao is not installed (pip install 'pytest-backendconf[quant]' installs the pinned release)"
)


class QuantizeError(RuntimeError):
    """Quantizing a model failed (the quantizer's annotation, calibration or conversion raised)."""


def torchao_missing() -> str | None:
    """Why torchao's PT2E API cannot be imported here (None: it can). Imports torchao (seconds)."""
    try:
        _import_pt2e()
    except QuantizeError as exc:
        return f"{type(exc.__cause__).__name__}: {exc.__cause__}"
    return None


def torchao_installed() -> bool:
    """Whether a torchao package is installed, found without importing it.

    The suite decides at collection whether the ``quantized`` category exists. Importing
    torchao there took about 2 s of CPU in every pytest process, xdist worker and backend host,
    most of which never quantize anything; the import now happens in the first check that does
    (`quantize`), and an installed torchao that fails to import fails those checks by name.
    """
    try:
        return importlib.util.find_spec("torchao") is not None
    except (ImportError, ValueError):  # a broken parent entry in sys.modules
        return False


def torchao_import_failure(exc: ImportError) -> str:
    """What to say when an installed torchao does not import, and how to fix it."""
    return (
        f"torchao is installed but its PT2E API does not import ({type(exc).__name__}: {exc}); install "
        "the release the [quant] extra pins: pip install 'pytest-backendconf[quant]'"
    )


def _import_pt2e() -> Any:
    # torchao logs, at import, that its CUDA and mxfp8 kernels did not load: true and
    # harmless on a CPU build, and noise in every captured log of the suite.
    # torch's pytree logs a deprecation notice about one of torchao's enums, too.
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        from torchao.quantization.pt2e import quantize_pt2e
    except ImportError as exc:  # installed (the category exists) but broken: the checks say so
        raise QuantizeError(torchao_import_failure(exc)) from exc
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    return quantize_pt2e


def quantize(
    graph_module: torch.fx.GraphModule, quantizer: Any, calibration: Iterable[tuple[tuple, dict]]
) -> torch.fx.GraphModule:
    """``graph_module`` (an exported program's ``.module()``, consumed) quantized by ``quantizer``.

    Observers are inserted (``prepare_pt2e``), fed every ``(args, kwargs)`` of
    ``calibration``, and the model converted (``convert_pt2e``) to a graph
    module whose float ops sit between ``quantized_decomposed`` quantize and
    dequantize nodes; the caller exports it again.
    """
    pt2e = _import_pt2e()
    try:
        prepared = pt2e.prepare_pt2e(graph_module, quantizer)
        with torch.no_grad():
            for args, kwargs in calibration:
                prepared(*args, **kwargs)
        return pt2e.convert_pt2e(prepared)
    except Exception as exc:
        raise QuantizeError(
            f"{type(quantizer).__name__} could not quantize the model: {type(exc).__name__}: {exc}"
        ) from exc
