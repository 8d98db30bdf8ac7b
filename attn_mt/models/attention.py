"""Scaled dot-product attention and multi-head attention ("Attention Is All You Need", section 3.2).

Notation for tensor shapes:
    B batch, S source (key) length, T target (query) length, D d_model,
    H heads, d_k head dim (D / H), V vocabulary.

Masks are bool and True means "may attend"; they broadcast to (B, H, T, S) and mask keys only,
never queries. This is the convention of `F.scaled_dot_product_attention`.

`attention()` is the one statement of the math: the attention modules, their pictures and explain's
recomputation (analysis/recompute.py) call it. fast.py computes the same numbers sooner; the modules
choose it in one `if`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .cache import KV
from .fast import Dropout, RMSNorm, fused_attention, fused_is_faster
from .positions import InAttention


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, L) ids -> (B, 1, 1, L) mask: every query may attend to the non-pad keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t: int, s: int | None = None, device: torch.device | None = None) -> Tensor:
    """(T, S) mask: the T queries are the last T of the S positions (S = T without a cache, more
    with one), and each sees the positions up to its own."""
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
              drop: nn.Module | None = None, trace: dict[str, Tensor] | None = None,
              bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, also returning the weights.

    q: (B, H, T, d_k), k and v: (B, H, S, d_k), mask and a position scheme's `bias`: broadcastable
    to (B, H, T, S). Returns the output (B, H, T, d_k) and the weights (B, H, T, S). `drop` is
    applied to the weights. `trace`, when given, receives the steps before the softmax, unmasked:
    "scores" Q K^T and "scaled" Q K^T / sqrt(d_k) (+ bias).
    """
    scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
    scaled = scores / math.sqrt(q.size(-1))
    if bias is not None:
        scaled = scaled + bias
    if trace is not None:
        trace.update(scores=scores, scaled=scaled)
    if mask is not None:
        scaled = scaled.masked_fill(~mask, float("-inf"))
    weights = scaled.softmax(dim=-1)  # each query's weights over the keys sum to 1
    if drop is not None:
        weights = drop(weights)
    return weights @ v, weights


@dataclass
class AttentionWeights:
    """Attention weights collected for pictures: one (B, H, T, S) tensor per layer of each kind."""

    encoder_self: list[Tensor] = field(default_factory=list)
    decoder_self: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)


class MultiHeadAttention(nn.Module):
    """H heads of d_k = D / H features attend in parallel; their outputs are concatenated and
    projected by W_o. Subclasses compute Q, K and V (`project`).

    `impl`: "sdpa" takes fast.py's fused kernel where it is faster, "reference" always `attention`.
    `qk_norm` RMS-normalises each head's queries and keys before q . k, so the scores stay bounded
    (QK-norm; Dehghani et al. 2023).
    """

    def __init__(self, *, d_model: int, n_heads: int, p_drop: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if impl not in ("sdpa", "reference"):
            raise ValueError(f"impl={impl!r}: expected 'sdpa' or 'reference'")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.impl, self.p_drop = impl, p_drop
        self.out_proj = nn.Linear(d_model, d_model)
        self.drop = Dropout(p_drop)  # on the attention weights
        self.q_norm = RMSNorm(self.d_k) if qk_norm else nn.Identity()  # (..., d_k)
        self.k_norm = RMSNorm(self.d_k) if qk_norm else nn.Identity()

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)

    def _merge_heads(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)

    def project(self, x: Tensor, context: Tensor | None, cache: KV | None,
                positions: InAttention | None) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError  # Q (B, H, T, d_k) of x; K and V (B, H, S, d_k) of the context

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None, *,
                causal: bool = False, cache: KV | None = None, positions: InAttention | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D), context: (B, S, D) (None for self-attention) -> (B, T, D), and the
        weights (B, H, T, S) if need_weights.

        `causal` masks the future. With `cache`, x holds only the new positions. `positions`
        turns self-attention's queries and keys, or adds a bias to its scores (positions.py).
        """
        q, k, v = self.project(x, context, cache, positions)  # (B, H, T, d_k), 2 x (B, H, S, d_k)
        t, s = q.size(2), k.size(2)
        bias = None if positions is None else positions.bias  # (H, T, S), (B, H, T, S) or None
        # a cache, a mask or a bias: the future joins the mask (SDPA's is_causal takes none of them)
        if causal and not (mask is None and bias is None and t == s):
            future = causal_mask(t, s, q.device)
            mask, causal = (future if mask is None else mask & future), False
        p_drop = self.p_drop if self.training else 0.0
        if self.impl == "sdpa" and not need_weights and fused_is_faster(q, self.training):
            y, weights = fused_attention(q, k, v, mask, causal, p_drop, bias), None  # same numbers
        else:
            mask = causal_mask(t, s, q.device) if causal else mask
            y, weights = attention(q, k, v, mask, self.drop if p_drop else None, bias=bias)
        return self.out_proj(self._merge_heads(y)), (weights.detach() if need_weights else None)


class SelfAttention(MultiHeadAttention):
    """Q, K and V of one sequence, by one fused (D -> 3D) projection [W_q; W_k; W_v]."""

    def __init__(self, *, d_model: int, n_heads: int, p_drop: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, p_drop=p_drop, impl=impl,
                         qk_norm=qk_norm)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)

    def project(self, x: Tensor, context: Tensor | None, cache: KV | None,
                positions: InAttention | None) -> tuple[Tensor, Tensor, Tensor]:
        if context is not None:
            raise ValueError("self-attention attends to x itself: pass the mask by name, mask=...")
        q, k, v = (self._split_heads(y) for y in self.qkv_proj(x).chunk(3, dim=-1))
        q, k = self.q_norm(q), self.k_norm(k)  # keys are cached normalised (and turned)
        if positions is not None and positions.rotation is not None:
            q, k = positions.rotation(q), positions.rotation(k)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, past + T, d_k)
        return q, k, v


class CrossAttention(MultiHeadAttention):
    """Q from the decoder, K and V from the encoder's memory by one (D -> 2D) projection [W_k; W_v].
    With a cache, the memory's keys and values are computed once and reused."""

    def __init__(self, *, d_model: int, n_heads: int, p_drop: float = 0.0, impl: str = "sdpa",
                 qk_norm: bool = False) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, p_drop=p_drop, impl=impl,
                         qk_norm=qk_norm)
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a context (B, S, D) -> 2 x (B, H, S, d_k)."""
        k, v = self.kv_proj(context).chunk(2, dim=-1)
        return self.k_norm(self._split_heads(k)), self._split_heads(v)

    def project(self, x: Tensor, context: Tensor | None, cache: KV | None,
                positions: InAttention | None) -> tuple[Tensor, Tensor, Tensor]:
        q = self.q_norm(self._split_heads(self.q_proj(x)))  # (B, H, T, d_k)
        if cache is not None and cache.k is not None:
            return q, cache.k, cache.v
        k, v = self.project_kv(context)  # (B, H, S, d_k)
        if cache is not None:
            cache.k, cache.v = k, v
        return q, k, v
