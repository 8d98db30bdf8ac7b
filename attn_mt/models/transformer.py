"""The Transformer encoder-decoder ("Attention Is All You Need", Vaswani et al. 2017), from our layers.

One job: the Transformer model; its attention layers are attention.py's, its position schemes positions.py's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn_mt.config import TransformerConfig

from .attention import KV, AttentionWeights, CrossAttention, Dropout, MultiHeadAttention, RMSNorm, SelfAttention
from .positions import SCHEMES, Positions, Rotation
from .seq2seq import Seq2Seq, init_embeddings, make_embeddings


class ReLUSquared(nn.Module):
    """relu(x)^2 (So et al. 2021, "Primer")."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "swish": nn.SiLU, "gelu": nn.GELU,
                                                   "relu2": ReLUSquared}


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu") -> None:
        super().__init__(nn.Linear(d_model, d_ff), ACTIVATIONS[activation](), Dropout(dropout),
                         nn.Linear(d_ff, d_model))


class GatedFeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): W_2 (silu(x W_g) * x W_1), with 2/3 of d_ff hidden features so that its three
    matrices hold as many weights as the plain layer's two."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        hidden = round(2 * d_ff / 3)
        self.up = nn.Linear(d_model, 2 * hidden)  # [W_g; W_1], fused
        self.dropout = Dropout(dropout)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        gate, value = self.up(x).chunk(2, dim=-1)  # 2 x (B, T, hidden)
        return self.down(self.dropout(F.silu(gate) * value))


def feed_forward(cfg: TransformerConfig, dropout: float) -> nn.Module:
    if cfg.activation == "swiglu":
        return GatedFeedForward(cfg.d_model, cfg.d_ff, dropout)
    return FeedForward(cfg.d_model, cfg.d_ff, dropout, cfg.activation)


def make_norm(cfg: TransformerConfig) -> nn.Module:
    """The layer normalisation of the residual stream: LayerNorm, or RMSNorm (no mean, no bias)."""
    return RMSNorm(cfg.d_model) if cfg.norm == "rms" else nn.LayerNorm(cfg.d_model)


class Sublayer(nn.Module):
    """The residual connection around a sublayer f, with the norm before f (pre-norm) or after the sum
    (post-norm): x -> `post(x, f(pre(x)))`."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def pre(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.norm_first else x

    def post(self, x: Tensor, y: Tensor) -> Tensor:
        if self.norm_first:
            return x + self.dropout(y)
        return self.norm(x + self.dropout(y))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d, h, (_, p_attn, p_act) = cfg.d_model, cfg.n_heads, cfg.dropouts
        self.self_attn = SelfAttention(d_model=d, n_heads=h, dropout=p_attn, impl=cfg.attention, qk_norm=cfg.qk_norm)
        self.ff = feed_forward(cfg, p_act)
        self.sub = nn.ModuleList(Sublayer(cfg) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor, rotation: Rotation | None = None,
                weights: AttentionWeights | None = None) -> Tensor:
        attn, ff = self.sub
        y, w = self.self_attn(attn.pre(x), mask=src_mask, rotation=rotation, need_weights=weights is not None)
        if weights is not None:
            weights.encoder_self.append(w)
        x = attn.post(x, y)
        return ff.post(x, self.ff(ff.pre(x)))


@dataclass
class KVCache:
    """The Transformer's `DecoderCache`, per decoder layer: self-attention keys/values of the
    positions so far, and the cross-attention keys/values of the memory (computed at the first step,
    then reused). Every sentence of the batch is at the same step.

    `decode` asks `advance` for the new positions' offset and the self-attention mask: the seam where
    decoding/continuous.py's `RunningCache` gives each sentence its own (continuous batching).
    """

    self_attn: list[KV]
    cross_attn: list[KV]

    def __len__(self) -> int:  # positions decoded so far (self-attention columns)
        return len(self.self_attn[0])

    def advance(self, t: int) -> tuple[int | Tensor, Tensor | None]:
        """Before decoding t new positions: their position offset and the self-attention mask; here the
        positions so far and None (the causal mask alone), a RunningCache's are (B, 1) and (B, 1, 1, L + t)."""
        return len(self), None

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) of the self-attention caches, in place (beam search).

        The cross-attention keys and values are left as they are: beam search moves rows only
        within a sentence's block of identical rows, where they are equal.
        """
        for kv in self.self_attn:
            kv.select(index)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d, h, (_, p_attn, p_act) = cfg.d_model, cfg.n_heads, cfg.dropouts
        self.self_attn = SelfAttention(d_model=d, n_heads=h, dropout=p_attn, impl=cfg.attention, qk_norm=cfg.qk_norm)
        self.cross_attn = CrossAttention(d_model=d, n_heads=h, dropout=p_attn, impl=cfg.attention,
                                         qk_norm=cfg.qk_norm)
        self.ff = feed_forward(cfg, p_act)
        self.sub = nn.ModuleList(Sublayer(cfg) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor | None, src_mask: Tensor, self_kv: KV | None = None,
                cross_kv: KV | None = None, weights: AttentionWeights | None = None,
                self_mask: Tensor | None = None, rotation: Rotation | None = None) -> Tensor:
        # Target padding sits after every real token, so the causal mask alone keeps real
        # queries off pad keys; outputs at pad positions are ignored by the loss. `self_mask`
        # (B, 1, 1, L): the cached columns of each row, when rows are at different steps.
        want = weights is not None
        attn, cross, ff = self.sub
        y, w = self.self_attn(attn.pre(x), mask=self_mask, causal=True, cache=self_kv, rotation=rotation,
                              need_weights=want)
        x = attn.post(x, y)
        y, c = self.cross_attn(cross.pre(x), memory, src_mask, cache=cross_kv, need_weights=want)
        x = cross.post(x, y)
        if want:
            weights.decoder_self.append(w)
            weights.cross.append(c)
        return ff.post(x, self.ff(ff.pre(x)))


class Transformer(Seq2Seq):
    """Encoder-decoder Transformer: `encode(src)` once, `decode(tgt_in, memory)` per step or batch."""

    def __init__(self, cfg: TransformerConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        self.cfg, self.pad_id, self.d_model = cfg, pad_id, cfg.d_model
        self.max_positions = cfg.max_positions
        self.src_embed, self.tgt_embed = make_embeddings(src_vocab=src_vocab, tgt_vocab=tgt_vocab, dim=cfg.d_model,
                                                         pad_id=pad_id, share=shared_vocab and cfg.tie_embeddings)
        self.pos = SCHEMES[cfg.positions].from_config(cfg)  # the source's positions (positions.py)
        self.tgt_pos = self.pos.for_target()  # the same, unless each side trains a table of its own
        self.dropout = Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        # pre-norm stacks end with a LayerNorm; post-norm layers already end normalised
        self.enc_norm = make_norm(cfg) if cfg.norm_first else nn.Identity()
        self.dec_norm = make_norm(cfg) if cfg.norm_first else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        if cfg.output_bias:  # (V,) fixed, as Marian's final_logits_bias: a buffer, saved, not trained
            self.register_buffer("out_bias", torch.zeros(tgt_vocab))
        self.banned = list(cfg.banned_ids)  # target ids decoders never generate (decoding/rules.BanIds)
        for name, p in self.named_parameters():
            if p.dim() > 1 and not name.endswith("pos.pe"):  # learned position tables keep their own init
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        if cfg.zero_init:  # every sublayer starts by adding nothing to the residual stream
            for m in self.modules():
                if isinstance(m, MultiHeadAttention | FeedForward | GatedFeedForward):
                    nn.init.zeros_((m.out_proj if isinstance(m, MultiHeadAttention) else m[-1]
                                    if isinstance(m, FeedForward) else m.down).weight)
        init_embeddings(self.src_embed, self.tgt_embed, pad_id=pad_id)
        if cfg.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def _embed(self, emb: nn.Embedding, pos: Positions, ids: Tensor, offset: int | Tensor = 0) -> Tensor:
        return self.dropout(pos(emb(ids) * math.sqrt(self.d_model), offset))

    def encode(self, src: Tensor, src_mask: Tensor, weights: AttentionWeights | None = None) -> Tensor:
        """src: (B, S) ids -> memory (B, S, D)."""
        x = self._embed(self.src_embed, self.pos, src)
        rotation = self.pos.rotation(0, src.size(1), src.device)  # None unless rotary
        for layer in self.encoder:
            x = layer(x, src_mask, rotation, weights)
        return self.enc_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, cache: KVCache | None = None,
               weights: AttentionWeights | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V); with `cache`, only the new positions (a cache that holds
        its cross-attention keys already, as decoding/continuous.py's, needs no memory: None)."""
        offset, self_mask = (0, None) if cache is None else cache.advance(tgt_in.size(1))
        x = self._embed(self.tgt_embed, self.tgt_pos, tgt_in, offset)
        rotation = self.tgt_pos.rotation(offset, tgt_in.size(1), tgt_in.device)  # None unless rotary
        for i, layer in enumerate(self.decoder):
            kv = (None, None) if cache is None else (cache.self_attn[i], cache.cross_attn[i])
            x = layer(x, memory, src_mask, *kv, weights, self_mask, rotation)
        logits = self.out_proj(self.dec_norm(x))  # (B, T, V)
        return logits + self.out_bias if self.cfg.output_bias else logits

    def new_cache(self) -> KVCache:
        return KVCache([KV() for _ in self.decoder], [KV() for _ in self.decoder])

    def set_attention_impl(self, impl: str) -> None:
        """Switch every attention module between "sdpa" and "reference"."""
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.impl = impl
