"""Quantization: the schemes, the reference quantizer and the quantized verdict.

Owns what the ``quantized`` category needs below the suite: the pinned
scheme names, `reference_quantizer` (written on torchao's public PT2E
quantizer API), `quantize` (``prepare_pt2e``, calibration,
``convert_pt2e``) and `judge_quantized` (errors in steps of each output's
quantization scale, SQNR against the float model); and the LLM schemes
(`LLM_SCHEMES`: torchao ``quantize_`` configs, weight-only and 8da4w) with
their verdicts per token (`judge_tokens`) and per weight group (`judge_weights`). torchao is the
``[quant]`` extra: nothing here imports it until a quantizer is asked for,
and `torchao_missing` says why it cannot be.

May import: the public surface only (torch, and torchao lazily).
"""

from ._quantizer import SCHEMES, reference_quantizer
from ._llm import LLM_SCHEMES, LlmScheme, llm_config, quantize_llm
from ._groups import (
    OFF_STEPS,
    TokenVerdict,
    WeightParts,
    WeightVerdict,
    close_per_token,
    judge_tokens,
    judge_weights,
)
from ._flow import EXTRA_NOTICE, QuantizeError, quantize, torchao_import_failure, torchao_installed, torchao_missing
from ._verdict import (
    DEQUANTIZE,
    RUNTIME_QPARAMS,
    QuantizedOutput,
    QuantizedRule,
    errors_in_steps,
    implied_step,
    judge_quantized,
    output_steps,
    sqnr_db,
    steps_off,
    within,
)

__all__ = [
    "LLM_SCHEMES",
    "LlmScheme",
    "OFF_STEPS",
    "TokenVerdict",
    "close_per_token",
    "WeightParts",
    "WeightVerdict",
    "judge_tokens",
    "judge_weights",
    "llm_config",
    "quantize_llm",
    "DEQUANTIZE",
    "EXTRA_NOTICE",
    "QuantizeError",
    "QuantizedOutput",
    "QuantizedRule",
    "RUNTIME_QPARAMS",
    "SCHEMES",
    "errors_in_steps",
    "implied_step",
    "judge_quantized",
    "output_steps",
    "quantize",
    "reference_quantizer",
    "sqnr_db",
    "steps_off",
    "torchao_import_failure",
    "torchao_installed",
    "torchao_missing",
    "within",
]
