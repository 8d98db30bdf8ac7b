"""The Transformer encoder-decoder ("Attention Is All You Need", Vaswani et al. 2017), from our layers."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..config import TransformerConfig
from .attention import Dropout, MultiHeadAttention, padding_mask


class PositionalEncoding(nn.Module):
    """Sinusoidal positions (section 3.5), added to embeddings scaled by sqrt(D)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        pos = torch.arange(max_positions).unsqueeze(1)  # (L, 1)
        freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_positions, d_model)
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


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d, h, p = cfg.d_model, cfg.n_heads, cfg.dropout
        self.self_attn = MultiHeadAttention(d_model=d, n_heads=h, dropout=p, impl=cfg.attention)
        self.ff = FeedForward(d, cfg.d_ff, p)
        self.sub = nn.ModuleList(Sublayer(d, p, cfg.norm_first) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sub[0](x, lambda y: self.self_attn(y, mask=src_mask))
        return self.sub[1](x, self.ff)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d, h, p = cfg.d_model, cfg.n_heads, cfg.dropout
        self.self_attn = MultiHeadAttention(d_model=d, n_heads=h, dropout=p, impl=cfg.attention)
        self.cross_attn = MultiHeadAttention(d_model=d, n_heads=h, dropout=p, cross=True, impl=cfg.attention)
        self.ff = FeedForward(d, cfg.d_ff, p)
        self.sub = nn.ModuleList(Sublayer(d, p, cfg.norm_first) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, cache: dict | None = None) -> Tensor:
        # Target padding sits after every real token, so the causal mask alone keeps real
        # queries off pad keys; outputs at pad positions are ignored by the loss.
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.setdefault("self", {}), cache.setdefault("cross", {})
        x = self.sub[0](x, lambda y: self.self_attn(y, causal=True, cache=self_cache))
        x = self.sub[1](x, lambda y: self.cross_attn(y, memory, src_mask, cache=cross_cache))
        return self.sub[2](x, self.ff)


class Transformer(nn.Module):
    """Encoder-decoder Transformer: `encode(src)` once, `decode(tgt_in, memory)` per step or batch."""

    def __init__(self, cfg: TransformerConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        self.cfg, self.pad_id, self.d_model = cfg, pad_id, cfg.d_model
        self.tgt_embed = nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=pad_id)
        share_src = shared_vocab and cfg.tie_embeddings
        self.src_embed = self.tgt_embed if share_src else nn.Embedding(src_vocab, cfg.d_model, padding_idx=pad_id)
        self.pos = PositionalEncoding(cfg.d_model, cfg.max_positions)
        self.dropout = Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        # pre-norm stacks end with a LayerNorm; post-norm layers already end normalised
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=self.d_model**-0.5)
            emb.weight.data[self.pad_id].zero_()

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    def src_mask(self, src: Tensor) -> Tensor:
        return padding_mask(src, self.pad_id)  # (B, 1, 1, S)

    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        return self.dropout(self.pos(emb(ids) * math.sqrt(self.d_model), offset))

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src: (B, S) ids -> memory (B, S, D)."""
        x = self._embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.enc_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               cache: list[dict] | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V).

        With `cache` (one dict per layer, initially empty), `tgt_in` holds only the new
        positions; earlier keys and values come from the cache.
        """
        offset = cache[0]["self"]["k"].size(2) if cache and "self" in cache[0] else 0
        x = self._embed(self.tgt_embed, tgt_in, offset)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, src_mask, None if cache is None else cache[i])
        return self.out_proj(self.dec_norm(x))

    def new_cache(self) -> list[dict]:
        return [{} for _ in self.decoder]

    def reorder_cache(self, cache: list[dict], index: Tensor) -> list[dict]:
        """Keep rows `index` (B',) of the self-attention caches, in place (beam search); returns it.

        The cross-attention keys and values are left as they are: beam search moves rows only
        within a sentence's block of identical rows, where they are equal.
        """
        for layer in cache:
            if "k" in layer.get("self", {}):
                kv = layer["self"]
                kv["k"], kv["v"] = kv["k"].index_select(0, index), kv["v"].index_select(0, index)
        return cache

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for a batch."""
        src_mask = self.src_mask(src)
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask)

    def set_attention_impl(self, impl: str) -> None:
        """Switch every attention module between "sdpa" and "reference"."""
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.impl = impl
