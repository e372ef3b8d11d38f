"""Real-world models for the suite: torchvision classifiers, a small ViT, a Transformer text encoder.

Selected with ``--backendconf-zoo=real`` (or ``all``) and marked ``real_model``;
they run in the parity, serialization and delegation categories only (see
docs/conformance-suite.md, "Real-world models"). The vision models come from
the optional extra ``pytest-backendconf[models]`` (torchvision); every model
is randomly initialised with a seed of its own (no weights are downloaded)
and fed inputs of the shape it is used with. Each case records what it is
and where its code comes from in ``description`` and ``origin``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
import zlib
from typing import TYPE_CHECKING, Any, Callable

from pytest_backendconf.cases import ModelCase, TensorInput

if TYPE_CHECKING:
    from pytest_backendconf.suite import SuiteContext

#: The categories whose checks run on the real models (heavier ones are left to the synthetic zoo);
#: the stateful category's real model (`stateful_real_cases`) runs in that category only.
CATEGORIES = ("parity", "serialization", "delegation", "quantized", "stateful")
#: The pytest marker of every check on a real model.
MARKER = "real_model"
#: Float dtypes the real models are checked in: float32 only, to keep the run in minutes on a CPU
#: (half-precision convolutions are slow in eager PyTorch on a CPU, and the synthetic zoo covers them).
FLOAT_DTYPES = ("float32",)
#: An ImageNet-sized batch of one.
IMAGE = (TensorInput(shape=(1, 3, 224, 224)),)
#: The text encoder's vocabulary and sequence length (a BERT-style 128-token batch of two).
VOCAB, SEQUENCE = 1000, 128


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def import_torchvision() -> types.ModuleType:
    """``torchvision``, also where its compiled extension cannot load beside the installed torch.

    PyPI's torchvision wheels are built against PyPI's torch of the same
    version; beside another build of it (a CPU-only build, as in the
    project's CI) the extension ``torchvision._C`` does not load, and the
    import then fails in ``torchvision._meta_registrations`` with "operator
    torchvision::nms does not exist". The models here use none of
    torchvision's compiled operators (nms, roi_align …), so in that case the
    two modules that only register kernels for those operators are skipped
    and the import is retried. torch itself is never changed.
    """
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in list(sys.modules):
        if name == "torchvision" or name.startswith("torchvision."):
            del sys.modules[name]
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules[name] = types.ModuleType(name, "skipped: torchvision's compiled operators are not loaded")
    module = importlib.import_module("torchvision")
    module._backendconf_without_ops = True  # type: ignore[attr-defined]
    return module


def _seeded(name: str, make: Callable[[], Any]) -> Any:
    """``make()`` in eval mode with weights seeded by ``name`` and batch-norm statistics that are not an identity."""
    import torch

    from .zoo import _randomize_batch_norm

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(name.encode()))
        module = make()
    for i, bn in enumerate(m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        _randomize_batch_norm(bn, zlib.crc32(f"{name}.bn{i}".encode()))
    return module.eval()


def _torchvision_model(name: str, **kwargs: Any) -> Any:
    models = importlib.import_module("torchvision.models")
    return _seeded(name, lambda: getattr(models, name)(weights=None, **kwargs))


def _vit_tiny() -> Any:
    from importlib import import_module

    import_torchvision()
    vit = import_module("torchvision.models.vision_transformer")
    # ViT-Ti/32-like: the architecture of vit_b_32 at a twentieth of the width and a third of the depth.
    return _seeded(
        "vit_tiny",
        lambda: vit.VisionTransformer(
            image_size=224,
            patch_size=32,
            num_layers=4,
            num_heads=3,
            hidden_dim=192,
            mlp_dim=768,
            num_classes=1000,
        ),
    )


class TextEncoder:
    """Token embedding, learned positions, a 2-layer ``nn.TransformerEncoder`` and mean pooling."""

    @staticmethod
    def build() -> Any:
        import torch
        from torch import nn

        class Encoder(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tokens = nn.Embedding(VOCAB, 128)
                self.positions = nn.Parameter(torch.randn(1, SEQUENCE, 128) * 0.02)
                layer = nn.TransformerEncoderLayer(
                    d_model=128, nhead=4, dim_feedforward=512, dropout=0.0, batch_first=True, norm_first=True
                )
                # enable_nested_tensor=False: export traces the plain path, not the fused inference kernel.
                self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
                self.norm = nn.LayerNorm(128)

            def forward(self, ids):
                hidden = self.encoder(self.tokens(ids) + self.positions)
                return self.norm(hidden).mean(dim=1)

        return _seeded("text_encoder", Encoder)


def _vision(name: str, description: str, **kwargs: Any) -> ModelCase:
    return ModelCase(
        name=name,
        build=functools.partial(_build_torchvision, name, kwargs),
        inputs={"forward": IMAGE},
        float_dtypes=FLOAT_DTYPES,
        tags=(MARKER, "vision", "torchvision"),
        description=f"{description}, 1x3x224x224 input",
        origin=f"torchvision.models.{name}(weights=None) from the [models] extra; random init, seeded",
    )


def _build_torchvision(name: str, kwargs: dict[str, Any]) -> Any:
    import_torchvision()
    return _torchvision_model(name, **kwargs)


def real_cases() -> list[ModelCase]:
    """The real-world models, in the order reports list them."""
    return [
        _vision("resnet18", "ResNet-18 image classifier (residual blocks, batch norm, max/avg pool)"),
        _vision("mobilenet_v3_small", "MobileNetV3-Small (depthwise convs, squeeze-excite, hardswish)"),
        _vision("squeezenet1_1", "SqueezeNet 1.1 (fire modules, concatenation, ceil-mode max pool)"),
        _vision("shufflenet_v2_x0_5", "ShuffleNetV2 x0.5 (channel shuffle: reshape/transpose, chunk)"),
        _vision("efficientnet_b0", "EfficientNet-B0 (MBConv, SiLU, squeeze-excite, stochastic depth off in eval)"),
        ModelCase(
            name="vit_tiny",
            build=_vit_tiny,
            inputs={"forward": IMAGE},
            float_dtypes=FLOAT_DTYPES,
            tags=(MARKER, "vision", "torchvision", "attention"),
            description="Vision Transformer, tiny: 4 layers, 3 heads, width 192, 32x32 patches, 1x3x224x224 input",
            origin="torchvision.models.vision_transformer.VisionTransformer from the [models] extra; random init, seeded",
        ),
        ModelCase(
            name="text_encoder",
            build=TextEncoder.build,
            inputs={"forward": (TensorInput(shape=(2, SEQUENCE), dtype="int64", low=0, high=VOCAB - 1),)},
            float_dtypes=FLOAT_DTYPES,
            tags=(MARKER, "text", "attention"),
            description=f"text encoder: embedding, 2-layer torch.nn.TransformerEncoder (width 128, 4 heads), "
            f"mean pooling; 2x{SEQUENCE} token ids",
            origin="torch.nn.TransformerEncoder (torch itself, no extra); random init, seeded",
        ),
    ]


def zoo_keeps(ctx: SuiteContext, check: Any, zoo: str) -> bool | None:
    """Whether a generated check runs under ``--backendconf-zoo=zoo``: None to drop it, else whether it is a real model's.

    A real model's check runs only in `CATEGORIES` and never under
    ``synthetic``; under ``real``, only real models' checks run.
    """
    case = ctx.cases.get(check.case) if check.case else None
    real = (case is not None and MARKER in case.tags) or check.case in STATEFUL_REAL
    if real and check.category == "stateful":
        return True if zoo != "synthetic" else None
    if real:
        return True if zoo != "synthetic" and check.category in CATEGORIES else None
    return None if zoo == "real" else False


# --- the stateful category's real model: transformers' on-device export recipe ---------------------

#: The tiny Llama's sizes: a config and a seed, nothing downloaded.
LLAMA_CONFIG: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
#: The static cache's length, and the generation the checks run (a prompt, then greedy tokens).
LLAMA_CACHE, LLAMA_PROMPT, LLAMA_STEPS = 16, 4, 12


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def _exportable_llama() -> Any:
    """``TorchExportableModuleForDecoderOnlyLM`` around a tiny random ``LlamaForCausalLM`` (static cache)."""
    import torch

    # transformers imports torchvision when it is installed: its compiled operators may not load here.
    if torchvision_available():
        import_torchvision()
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(b"tiny_llama_hf"))
        model = LlamaForCausalLM(LlamaConfig(use_cache=True, **LLAMA_CONFIG)).eval()
    model.generation_config = GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": LLAMA_CACHE},
    )
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=LLAMA_CACHE)


def _llama_eager() -> Any:
    """The module the recipe exports (the model and its static cache in buffers), called as its program is."""
    return _exportable_llama().model


def _llama_program(dtype: str) -> Any:
    """The recipe's own export (``input_ids``, ``cache_position`` as keywords), from a fresh model."""
    import torch

    wrapper = _exportable_llama()
    wrapper.to(getattr(torch, dtype))
    return wrapper.export(input_ids=torch.tensor([[0]]), cache_position=torch.tensor([0]))


def stateful_real_cases() -> list[dict[str, Any]]:
    """The stateful category's real models, as the category's ``StatefulModel`` fields (it builds them, so
    that this module needs nothing of it): transformers' tiny Llama; none without the ``[llm]`` extra."""
    if not transformers_available():
        return []
    return [
        dict(
            name="tiny_llama_hf",
            build=_llama_eager,
            driver="hf_decoder",
            steps=LLAMA_STEPS,
            prompt=LLAMA_PROMPT,
            cache=LLAMA_CACHE,
            past_cache="raises",
            dtypes=FLOAT_DTYPES,
            vocab=LLAMA_CONFIG["vocab_size"],
            description="transformers' TorchExportableModuleForDecoderOnlyLM around a tiny random LlamaForCausalLM "
            "(2 layers, width 32, GQA 4/2 heads, static cache of 16), from the [llm] extra",
            program=_llama_program,
        )
    ]


#: The stateful category's real models by name, for `zoo_keeps` (present or not, their checks are real ones).
STATEFUL_REAL = ("tiny_llama_hf",)
