"""The interface every translation model implements, and the embeddings both models build alike.

A model is `encode(src)` once, then `decode(tgt_in, memory)`: for a whole teacher-forced target
in training, or a few positions at a time with a `DecoderCache` in search (Annotated Transformer's
split). Training, decoding, compare-rnn and bench see only this interface.

Tested in tests/models/test_transformer.py and tests/models/test_rnn.py (both models through it).
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor, nn

from .attention import AttentionWeights, padding_mask


class DecoderCache(Protocol):
    """What a decoder keeps between incremental calls (the Transformer's `KVCache`, the RNN's
    `RNNCache`); batch-first, so beam search can reorder it."""

    def reorder(self, index: Tensor) -> None: ...  # keep entries `index` (B',), in place


class Seq2Seq(nn.Module):
    """An encoder-decoder over token ids; subclasses define encode, decode and new_cache.

    Masks are bool, True at real tokens ("may attend"); `src_mask` is (B, 1, 1, S) for every model.
    """

    pad_id: int
    max_positions: int  # longest source and output, in tokens

    def src_mask(self, src: Tensor) -> Tensor:
        return padding_mask(src, self.pad_id)  # (B, 1, 1, S)

    def encode(self, src: Tensor, src_mask: Tensor,
               weights: AttentionWeights | None = None) -> Tensor:
        """src: (B, S) ids -> memory (B, S, D); `weights` collects the attention weights."""
        raise NotImplementedError

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               cache: DecoderCache | None = None,
               weights: AttentionWeights | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V). With `cache` (from new_cache()), `tgt_in` holds
        only the new positions and the decoder continues from the cached state."""
        raise NotImplementedError

    def new_cache(self) -> DecoderCache:
        raise NotImplementedError

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for a batch."""
        src_mask = self.src_mask(src)
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask)


def make_embeddings(*, src_vocab: int, tgt_vocab: int, dim: int, pad_id: int,
                    share: bool) -> tuple[nn.Embedding, nn.Embedding]:
    """(source, target) embeddings; one module for both when `share` (a joint vocabulary, tied)."""
    tgt = nn.Embedding(tgt_vocab, dim, padding_idx=pad_id)
    return (tgt if share else nn.Embedding(src_vocab, dim, padding_idx=pad_id)), tgt


def init_embeddings(*embeddings: nn.Embedding, pad_id: int) -> None:
    """N(0, dim^-1/2), as for tied output layers; the pad id's vector zero."""
    for emb in dict.fromkeys(embeddings):
        nn.init.normal_(emb.weight, std=emb.embedding_dim**-0.5)
        emb.weight.data[pad_id].zero_()
