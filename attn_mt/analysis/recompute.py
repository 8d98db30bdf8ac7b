"""Recomputing an attention module for one query from its own weights: the five steps, every head at
once.

A forward hook (`recording`, there only while its block runs) records what the module was given and
returned; `gather` joins a pass's calls (the decoder's steps along T) into one `Call`; `recompute`
redoes, for one query: q = x W_q, k_j = c_j W_k, v_j = c_j W_v (c = x for self-attention, the
encoder's memory for cross-attention), turned by the position scheme's rotation if it has one; the
scores q . k_j; divided by sqrt(d_k), plus the scheme's bias if it has one; masked (padding, the
decoder's future) and softmaxed into weights; the weighted sum of the values; then every head's
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
import torch.nn.functional as F
from torch import Tensor

from attn_mt.models.attention import (
    CrossAttention,
    MultiHeadAttention,
    SelfAttention,
    attention,
    causal_mask,
)
from attn_mt.models.positions import InAttention, Rotation


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
    # what self-attention did with positions 0..T-1 of the queries and keys: a rotation, a bias
    positions: InAttention | None = None


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
    return Call(x, context, allowed, output, joined([c.get("positions") for c in calls], s))


def joined(steps: list[InAttention | None], s: int) -> InAttention | None:
    """The steps' positions as one pass's, of T queries over S keys: rotations joined along T, each
    step's bias (H, t, s_i) over the first s_i keys and 0 over the later ones (masked: the future).
    None where self-attention had none (cross-attention, a scheme that adds a table)."""
    done = [p for p in steps if p is not None]
    if not done:
        return None
    turns = [p.rotation for p in done if p.rotation is not None]
    rotation = Rotation(torch.cat([r.cos for r in turns], dim=-2),
                        torch.cat([r.sin for r in turns], dim=-2)) if turns else None
    biases = [F.pad(p.bias, (0, s - p.bias.size(-1))) for p in done if p.bias is not None]
    return InAttention(rotation, torch.cat(biases, dim=-2) if biases else None)


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
    scaled: Tensor  # (H, S) q . k / sqrt(d_k) (+ the position scheme's bias, if it adds one)
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
    pos, bias = call.positions, None  # self-attention's: queries and keys at 0..T-1 (S = T)
    if pos is not None and pos.rotation is not None:  # the query turned as at position `query`
        q, k = pos.rotation(q[:, None].expand(-1, k.size(1), -1))[:, query], pos.rotation(k)
    if pos is not None and pos.bias is not None:
        bias = pos.bias[..., query : query + 1, :]  # (H, 1, S)
    allowed = call.mask[row, query]  # (S,)
    steps: dict[str, Tensor] = {}
    # (H, 1, Dh), (H, 1, S): one query
    heads, weights = attention(q[:, None], k, v, allowed, trace=steps, bias=bias)
    heads, weights = heads[:, 0], weights[:, 0]
    output = attn.out_proj.weight @ heads.reshape(-1) + attn.out_proj.bias  # (D,)
    return Recomputed(q, k, v, steps["scores"][:, 0], steps["scaled"][:, 0], allowed, weights,
                      heads, output)
