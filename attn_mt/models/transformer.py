"""The Transformer encoder-decoder ("Attention Is All You Need", Vaswani et al. 2017), from our layers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attn_mt.config import TransformerConfig

from .attention import KV, AttentionWeights, CrossAttention, Dropout, MultiHeadAttention, SelfAttention
from .seq2seq import Seq2Seq, init_embeddings, make_embeddings


class PositionalEncoding(nn.Module):
    """Sinusoidal positions (section 3.5), added to embeddings scaled by sqrt(D)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        pe = torch.zeros(max_positions, d_model)
        if not pe.is_meta:  # a shapes-only model (models.empty_model) computes nothing
            pos = torch.arange(max_positions).unsqueeze(1)  # (L, 1)
            freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            pe[:, 0::2] = torch.sin(pos * freq)
            pe[:, 1::2] = torch.cos(pos * freq)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) embeddings of positions offset..offset+T-1."""
        return x + self.pe[offset : offset + x.size(1)]


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__(nn.Linear(d_model, d_ff), nn.ReLU(), Dropout(dropout), nn.Linear(d_ff, d_model))


class Sublayer(nn.Module):
    """Residual around a sublayer with LayerNorm before it (pre-norm) or after the sum (post-norm)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.norm_first:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


def _keep(out: tuple[Tensor, Tensor | None], weights: list[Tensor] | None) -> Tensor:
    """An attention module's output; its weights appended to `weights` when collecting them."""
    y, w = out
    if weights is not None:
        weights.append(w)
    return y


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d, h, (p, p_attn, p_act) = cfg.d_model, cfg.n_heads, cfg.dropouts
        self.self_attn = SelfAttention(d_model=d, n_heads=h, dropout=p_attn, impl=cfg.attention)
        self.ff = FeedForward(d, cfg.d_ff, p_act)
        self.sub = nn.ModuleList(Sublayer(d, p, cfg.norm_first) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor, weights: AttentionWeights | None = None) -> Tensor:
        want = weights is not None
        x = self.sub[0](x, lambda y: _keep(self.self_attn(y, src_mask, need_weights=want),
                                           weights.encoder_self if want else None))
        return self.sub[1](x, self.ff)


@dataclass
class DecoderCache:
    """Per decoder layer: self-attention keys/values of the positions so far, and the cross-attention
    keys/values of the memory (computed at the first step, then reused)."""

    self_attn: list[KV]
    cross_attn: list[KV]

    def __len__(self) -> int:  # positions decoded so far
        return len(self.self_attn[0])

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
        d, h, (p, p_attn, p_act) = cfg.d_model, cfg.n_heads, cfg.dropouts
        self.self_attn = SelfAttention(d_model=d, n_heads=h, dropout=p_attn, impl=cfg.attention)
        self.cross_attn = CrossAttention(d_model=d, n_heads=h, dropout=p_attn, impl=cfg.attention)
        self.ff = FeedForward(d, cfg.d_ff, p_act)
        self.sub = nn.ModuleList(Sublayer(d, p, cfg.norm_first) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, self_kv: KV | None = None,
                cross_kv: KV | None = None, weights: AttentionWeights | None = None) -> Tensor:
        # Target padding sits after every real token, so the causal mask alone keeps real
        # queries off pad keys; outputs at pad positions are ignored by the loss.
        want = weights is not None
        x = self.sub[0](x, lambda y: _keep(self.self_attn(y, causal=True, cache=self_kv, need_weights=want),
                                           weights.decoder_self if want else None))
        x = self.sub[1](x, lambda y: _keep(self.cross_attn(y, memory, src_mask, cache=cross_kv, need_weights=want),
                                           weights.cross if want else None))
        return self.sub[2](x, self.ff)


class Transformer(Seq2Seq):
    """Encoder-decoder Transformer: `encode(src)` once, `decode(tgt_in, memory)` per step or batch."""

    def __init__(self, cfg: TransformerConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        self.cfg, self.pad_id, self.d_model = cfg, pad_id, cfg.d_model
        self.max_positions = cfg.max_positions
        self.src_embed, self.tgt_embed = make_embeddings(src_vocab=src_vocab, tgt_vocab=tgt_vocab, dim=cfg.d_model,
                                                         pad_id=pad_id, share=shared_vocab and cfg.tie_embeddings)
        self.pos = PositionalEncoding(cfg.d_model, cfg.max_positions)
        self.dropout = Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        # pre-norm stacks end with a LayerNorm; post-norm layers already end normalised
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        init_embeddings(self.src_embed, self.tgt_embed, pad_id=pad_id)
        if cfg.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        return self.dropout(self.pos(emb(ids) * math.sqrt(self.d_model), offset))

    def encode(self, src: Tensor, src_mask: Tensor, weights: AttentionWeights | None = None) -> Tensor:
        """src: (B, S) ids -> memory (B, S, D)."""
        x = self._embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, src_mask, weights)
        return self.enc_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache | None = None,
               weights: AttentionWeights | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V); with `cache`, only the new positions."""
        x = self._embed(self.tgt_embed, tgt_in, 0 if cache is None else len(cache))
        for i, layer in enumerate(self.decoder):
            kv = (None, None) if cache is None else (cache.self_attn[i], cache.cross_attn[i])
            x = layer(x, memory, src_mask, *kv, weights)
        return self.out_proj(self.dec_norm(x))

    def new_cache(self) -> DecoderCache:
        return DecoderCache([KV() for _ in self.decoder], [KV() for _ in self.decoder])

    def set_attention_impl(self, impl: str) -> None:
        """Switch every attention module between "sdpa" and "reference"."""
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.impl = impl
