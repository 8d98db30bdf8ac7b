"""What the Transformer's decoder keeps between steps, so that a step computes the new positions
only: each attention module's keys and values (`KV`), and the model's `KVCache` of them.

Tested in tests/models/test_transformer.py and tests/decoding/test_continuous.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KV:
    """The keys and values (B, H, L, d_k) one attention module keeps while decoding step by step."""

    k: Tensor | None = None
    v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values so far, with these (B, H, T, d_k) after them."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)  # (B, H, L+T, d_k)
        self.k, self.v = k, v
        return k, v

    def select(self, index: Tensor) -> None:
        """Keep the sentences `index` (B',) of the batch, in place (beam search)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


@dataclass
class KVCache:
    """The Transformer's `DecoderCache`, per decoder layer: self-attention keys/values of the
    positions so far, and the cross-attention keys/values of the memory (computed at the first step,
    then reused). Every sentence of the batch is at the same step.

    `decode` asks `advance` for the new positions' offset and the self-attention mask: the seam
    where decoding/continuous.py's `RunningCache` gives each sentence its own (continuous batching).
    """

    self_attn: list[KV]
    cross_attn: list[KV]

    def __len__(self) -> int:  # positions decoded so far
        return len(self.self_attn[0])

    def advance(self, t: int) -> tuple[int | Tensor, Tensor | None]:
        """Before decoding t new positions: their first position and a self-attention mask (None:
        the causal mask alone). decoding/continuous.py's cache gives one per sentence instead."""
        return len(self), None

    def reorder(self, index: Tensor) -> None:
        """Keep the entries `index` (B',) of the self-attention caches, in place (beam search).
        Cross-attention's stay: beam search moves entries only among one sentence's copies."""
        for kv in self.self_attn:
            kv.select(index)
