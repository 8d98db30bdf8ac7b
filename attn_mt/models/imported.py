"""Transformers in the layout of another toolkit, built from their config section's `kind`: a
MarianMT model (imports/marian.py reads its folder) is our post-norm Transformer with Marian's
sinusoid table, a fixed bias on the logits and target ids it never generates.

Tested in tests/marian/test_marian.py and tests/models/test_positions.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attn_mt.config.marian import MarianConfig

from .positions import Positions, Sinusoidal
from .transformer import Transformer


class MarianSinusoidal(Sinusoidal):
    """Marian's sinusoids: all sines first, the cosines after them, the angles pos / 10000^(2i/D)
    computed as Marian does (in float64, then cast), so that imported models translate as theirs."""

    def fill(self, pe: Tensor, pos: Tensor) -> None:
        d_model = pe.size(1)
        angle = pos.double() / torch.pow(10000.0, torch.arange(0, d_model, 2).double() / d_model)
        pe[:, : d_model // 2], pe[:, d_model // 2 :] = torch.sin(angle), torch.cos(angle)


class MarianTransformer(Transformer):
    """The Transformer with Marian's positions, its `final_logits_bias` (`out_bias` (V,): a buffer,
    saved, not trained) and `banned`, the target ids decoders never generate (decoding/rules.py)."""

    def __init__(self, cfg: MarianConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__(cfg, src_vocab=src_vocab, tgt_vocab=tgt_vocab, pad_id=pad_id,
                         shared_vocab=shared_vocab)
        self.register_buffer("out_bias", torch.zeros(tgt_vocab))
        self.banned = list(cfg.banned_ids)

    def position_scheme(self, cfg: MarianConfig) -> Positions:
        return MarianSinusoidal(cfg.d_model, cfg.max_positions)

    def decode(self, *args, **kwargs) -> Tensor:
        return super().decode(*args, **kwargs) + self.out_bias  # (B, T, V)


LAYOUTS = {"marian": MarianTransformer}  # a config section's kind -> its model
