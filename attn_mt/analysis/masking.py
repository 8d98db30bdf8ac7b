"""Heads by name, and switching them off: masked while a block runs, or pruned (zeroed) in the
weights.

Masking multiplies a head's features of W_o's input by 0 (a forward pre-hook on `out_proj`): its
output is dropped before W_o, exactly as if its columns of W_o were zero. Pruning writes that into
the weights: the head's rows of W_q, W_k and W_v (and their biases) and its columns of W_o become
zero; the shapes stay.

Tested in tests/analysis/test_heads.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attn_mt.models.attention import MultiHeadAttention, SelfAttention
from attn_mt.models.transformer import Transformer

from .names import head_name


@dataclass(frozen=True, order=True)
class Head:
    kind: str  # one of KINDS
    layer: int  # from 1, as in `attn-mt attention`'s figures
    head: int  # from 1

    def __str__(self) -> str:
        return head_name(self.kind, self.layer, self.head)


def attention_modules(model: Transformer) -> dict[str, list[MultiHeadAttention]]:
    """The attention modules of each kind, by layer."""
    return {"encoder": [layer.self_attn for layer in model.encoder],
            "decoder": [layer.self_attn for layer in model.decoder],
            "cross": [layer.cross_attn for layer in model.decoder]}


def all_heads(model: Transformer) -> list[Head]:
    return [Head(kind, i + 1, h + 1) for kind, mods in attention_modules(model).items()
            for i, m in enumerate(mods) for h in range(m.n_heads)]


@contextmanager
def masked(model: Transformer, heads: Iterable[Head]) -> Iterator[Transformer]:
    """Within the block the model runs without `heads`: their outputs are multiplied by 0 before
    W_o."""
    modules = attention_modules(model)
    keep: dict[MultiHeadAttention, torch.Tensor] = {}
    for h in heads:
        m = modules[h.kind][h.layer - 1]
        keep.setdefault(m, torch.ones(m.n_heads, device=m.out_proj.weight.device))[h.head - 1] = 0.0
    hooks = [m.out_proj.register_forward_pre_hook(_without(mask, m.d_k)) for m,
             mask in keep.items()]
    try:
        yield model
    finally:
        for hook in hooks:
            hook.remove()


def _without(mask: torch.Tensor, d_k: int):
    """A pre-hook on W_o whose input, the heads merged (B, T, H * d_k), keeps the heads `mask` (H,)
    keeps."""
    features = mask.repeat_interleave(d_k)  # (H * d_k,)
    return lambda module, args: (args[0] * features.to(args[0].dtype), *args[1:])


@torch.no_grad()
def prune(model: Transformer, heads: Iterable[Head]) -> None:
    """Zero each head's rows of W_q, W_k, W_v (weights and biases) and its columns of W_o, in
    place."""
    modules = attention_modules(model)
    for h in heads:
        m = modules[h.kind][h.layer - 1]
        lo, hi = (h.head - 1) * m.d_k, h.head * m.d_k
        m.out_proj.weight[:, lo:hi] = 0
        fused = [(m.qkv_proj,
                  3)] if isinstance(m, SelfAttention) else [(m.q_proj, 1), (m.kv_proj, 2)]
        for proj, parts in fused:  # [W_q; W_k; W_v] (or [W_k; W_v]) stacked by rows, D each
            for p in range(parts):
                proj.weight[p * m.d_model + lo : p * m.d_model + hi] = 0
                proj.bias[p * m.d_model + lo : p * m.d_model + hi] = 0
