"""Small stateful modules for the lowering's state tests: an accumulator and a Llama-like decoder.

The decoder has what a static KV cache decoder exports to: an embedding, RMSNorm
(pow, mean, rsqrt), RoPE (cos and sin of the positions, slicing, neg, cat),
grouped-query attention (repeat_interleave), a cache in registered buffers
updated with ``index_copy_``, a causal mask built from the positions (arange,
comparison, where) given to ``scaled_dot_product_attention``, and SwiGLU.
Sizes are tiny so that each test stays fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Accumulator(nn.Module):
    """A streaming accumulator: every call adds its input to a buffer and returns a function of the sum."""

    def __init__(self, size: int = 3) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(size))

    def forward(self, x):
        self.acc.add_(x)
        return self.acc * 2 + 1


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_len: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, kv_heads, max_len, self.head_dim))
        self.register_buffer("v_cache", torch.zeros(1, kv_heads, max_len, self.head_dim))

    def forward(self, x, cos, sin, positions, mask):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        groups = self.heads // self.kv_heads
        keys = self.k_cache.repeat_interleave(groups, dim=1)
        values = self.v_cache.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_len: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, max_len)
        self.gate = nn.Linear(dim, 2 * dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x, cos, sin, positions, mask):
        x = x + self.attn(self.norm1(x), cos, sin, positions, mask)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyDecoder(nn.Module):
    """A two-layer Llama-like decoder with a static KV cache; ``forward(tokens, positions)`` gives logits."""

    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 4, kv_heads: int = 2, max_len: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.max_len = max_len
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, kv_heads, max_len) for _ in range(2)])
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        self.register_buffer(
            "inv_freq",
            1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)),
            persistent=False,
        )

    def forward(self, tokens, positions):
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        # Causal over the whole cache: a query at position p sees the slots 0..p.
        slots = torch.arange(self.max_len)
        allowed = slots[None, :] <= positions[:, None]
        mask = torch.where(allowed, 0.0, float("-inf"))[None, None]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin, positions, mask)
        return self.head(self.norm(x))


def greedy(step, prompt: torch.Tensor, steps: int) -> list[int]:
    """Greedy decoding: ``step(tokens[1, t], positions[t])`` one token at a time after the prompt."""
    tokens: list[int] = []
    token = prompt
    position = 0
    for _ in range(steps):
        t = token.shape[1]
        logits = step(token, torch.arange(position, position + t))
        position += t
        nxt = int(logits[0, -1].argmax())
        tokens.append(nxt)
        token = torch.tensor([[nxt]])
    return tokens


class PrefillDecode(TinyDecoder):
    """Two methods sharing one cache: ``prefill`` (a prompt of dynamic length) and ``decode`` (one token).

    Each returns the last position's logits. (They call the decoder's ``forward`` through the class: the
    lowering exports a method other than ``forward`` under that name, so ``self.forward`` would recurse.)
    """

    def prefill(self, tokens, positions):
        return TinyDecoder.forward(self, tokens, positions)[:, -1]

    def decode(self, token, position):
        return TinyDecoder.forward(self, token, position)[:, -1]


class SliceAssignCache(nn.Module):
    """A cache written by slice assignment (``index_put_`` with ``None`` indices) and read by advanced indexing."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 8, 4))

    def forward(self, x, position):
        self.cache[:, :, position] = x
        seen = torch.ones(8, 8, dtype=torch.bool).tril()[position]  # the slots up to the position
        return (self.cache.sum(-1) * seen.to(torch.float32)).sum(-1), self.cache[:, :, position].clone()
