"""Scaled dot-product attention and multi-head attention, written out.

Notation for tensor shapes:
    B batch, S source (key) length, T target (query) length, D d_model,
    H heads, Dh head dim (D / H), V vocabulary.

Masks are bool and True means "may attend"; they broadcast to (B, H, T, S) and mask keys
only, never queries. This is the convention of `F.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, L) ids -> (B, 1, 1, L) mask: every query may attend to the non-pad keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t: int, s: int | None = None, device: torch.device | None = None) -> Tensor:
    """(T, S) mask, True = may attend: the T queries are the last T of the S positions (S = T without a cache,
    more with one), and each sees the positions up to its own."""
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)


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


def rotate(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary positions (RoPE, Su et al. 2021): x (B, H, T, Dh) at `positions` (T,) or (B, 1, T), each pair
    (x_i, x_i+Dh/2) turned by the angle position / base^(2i/Dh), so that q . k depends on the positions'
    difference only. The angles are computed in fp32."""
    half = x.size(-1) // 2
    freq = torch.pow(base, -torch.arange(half, device=x.device, dtype=torch.float32) / half)  # (Dh/2,)
    angle = positions.to(torch.float32)[..., None] * freq  # (T, Dh/2) or (B, 1, T, Dh/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm computed in fp32 and returned in the input's dtype, as autocast treats LayerNorm (under bf16
    autocast torch's own takes a slow unfused path for a bf16 input with an fp32 gain)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), self.normalized_shape, self.weight, self.eps).type_as(x)


@dataclass
class KV:
    """Keys and values (B, H, L, Dh) one attention module keeps during incremental decoding."""

    k: Tensor | None = None
    v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def select(self, index: Tensor) -> None:
        """Keep rows `index` of the batch, in place (beam search)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


@dataclass
class AttentionWeights:
    """Attention weights collected for pictures: one (B, H, Tq, Tk) tensor per layer of each kind."""

    encoder_self: list[Tensor] = field(default_factory=list)
    decoder_self: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)


class MultiHeadAttention(nn.Module):
    """What self- and cross-attention share: H heads of Dh = D / H features, attended in parallel,
    concatenated and projected by W_o. Subclasses compute Q, K and V.

    `impl` picks the kernel: "sdpa" (F.scaled_dot_product_attention, fast) or "reference"
    (the `attention` function above, written out). Asking for the weights always takes the
    reference path, since SDPA does not return them.

    `qk_norm` RMS-normalises each head's queries and keys (a learned gain per feature, shared by the heads)
    before their dot products, so the scores cannot grow without bound (QK-norm; Dehghani et al. 2023).

    `rotary` (self-attention only) turns each head's normalised queries and keys by their positions (`rotate`).

    `head_mask` (H,), None unless set (attn_mt/analysis/masking.py sets it), multiplies each head's
    output before the heads are merged: 0 removes a head as if its columns of W_o were zero.
    """

    head_mask: Tensor | None = None  # a plain attribute, not a buffer: checkpoints never hold it

    def __init__(self, *, d_model: int, n_heads: int, dropout: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if impl not in ("sdpa", "reference"):
            raise ValueError(f"impl={impl!r}: expected 'sdpa' or 'reference'")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.impl, self.dropout = impl, dropout
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = Dropout(dropout)
        self.q_norm = RMSNorm(self.d_head) if qk_norm else nn.Identity()  # (..., Dh) -> (..., Dh)
        self.k_norm = RMSNorm(self.d_head) if qk_norm else nn.Identity()

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def _merge_heads(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Heads (B, H, T, Dh) and keys/values (B, H, S, Dh) -> output (B, T, D), weights or None."""
        p = self.dropout if self.training else 0.0
        t, s = q.size(2), k.size(2)
        # CPU training takes the explicit formula: SDPA has no fused CPU kernel with dropout (it
        # falls back to the same math with a slow Bernoulli mask), and without dropout its fused
        # kernel trained Multi30k batches 1.5x slower in bf16 (docs/performance.md).
        explicit = need_weights or self.impl == "reference" or (self.training and q.device.type == "cpu")
        weights = None
        if causal and mask is None and t == s and not explicit:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            if causal:  # with a cache, the T new queries are the last T of the S positions
                future = causal_mask(t, s, q.device)
                mask = future if mask is None else mask & future
            if explicit:
                y, weights = attention(q, k, v, mask, self.attn_dropout if p else None)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        if self.head_mask is not None:
            y = y * self.head_mask.to(y.dtype).view(1, -1, 1, 1)  # (B, H, T, Dh): masked heads give 0
        return self.out_proj(self._merge_heads(y)), (weights.detach() if need_weights else None)


class SelfAttention(MultiHeadAttention):
    """Q, K and V from the same sequence, with one fused (D -> 3D) projection [W_q; W_k; W_v]."""

    def __init__(self, *, d_model: int, n_heads: int, dropout: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False, rotary: bool = False) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, dropout=dropout, impl=impl, qk_norm=qk_norm)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.rotary = rotary

    def forward(self, x: Tensor, mask: Tensor | None = None, *, causal: bool = False, cache: KV | None = None,
                need_weights: bool = False, positions: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) -> (output (B, T, D), weights (B, H, T, past + T) if need_weights else None).

        `causal=True` adds the causal mask. With `cache`, x holds only the new positions: their
        keys and values are appended to the cached ones, and the queries attend to all of them.
        `positions` (T,) or (B, 1, T): where x's rows stand, for rotary positions (default 0..T-1).
        """
        q, k, v = (self._split_heads(y) for y in self.qkv_proj(x).chunk(3, dim=-1))  # 3 x (B, H, T, Dh)
        q, k = self.q_norm(q), self.k_norm(k)  # keys are cached normalised (and turned)
        if self.rotary:
            positions = torch.arange(x.size(1), device=x.device) if positions is None else positions
            q, k = rotate(q, positions), rotate(k, positions)
        if cache is not None:
            if cache.k is not None:
                k = torch.cat([cache.k, k], dim=2)  # (B, H, past + T, Dh)
                v = torch.cat([cache.v, v], dim=2)
            cache.k, cache.v = k, v
        return self._attend(q, k, v, mask, causal, need_weights)


class CrossAttention(MultiHeadAttention):
    """Q from the decoder, K and V from the encoder's memory, with one (D -> 2D) projection [W_k; W_v]."""

    def __init__(self, *, d_model: int, n_heads: int, dropout: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, dropout=dropout, impl=impl, qk_norm=qk_norm)
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a context (B, S, D) -> 2 x (B, H, S, Dh)."""
        k, v = self.kv_proj(context).chunk(2, dim=-1)
        return self.k_norm(self._split_heads(k)), self._split_heads(v)

    def forward(self, x: Tensor, context: Tensor, mask: Tensor | None = None, *, cache: KV | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D), context: (B, S, D) -> (output (B, T, D), weights (B, H, T, S) or None).

        With `cache`, the context's keys and values are computed once and reused.
        """
        q = self.q_norm(self._split_heads(self.q_proj(x)))  # (B, H, T, Dh)
        if cache is not None and cache.k is not None:
            k, v = cache.k, cache.v
        else:
            k, v = self.project_kv(context)  # (B, H, S, Dh)
            if cache is not None:
                cache.k, cache.v = k, v
        return self._attend(q, k, v, mask, False, need_weights)
