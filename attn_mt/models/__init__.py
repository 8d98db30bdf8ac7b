"""Sequence-to-sequence models behind one interface, and `build_model` to choose one by config."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor, nn

from ..config import ModelConfig
from .rnn import RNNSeq2Seq
from .transformer import Transformer


class Seq2Seq(Protocol):
    """What training, decoding and benchmarking use of a model; nothing else."""

    pad_id: int
    max_positions: int

    def src_mask(self, src: Tensor) -> Tensor: ...  # (B, S) ids -> mask

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor: ...  # (B, S, D)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               cache: list[dict] | None = None) -> Tensor: ...  # (B, T, V)

    def new_cache(self) -> list[dict]: ...  # empty per-layer state for incremental decoding

    # keep rows `index` of the cache's decoder state, in place, and return the cache; cache
    # tensors are batch-first, and beam search moves rows only within one sentence's block
    def reorder_cache(self, cache: list[dict], index: Tensor) -> list[dict]: ...

    def __call__(self, src: Tensor, tgt_in: Tensor) -> Tensor: ...  # (B, T, V)


def build_model(cfg: ModelConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                shared_vocab: bool) -> nn.Module:
    """A freshly initialised model of the configured kind."""
    if cfg.kind == "transformer":
        return Transformer(cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=pad_id,
                           shared_vocab=shared_vocab)
    if cfg.kind == "rnn":
        return RNNSeq2Seq(cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=pad_id,
                          shared_vocab=shared_vocab)
    raise ValueError(f"unknown model kind {cfg.kind!r}")


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
