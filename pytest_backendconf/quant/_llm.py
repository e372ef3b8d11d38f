"""The LLM schemes: torchao ``quantize_`` configs as LLM decoders ship (weight-only int8/int4, 8da4w).

A scheme names one config and its group size; `llm_config` builds it
(importing torchao, the ``[quant]`` extra, only then). The weight-only
schemes dequantize their weights exactly, so a backend must match eager's
quantized model within float tolerances; the dynamic one (``8da4w``)
quantizes activations per token at run time, and is judged in steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class LlmScheme:
    """One torchao config of the ``quantized`` category's LLM schemes."""

    name: str
    #: The torchao config class, as torchao names it.
    config: str
    #: Bits of the weights (8 or 4) and the columns of a weight sharing a scale (None: one per row).
    bits: int
    group: int | None
    #: Weights with a zero point of their own (asymmetric) rather than the middle of the range.
    asymmetric: bool = False
    #: Activations quantized per token at run time (8da4w).
    dynamic: bool = False

    def describe(self) -> str:
        """The config as a user writes it, for failure texts."""
        if self.config == "Int8WeightOnlyConfig":
            granularity = "" if self.group is None else f"granularity=PerGroup({self.group})"
            return f"Int8WeightOnlyConfig({granularity})"
        mapping = ", mapping_type=MappingType.ASYMMETRIC" if self.asymmetric else ""
        if self.dynamic:
            return (
                f"Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int{self.bits}, "
                f"weight_granularity=PerGroup({self.group}))"
            )
        return f"IntxWeightOnlyConfig(weight_dtype=torch.int{self.bits}, granularity=PerGroup({self.group}){mapping})"


#: The LLM schemes, in the order checks are generated: each config with groups of 32 and 128 columns,
#: int8 per row (the config's default), and int4 with asymmetric weights (a zero point per group).
LLM_SCHEMES: dict[str, LlmScheme] = {
    s.name: s
    for s in (
        LlmScheme("int8-weight-only", "Int8WeightOnlyConfig", 8, None),
        LlmScheme("int8-weight-only-g32", "Int8WeightOnlyConfig", 8, 32),
        LlmScheme("int8-weight-only-g128", "Int8WeightOnlyConfig", 8, 128),
        LlmScheme("int4-weight-only-g32", "IntxWeightOnlyConfig", 4, 32),
        LlmScheme("int4-weight-only-g128", "IntxWeightOnlyConfig", 4, 128),
        LlmScheme("int4-weight-only-asym-g32", "IntxWeightOnlyConfig", 4, 32, asymmetric=True),
        LlmScheme("8da4w-g32", "Int8DynamicActivationIntxWeightConfig", 4, 32, dynamic=True),
        LlmScheme("8da4w-g128", "Int8DynamicActivationIntxWeightConfig", 4, 128, dynamic=True),
    )
}


def llm_config(scheme: str) -> Any:
    """torchao's config of ``scheme`` (one of `LLM_SCHEMES`); a ValueError names the schemes."""
    if scheme not in LLM_SCHEMES:
        raise ValueError(f"unknown LLM quantization scheme {scheme!r}: choose one of {', '.join(LLM_SCHEMES)}")
    from ._flow import _import_pt2e

    _import_pt2e()  # quietly, before torchao's own modules log their CUDA kernels missing
    from torchao.quantization import (
        Int8DynamicActivationIntxWeightConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
        MappingType,
    )
    from torchao.quantization.granularity import PerGroup

    found = LLM_SCHEMES[scheme]
    # torch's stubs lack the sub-byte dtypes.
    dtype = torch.int4 if found.bits == 4 else torch.int8  # type: ignore[attr-defined]
    if found.config == "Int8WeightOnlyConfig":
        return (
            Int8WeightOnlyConfig() if found.group is None else Int8WeightOnlyConfig(granularity=PerGroup(found.group))
        )
    if found.dynamic:
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=dtype, weight_granularity=PerGroup(found.group))
    mapping = MappingType.ASYMMETRIC if found.asymmetric else MappingType.SYMMETRIC
    return IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerGroup(found.group), mapping_type=mapping)


def quantize_llm(module: torch.nn.Module, scheme: str) -> torch.nn.Module:
    """``module`` (changed in place, and returned) with its linear layers quantized by ``scheme``'s config."""
    from torchao.quantization import quantize_

    config = llm_config(scheme)
    quantize_(module, config)
    return module
