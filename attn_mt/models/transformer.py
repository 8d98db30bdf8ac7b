"""The Transformer encoder-decoder ("Attention Is All You Need", Vaswani et al. 2017): its attention
layers are attention.py's, its position schemes positions.py's.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from attn_mt.config import TransformerConfig

from .attention import AttentionWeights, CrossAttention, MultiHeadAttention, SelfAttention
from .cache import KV, KVCache
from .fast import Dropout
from .positions import SCHEMES, InAttention, Positions
from .seq2seq import Seq2Seq, init_embeddings, make_embeddings
from .variants import ACTIVATIONS, GatedFeedForward, make_norm, zero_init


class FeedForward(nn.Sequential):
    """W_2 act(x W_1) (section 3.3), dropout on the hidden features."""

    def __init__(self, d_model: int, d_ff: int, p_drop: float, activation: str = "relu") -> None:
        super().__init__(nn.Linear(d_model, d_ff), ACTIVATIONS[activation](), Dropout(p_drop),
                         nn.Linear(d_ff, d_model))


def feed_forward(cfg: TransformerConfig) -> nn.Module:
    """The paper's FeedForward with cfg.activation (ReLU, or a variant's), or SwiGLU's gated one."""
    p_drop = cfg.dropouts[2]
    if cfg.activation == "swiglu":
        return GatedFeedForward(cfg.d_model, cfg.d_ff, p_drop)
    return FeedForward(cfg.d_model, cfg.d_ff, p_drop, cfg.activation)


class Sublayer(nn.Module):
    """The residual connection around a sublayer f (section 5.4), with the norm before f (pre-norm)
    or after the sum (post-norm, the paper's): x -> `post(x, f(pre(x)))`."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.drop = Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def pre(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.norm_first else x

    def post(self, x: Tensor, y: Tensor) -> Tensor:
        if self.norm_first:
            return x + self.drop(y)
        return self.norm(x + self.drop(y))


def attention_layer(kind: type[MultiHeadAttention], cfg: TransformerConfig) -> MultiHeadAttention:
    """Self- or cross-attention, as the config shapes it."""
    return kind(d_model=cfg.d_model, n_heads=cfg.n_heads, p_drop=cfg.dropouts[1],
                impl=cfg.attention, qk_norm=cfg.qk_norm)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = attention_layer(SelfAttention, cfg)
        self.ff = feed_forward(cfg)
        self.sub = nn.ModuleList(Sublayer(cfg) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor, positions: InAttention | None = None,
                weights: AttentionWeights | None = None) -> Tensor:
        attn, ff = self.sub
        y, w = self.self_attn(attn.pre(x), mask=src_mask, positions=positions,
                              need_weights=weights is not None)
        if weights is not None:
            weights.encoder_self.append(w)
        x = attn.post(x, y)
        return ff.post(x, self.ff(ff.pre(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = attention_layer(SelfAttention, cfg)
        self.cross_attn = attention_layer(CrossAttention, cfg)
        self.ff = feed_forward(cfg)
        self.sub = nn.ModuleList(Sublayer(cfg) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor | None, src_mask: Tensor, self_kv: KV | None = None,
                cross_kv: KV | None = None, weights: AttentionWeights | None = None,
                self_mask: Tensor | None = None, positions: InAttention | None = None) -> Tensor:
        # Target padding follows every real token, so the causal mask alone keeps real queries
        # off pad keys; the loss ignores the outputs at pads.
        want = weights is not None
        attn, cross, ff = self.sub
        y, w = self.self_attn(attn.pre(x), mask=self_mask, causal=True, cache=self_kv,
                              positions=positions, need_weights=want)
        x = attn.post(x, y)
        y, c = self.cross_attn(cross.pre(x), memory, src_mask, cache=cross_kv, need_weights=want)
        x = cross.post(x, y)
        if want:
            weights.decoder_self.append(w)
            weights.cross.append(c)
        return ff.post(x, self.ff(ff.pre(x)))


class Transformer(Seq2Seq):
    """`encode(src)` once, then `decode(tgt_in, memory)` for a whole target or step by step."""

    def __init__(self, cfg: TransformerConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        self.cfg, self.pad_id, self.d_model = cfg, pad_id, cfg.d_model
        self.max_positions = cfg.max_positions
        self.src_embed, self.tgt_embed = make_embeddings(
            src_vocab=src_vocab, tgt_vocab=tgt_vocab, dim=cfg.d_model, pad_id=pad_id,
            share=shared_vocab and cfg.tie_embeddings)
        self.pos = self.position_scheme(cfg)  # the source's positions (positions.py)
        self.tgt_pos = self.pos.for_target()  # the same, unless each side learns a table
        self.drop = Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        # pre-norm stacks end with a norm; post-norm layers already end normalised
        self.enc_norm = make_norm(cfg) if cfg.norm_first else nn.Identity()
        self.dec_norm = make_norm(cfg) if cfg.norm_first else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        self.init_weights()
        if cfg.zero_init:
            zero_init(self)  # variants.py
        init_embeddings(self.src_embed, self.tgt_embed, pad_id=pad_id)
        if cfg.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def position_scheme(self, cfg: TransformerConfig) -> Positions:
        return SCHEMES[cfg.positions].from_config(cfg)

    def init_weights(self) -> None:
        """Xavier-uniform matrices, zero biases; a module that `keeps_init` (a position scheme)
        keeps the init it gave its parameters."""
        kept = {p for m in self.modules() if getattr(m, "keeps_init", False)
                for p in m.parameters()}
        for name, p in self.named_parameters():
            if p.dim() > 1 and p not in kept:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias") and p not in kept:
                nn.init.zeros_(p)

    def _embed(self, emb: nn.Embedding, pos: Positions, ids: Tensor,
               offset: int | Tensor = 0) -> Tensor:
        return self.drop(pos(emb(ids) * math.sqrt(self.d_model), offset))  # section 3.4

    def encode(self, src: Tensor, src_mask: Tensor,
               weights: AttentionWeights | None = None) -> Tensor:
        """src: (B, S) ids -> memory (B, S, D)."""
        x = self._embed(self.src_embed, self.pos, src)
        positions = self.pos.attending(0, src.size(1), src.size(1), src.device)  # None: a table's
        for layer in self.encoder:
            x = layer(x, src_mask, positions, weights)
        return self.enc_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, cache: KVCache | None = None,
               weights: AttentionWeights | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V); with `cache`, only the new positions (a cache
        that holds cross-attention's keys already needs no memory: None)."""
        offset, self_mask = (0, None) if cache is None else cache.advance(tgt_in.size(1))
        x = self._embed(self.tgt_embed, self.tgt_pos, tgt_in, offset)
        t = tgt_in.size(1)  # the last t of s self-attention keys
        s = t if cache is None else len(cache) + t
        positions = self.tgt_pos.attending(offset, t, s, tgt_in.device)
        for i, layer in enumerate(self.decoder):
            kv = (None, None) if cache is None else (cache.self_attn[i], cache.cross_attn[i])
            x = layer(x, memory, src_mask, *kv, weights, self_mask, positions)
        return self.out_proj(self.dec_norm(x))  # (B, T, V)

    def new_cache(self) -> KVCache:
        return KVCache([KV() for _ in self.decoder], [KV() for _ in self.decoder])
