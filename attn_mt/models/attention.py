"""Scaled dot-product attention and multi-head attention, written out.

Notation for tensor shapes:
    B batch, S source (key) length, T target (query) length, D d_model,
    H heads, Dh head dim (D / H), V vocabulary.

Masks are bool and True means "may attend"; they broadcast to (B, H, T, S) and mask keys
only, never queries. This is the convention of `F.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, L) ids -> (B, 1, 1, L) mask: every query may attend to the non-pad keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t: int, device: torch.device | None = None) -> Tensor:
    """(T, T) mask: position i may attend to positions <= i."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
              dropout: nn.Module | None = None) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, the reference version that also returns the weights.

    q: (B, H, T, Dh), k and v: (B, H, S, Dh), mask: broadcastable to (B, H, T, S).
    Returns the output (B, H, T, Dh) and the attention weights (B, H, T, S).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)  # each query's weights over the keys sum to 1
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper random mask on CPU.

    F.dropout on CPU draws one Bernoulli sample per element from the serial generator, about 15%
    of a training step; this draws 64 random bits per 4 elements and drops an element when its
    16 bits fall below p (p rounded to 1/65536, and the scale uses the rounded p, so the
    expectation is exact). Other devices, and torch.compile, use F.dropout.
    """

    def forward(self, x: Tensor) -> Tensor:
        if (not self.training or not 0 < self.p < 1 or x.device.type != "cpu"
                or torch.compiler.is_compiling()):
            return super().forward(x)
        k, n = round(self.p * 65536), x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # uniform 64-bit words
        keep = bits.view(torch.int16)[:n].view(x.shape) >= k - 32768  # P(keep) = 1 - k / 65536
        return x * keep.to(x.dtype).mul_(65536 / (65536 - k))


class MultiHeadAttention(nn.Module):
    """Multi-head attention; self-attention when `context` is None, cross-attention otherwise.

    Q = x W_q, K = c W_k, V = c W_v; each is split into H heads of Dh = D / H features,
    every head attends independently, and the heads are concatenated and projected by W_o.
    Self-attention computes Q, K and V with one fused (D -> 3D) matmul; cross-attention
    computes K and V of the context with one (D -> 2D) matmul.
    """

    def __init__(self, *, d_model: int, n_heads: int, dropout: float = 0.0,
                 cross: bool = False, impl: str = "sdpa") -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.cross = cross
        self.impl = impl  # "sdpa" (fast) or "reference" (keeps weights in self.last_weights)
        self.dropout = dropout
        if cross:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)  # [W_k; W_v]
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)  # [W_q; W_k; W_v]
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = Dropout(dropout)
        self.last_weights: Tensor | None = None

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def _merge_heads(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a cross-attention context (B, S, D) -> 2 x (B, H, S, Dh)."""
        k, v = self.kv_proj(context).chunk(2, dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None,
                *, causal: bool = False, cache: dict | None = None) -> Tensor:
        """x: (B, T, D); context: (B, S, D) or None; returns (B, T, D).

        `causal=True` adds the causal mask. `cache` (incremental decoding) holds this layer's
        keys and values: self-attention appends the new positions to them; cross-attention
        computes the context's keys and values once and reuses them.
        """
        if self.cross:
            q = self._split_heads(self.q_proj(x))  # (B, H, T, Dh)
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = self.project_kv(context)  # (B, H, S, Dh)
                if cache is not None:
                    cache["k"], cache["v"] = k, v
        else:
            q, k, v = (self._split_heads(y) for y in self.qkv_proj(x).chunk(3, dim=-1))
            if cache is not None:
                if "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)  # (B, H, past + T, Dh)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        p = self.dropout if self.training else 0.0
        t, s = q.size(2), k.size(2)
        # PyTorch's SDPA on CPU has no fused kernel with dropout: it falls back to the same math
        # with a slow Bernoulli mask, so there the explicit formula with our Dropout is faster.
        explicit = self.impl == "reference" or (p > 0 and q.device.type == "cpu")
        if causal and mask is None and t == s and not explicit:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            if causal:  # with a cache, the T new queries are the last T of the S positions
                future = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
                mask = future if mask is None else mask & future
            if explicit:
                y, weights = attention(q, k, v, mask, self.attn_dropout if p else None)
                if self.impl == "reference":
                    self.last_weights = weights.detach()
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out_proj(self._merge_heads(y))  # (B, T, D)
