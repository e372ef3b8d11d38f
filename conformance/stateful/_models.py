"""The stateful category's models: decoders with a KV cache in buffers, and a streaming accumulator.

Each keeps its state in registered buffers and updates it in place at every
call, as on-device LLM runtimes do: `LlamaDecoder` (a static KV cache written
with ``index_copy_``), `SlidingWindowDecoder` (a cache whose write position
wraps around), `PrefillDecode` (two methods sharing one cache) and
`StreamingAccumulator` (``self.acc.add_(x)``). Sizes are tiny so that a
dozen greedy steps take milliseconds; weights are seeded by the class name
(`build`). Which model runs how (prompt length, steps, dtypes) is data, in
``[stateful]`` of ``suite.toml``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..zoo import build

__all__ = [
    "LlamaDecoder",
    "PrefillDecode",
    "SlidingWindowDecoder",
    "StreamingAccumulator",
    "build",
]

#: The decoders' sizes: a vocabulary of 64, width 32, 4 query heads sharing 2 key/value heads (GQA).
VOCAB, DIM, HEADS, KV_HEADS, HIDDEN, LAYERS = 64, 32, 4, 2, 64, 2
HEAD_DIM = DIM // HEADS


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, positions, inv_freq):
    """RoPE on ``x`` (batch, heads, tokens, head_dim) at ``positions`` (tokens,): rotate-half form."""
    angles = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(x.dtype)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query attention over a static cache (batch 1): keys and values written at ``slots``.

    ``slots`` are where the new keys go (the positions, or the positions
    modulo a sliding window); ``allowed`` (tokens, cache) says which cached
    keys each new token may attend to.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def __init__(self, cache: int) -> None:
        super().__init__()
        self.q = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.k = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.v = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, KV_HEADS, cache, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(1, KV_HEADS, cache, HEAD_DIM))

    def forward(self, x, positions, slots, allowed, inv_freq):
        tokens = x.shape[1]
        q = self.q(x).view(1, tokens, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(1, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v(x).view(1, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
        q, k = rotate(q, positions, inv_freq), rotate(k, positions, inv_freq)
        self.k_cache.index_copy_(2, slots, k)
        self.v_cache.index_copy_(2, slots, v)
        keys = self.k_cache.repeat_interleave(HEADS // KV_HEADS, dim=1)
        values = self.v_cache.repeat_interleave(HEADS // KV_HEADS, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed[None, None])
        return self.o(out.transpose(1, 2).reshape(1, tokens, DIM))


class Block(nn.Module):
    def __init__(self, cache: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(DIM)
        self.attention = Attention(cache)
        self.mlp_norm = RMSNorm(DIM)
        self.gate = nn.Linear(DIM, HIDDEN, bias=False)
        self.up = nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x, positions, slots, allowed, inv_freq):
        x = x + self.attention(self.attention_norm(x), positions, slots, allowed, inv_freq)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))  # SwiGLU


class _Decoder(nn.Module):
    """Embedding, `LAYERS` blocks, a final RMSNorm and the LM head; the cache lives in the blocks."""

    #: Cache length (positions it holds).
    CACHE = 16
    inv_freq: torch.Tensor
    cache_positions: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(self.CACHE) for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        # Constants, not state: never written, so they stay parameters of the program.
        self.register_buffer("inv_freq", 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)))
        self.register_buffer("cache_positions", torch.arange(self.CACHE))

    def decode(self, tokens, positions, slots, allowed):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, positions, slots, allowed, self.inv_freq)
        return self.head(self.norm(x))


class LlamaDecoder(_Decoder):
    """A Llama-like decoder, one token per call: logits (1, vocab) for ``token`` (1, 1) at ``position`` (1,).

    A position at or past the cache's 16 slots is out of ``index_copy_``'s
    range: eager PyTorch raises.
    """

    def forward(self, token, position):
        allowed = self.cache_positions[None, :] <= position[:, None]
        return self.decode(token, position, position, allowed)[:, -1]


class SlidingWindowDecoder(_Decoder):
    """A decoder whose 8-slot cache keeps the last 8 positions: position p writes slot p % 8.

    The cache also keeps which position each slot holds (``slot_positions``,
    int64, -1 when empty), so that the mask lets a token attend exactly to
    the last 8 positions however often the slots have wrapped around. It runs
    past any length: there is no end of the cache.
    """

    CACHE = 8
    slot_positions: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("slot_positions", torch.full((self.CACHE,), -1, dtype=torch.int64))

    def forward(self, token, position):
        slot = position.remainder(self.CACHE)
        self.slot_positions.index_copy_(0, slot, position)
        allowed = (self.slot_positions[None, :] >= 0) & (self.slot_positions[None, :] <= position[:, None])
        return self.decode(token, position, slot, allowed)[:, -1]


class PrefillDecode(_Decoder):
    """Two methods sharing one cache: ``prefill`` (a prompt of 2 to 8 tokens) and ``decode_one`` (one token).

    ``prefill(tokens)`` (1, T) writes positions 0 .. T-1 and returns the
    last position's logits; ``decode_one(token, position)`` continues from
    there. Both return logits (1, vocab).
    """

    def prefill(self, tokens):
        positions = self.cache_positions[: tokens.shape[1]]
        allowed = self.cache_positions[None, :] <= positions[:, None]
        return self.decode(tokens, positions, positions, allowed)[:, -1]

    def decode_one(self, token, position):
        allowed = self.cache_positions[None, :] <= position[:, None]
        return self.decode(token, position, position, allowed)[:, -1]


class StreamingAccumulator(nn.Module):
    """A streaming feature: each call adds its input to a running sum, and returns the running mean through a layer.

    State: ``acc`` (the sum, float) and ``count`` (calls so far, float),
    both updated with ``add_``.
    """

    acc: torch.Tensor
    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("acc", torch.zeros(1, 8))
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.acc.add_(x)
        self.count.add_(1.0)
        return torch.tanh(self.proj(self.acc / self.count))
