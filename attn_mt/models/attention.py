"""Scaled dot-product attention and multi-head attention, written out; then the fast path, checked against it.

Notation for tensor shapes:
    B batch, S source (key) length, T target (query) length, D d_model,
    H heads, Dh head dim (D / H), V vocabulary.

Masks are bool and True means "may attend"; they broadcast to (B, H, T, S) and mask keys
only, never queries. This is the convention of `F.scaled_dot_product_attention`.

`attention()` is the one statement of the math: the attention modules, their pictures and explain's
recomputation (analysis/recompute.py) call it. The speed code at the end of the file (a fused kernel, a
cheaper CPU dropout) computes the same numbers faster, checked in tests/models/test_attention.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .positions import Rotation


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, L) ids -> (B, 1, 1, L) mask: every query may attend to the non-pad keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t: int, s: int | None = None, device: torch.device | None = None) -> Tensor:
    """(T, S) mask, True = may attend: the T queries are the last T of the S positions (S = T without a cache,
    more with one), and each sees the positions up to its own."""
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: nn.Module | None = None,
              trace: dict[str, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, the reference version that also returns the weights.

    q: (B, H, T, Dh), k and v: (B, H, S, Dh), mask: broadcastable to (B, H, T, S).
    Returns the output (B, H, T, Dh) and the attention weights (B, H, T, S). `trace`, when given,
    receives the steps before the softmax: "scores" Q K^T and "scaled" Q K^T / sqrt(d_k), unmasked.
    """
    scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
    scaled = scores / math.sqrt(q.size(-1))
    if trace is not None:
        trace.update(scores=scores, scaled=scaled)
    if mask is not None:
        scaled = scaled.masked_fill(~mask, float("-inf"))
    weights = scaled.softmax(dim=-1)  # each query's weights over the keys sum to 1
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


def with_future_masked(mask: Tensor | None, t: int, s: int, device: torch.device) -> Tensor:
    """`mask` and the causal mask of T queries over S keys (with a cache the T new queries are the last T)."""
    future = causal_mask(t, s, device)
    return future if mask is None else mask & future


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
    concatenated and projected by W_o. Subclasses compute Q, K and V (`project`).

    `impl` picks the kernel: "sdpa" (`fused_attention` where it is faster) or "reference" (`attention`,
    written out). Asking for the weights always takes the reference path, since SDPA does not return them.

    `qk_norm` RMS-normalises each head's queries and keys (a learned gain per feature, shared by the heads)
    before their dot products, so the scores cannot grow without bound (QK-norm; Dehghani et al. 2023).

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

    def project(self, x: Tensor, context: Tensor | None, cache: KV | None,
                rotation: Rotation | None) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError  # queries (B, H, T, Dh) of x, keys and values (B, H, S, Dh) of the context

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None, *,
                causal: bool = False, cache: KV | None = None, rotation: Rotation | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D), context: (B, S, D) (self-attention: None, x itself) -> output (B, T, D) and the
        weights (B, H, T, S) if need_weights, else None.

        `causal=True` adds the causal mask. With `cache`, x holds only the new positions, and keys and values
        come from (and go to) the cache. `rotation` turns self-attention's queries and keys (rotary positions).
        """
        q, k, v = self.project(x, context, cache, rotation)  # (B, H, T, Dh), 2 x (B, H, S, Dh)
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights or self.impl == "reference" or not fused_is_faster(q, self.training):
            if causal:
                mask = with_future_masked(mask, q.size(2), k.size(2), q.device)
            y, weights = attention(q, k, v, mask, self.attn_dropout if p else None)  # (B, H, T, Dh)
        else:
            y = fused_attention(q, k, v, mask, causal, p)
        if self.head_mask is not None:
            y = y * self.head_mask.to(y.dtype).view(1, -1, 1, 1)  # (B, H, T, Dh): masked heads give 0
        return self.out_proj(self._merge_heads(y)), (weights.detach() if need_weights else None)


class SelfAttention(MultiHeadAttention):
    """Q, K and V from the same sequence, with one fused (D -> 3D) projection [W_q; W_k; W_v]."""

    def __init__(self, *, d_model: int, n_heads: int, dropout: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, dropout=dropout, impl=impl, qk_norm=qk_norm)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)

    def project(self, x: Tensor, context: Tensor | None, cache: KV | None,
                rotation: Rotation | None) -> tuple[Tensor, Tensor, Tensor]:
        if context is not None:
            raise ValueError("self-attention attends to x itself: pass the mask by name, mask=...")
        q, k, v = (self._split_heads(y) for y in self.qkv_proj(x).chunk(3, dim=-1))  # 3 x (B, H, T, Dh)
        q, k = self.q_norm(q), self.k_norm(k)  # keys are cached normalised (and turned)
        if rotation is not None:
            q, k = rotation(q), rotation(k)
        if cache is not None:
            if cache.k is not None:
                k = torch.cat([cache.k, k], dim=2)  # (B, H, past + T, Dh)
                v = torch.cat([cache.v, v], dim=2)
            cache.k, cache.v = k, v
        return q, k, v


class CrossAttention(MultiHeadAttention):
    """Q from the decoder, K and V from the encoder's memory, with one (D -> 2D) projection [W_k; W_v].
    With a cache, the memory's keys and values are computed once and reused."""

    def __init__(self, *, d_model: int, n_heads: int, dropout: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, dropout=dropout, impl=impl, qk_norm=qk_norm)
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a context (B, S, D) -> 2 x (B, H, S, Dh)."""
        k, v = self.kv_proj(context).chunk(2, dim=-1)
        return self.k_norm(self._split_heads(k)), self._split_heads(v)

    def project(self, x: Tensor, context: Tensor | None, cache: KV | None,
                rotation: Rotation | None) -> tuple[Tensor, Tensor, Tensor]:
        q = self.q_norm(self._split_heads(self.q_proj(x)))  # (B, H, T, Dh)
        if cache is not None and cache.k is not None:
            return q, cache.k, cache.v
        k, v = self.project_kv(context)  # (B, H, S, Dh)
        if cache is not None:
            cache.k, cache.v = k, v
        return q, k, v


# The fast path: the same numbers as the reference above, sooner. Each piece is checked against the plain
# version in tests/models/test_attention.py (outputs on random inputs with masks, dropout statistics).


def fused_is_faster(q: Tensor, training: bool) -> bool:
    """Whether `fused_attention` beats `attention` here. CPU training takes the explicit formula: SDPA has no
    fused CPU kernel with dropout (it falls back to the same math with a slow Bernoulli mask), and without
    dropout its fused kernel trained Multi30k batches 1.5x slower in bf16 (docs/performance.md)."""
    return not (training and q.device.type == "cpu")


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
    """`attention`'s output (B, H, T, Dh) by F.scaled_dot_product_attention, with dropout p on the weights."""
    t, s = q.size(2), k.size(2)
    if causal and mask is None and t == s:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    if causal:
        mask = with_future_masked(mask, t, s, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper random mask on CPU.

    F.dropout on CPU draws a Bernoulli sample per element from the serial generator (about 15% of a
    training step); this draws 64 random bits per 8 elements and drops an element whose byte is below
    p * 256 (p rounded to 1/256, the scale from the rounded p: the expectation is exact), writing the mask
    in x's dtype. Other devices, torch.compile and a p that rounds to 0 or 1 use F.dropout.
    """

    def forward(self, x: Tensor) -> Tensor:
        k, n = round(self.p * 256), x.numel()
        if (not self.training or not 0 < k < 256 or x.device.type != "cpu"
                or torch.compiler.is_compiling()):
            return super().forward(x)
        bits = torch.empty((n + 7) // 8, dtype=torch.int64).random_(-(2**63), None)  # uniform 64-bit words
        keep = torch.ge(bits.view(torch.uint8)[:n].view(x.shape), k, out=torch.empty_like(x))  # 1 w.p. 1 - k/256
        return x * keep.mul_(256 / (256 - k))
