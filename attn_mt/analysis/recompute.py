"""Recomputing an attention module for one query from its own weights: the five steps, every head at
once.

A forward hook (`recording`, there only while its block runs) records what the module was given and
returned; `gather` joins a pass's calls (the decoder's steps along T) into one `Call`; `recompute`
redoes, for one query: q = x W_q, k_j = c_j W_k, v_j = c_j W_v (c = x for self-attention, the
encoder's memory for cross-attention); the scores q . k_j; divided by sqrt(d_k); masked (padding,
the decoder's future) and softmaxed into weights; the weighted sum of the values; then every head's
output, concatenated and multiplied by W_o. The projections are redone here from the weights; the
attention itself is the model's own `attention()`, which hands back its steps before the softmax.

Tested in tests/analysis/test_explain.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from attn_mt.models.attention import (
    CrossAttention,
    MultiHeadAttention,
    SelfAttention,
    attention,
    causal_mask,
)
from attn_mt.models.positions import Rotation


@dataclass(frozen=True)
class Call:
    """What one attention module was given and returned during a forward pass (all decoder steps
    together)."""

    x: Tensor  # (B, T, D) the queries' inputs
    # (B, S, D) the keys' and values' inputs: x itself for self-attention, the memory for cross
    context: Tensor
    # (B, T, S) bool, True = may attend: padding and, in decoder self-attention, the future
    mask: Tensor
    output: Tensor  # (B, T, D) the module's own output
    # rotary positions 0..T-1 of the queries (self-attention: and keys)
    rotation: Rotation | None = None


@contextmanager
def recording(attn: MultiHeadAttention, calls: list[dict] | None = None) -> Iterator[list[dict]]:
    """Record every call of `attn` (its arguments by name and its output) while the block runs, into
    `calls`."""
    calls = [] if calls is None else calls
    signature = inspect.signature(attn.forward)

    def hook(module, args, kwargs, output) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append({**bound.arguments, "output": output[0]})

    handle = attn.register_forward_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def gather(attn: MultiHeadAttention, calls: list[dict]) -> Call:
    """One `Call` from the recorded calls of a forward pass: decoder steps are joined along T."""
    x = torch.cat([c["x"] for c in calls], dim=1)  # (B, T, D)
    output = torch.cat([c["output"] for c in calls], dim=1)
    b, t, _ = x.shape
    context = x if isinstance(attn, SelfAttention) else calls[0]["context"]  # (B, S, D)
    mask = calls[0]["mask"]
    s = context.size(1)
    allowed = (torch.ones(b, t, s, dtype=torch.bool, device=x.device) if mask is None
               else mask[:, 0].expand(b, t, s))
    if calls[0].get("causal"):  # with a cache the steps' queries are positions 0..T-1 of the keys
        allowed = allowed & causal_mask(t, s, x.device)
    rotations = [c["rotation"] for c in calls if c.get("rotation") is not None]
    # the steps' rotations as one
    rotation = Rotation(torch.cat([r.cos for r in rotations], dim=-2),
                        torch.cat([r.sin for r in rotations], dim=-2)) if rotations else None
    return Call(x, context, allowed, output, rotation)


def projections(attn: MultiHeadAttention) -> list[tuple[Tensor, Tensor]]:
    """[(W_q, b_q), (W_k, b_k), (W_v, b_v)] of a module, each weight (D, D) as nn.Linear keeps it
    (out, in)."""
    if isinstance(attn, SelfAttention):
        p = attn.qkv_proj
        return list(zip(p.weight.chunk(3), p.bias.chunk(3), strict=True))
    assert isinstance(attn, CrossAttention)
    kv = attn.kv_proj
    return [(attn.q_proj.weight, attn.q_proj.bias), *zip(kv.weight.chunk(2), kv.bias.chunk(2),
                                                         strict=True)]


@dataclass(frozen=True)
class Recomputed:
    """The five steps for one query of one batch row, every head at once (H heads, S keys, Dh =
    d_k)."""

    q: Tensor  # (H, Dh)
    k: Tensor  # (H, S, Dh)
    v: Tensor  # (H, S, Dh)
    scores: Tensor  # (H, S) q . k
    scaled: Tensor  # (H, S) q . k / sqrt(d_k)
    allowed: Tensor  # (S,) bool, False where a mask removes the key
    weights: Tensor  # (H, S) softmax over the allowed keys
    heads: Tensor  # (H, Dh) each head's output, sum_j w_j v_j
    output: Tensor  # (D,) W_o [head_1; ...; head_H] + b_o


def recompute(attn: MultiHeadAttention, call: Call, row: int, query: int) -> Recomputed:
    """Redo `attn` for query `query` of batch row `row` from its weights and the inputs in
    `call`."""
    h, dh = attn.n_heads, attn.d_k
    (wq, bq), (wk, bk), (wv, bv) = projections(attn)
    x, context = call.x[row, query], call.context[row]  # (D,), (S, D)
    # (H, Dh); q_norm, k_norm: identity unless model.qk_norm
    q = attn.q_norm((wq @ x + bq).view(h, dh))
    k = attn.k_norm((context @ wk.T + bk).view(-1, h, dh).transpose(0, 1))  # (H, S, Dh)
    v = (context @ wv.T + bv).view(-1, h, dh).transpose(0, 1)  # (H, S, Dh)
    # self-attention turned by positions: the query at `query`, keys at 0..S-1
    if call.rotation is not None:
        r = call.rotation
        q = (
            Rotation(r.cos[..., query : query + 1, :], r.sin[..., query : query + 1,
                                                             :])(q[:, None])[:, 0])
        k = call.rotation(k)
    allowed = call.mask[row, query]  # (S,)
    steps: dict[str, Tensor] = {}
    # (H, 1, Dh), (H, 1, S): one query
    heads, weights = attention(q[:, None], k, v, allowed, trace=steps)
    heads, weights = heads[:, 0], weights[:, 0]
    output = attn.out_proj.weight @ heads.reshape(-1) + attn.out_proj.bias  # (D,)
    return Recomputed(q, k, v, steps["scores"][:, 0], steps["scaled"][:, 0], allowed, weights,
                      heads, output)
