"""Sequence-to-sequence models behind one interface (`Seq2Seq`), and `build_model` to choose one by config."""

from __future__ import annotations

from torch import nn

from attn_mt.config import ModelConfig

from .attention import AttentionWeights
from .rnn import RNNSeq2Seq
from .seq2seq import DecoderCache, Seq2Seq
from .transformer import Transformer

__all__ = ["AttentionWeights", "DecoderCache", "Seq2Seq", "build_model", "count_params"]


def build_model(cfg: ModelConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                shared_vocab: bool) -> Seq2Seq:
    """A freshly initialised model of the configured kind (sizes from the tokenizer: `tok.sizes()`)."""
    kinds = {"transformer": Transformer, "rnn": RNNSeq2Seq}
    if cfg.kind not in kinds:
        raise ValueError(f"unknown model kind {cfg.kind!r}")
    return kinds[cfg.kind](cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=pad_id, shared_vocab=shared_vocab)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
