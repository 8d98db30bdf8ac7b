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

# the old name of positions.Sinusoidal, still imported by measure/bench.py and export/ctranslate2.py
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
class DecoderCache:
    """Per decoder layer: self-attention keys/values of the positions so far, and the cross-attention
    keys/values of the memory (computed at the first step, then reused).

    A cache from `Transformer.begin` holds rows at different steps (continuous batching, where sentences
    join and leave a running batch: decoding/continuous.py). It then also keeps each row's position, which
    self-attention columns hold its tokens (right-aligned: a row that joined late has padding on the
    left), and the source mask of its memory (padded on the right to the longest source).
    """

    self_attn: list[KV]
    cross_attn: list[KV]
    positions: Tensor | None = None  # (B,) tokens each row has decoded; None: all rows are in step
    key_mask: Tensor | None = None  # (B, L) True where column l of the self-attention cache is this row's
    memory_mask: Tensor | None = None  # (B, 1, 1, S) the source mask of the cross-attention keys

    def __len__(self) -> int:  # positions decoded so far (columns, for rows at different steps)
        return len(self.self_attn[0])

    def advance(self, t: int) -> tuple[int | Tensor, Tensor | None]:
        """Before decoding t new positions: their position offset (an int, or (B, 1) one per row) and the
        self-attention mask (None, or (B, 1, 1, L + t)); counts them as decoded."""
        if self.positions is None:
            return len(self), None
        offset = self.positions[:, None]
        self.positions = self.positions + t
        self.key_mask = torch.cat([self.key_mask, self.key_mask.new_ones(len(offset), t)], dim=1)
        return offset, self.key_mask[:, None, None, :]

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) of the self-attention caches, in place (beam search).

        The cross-attention keys and values are left as they are: beam search moves rows only
        within a sentence's block of identical rows, where they are equal.
        """
        for kv in self.self_attn:
            kv.select(index)
        if self.positions is not None:
            self.positions, self.key_mask = self.positions[index], self.key_mask[index]

    def select(self, index: Tensor) -> None:
        """Keep rows `index` of everything (rows that leave a running batch, beams that are copied), then
        drop the self-attention columns and source positions no row kept uses."""
        self.reorder(index)
        for kv in self.cross_attn:
            kv.select(index)
        self.memory_mask = self.memory_mask[index]
        used = self.key_mask.any(0)  # (L,) columns some row holds; they end at the last column
        first = int(used.int().argmax()) if bool(used.any()) else used.numel()
        source = self.memory_mask.flatten(1).any(0)  # (S,)
        last = source.numel() - int(source.flip(0).int().argmax()) if bool(source.any()) else 0
        self.key_mask, self.memory_mask = self.key_mask[:, first:], self.memory_mask[..., :last]
        for kv in self.self_attn:
            kv.k, kv.v = kv.k[:, :, first:], kv.v[:, :, first:]
        for kv in self.cross_attn:
            kv.k, kv.v = kv.k[:, :, :last], kv.v[:, :, :last]

    def join(self, other: DecoderCache) -> None:
        """Append the rows of `other` (both from `Transformer.begin`) after these: self-attention columns
        right-aligned (the shorter padded on the left), sources padded on the right."""
        cols = max(len(self), len(other))
        src = max(self.memory_mask.size(-1), other.memory_mask.size(-1))

        def cat(a: Tensor, b: Tensor, pad: Callable[[Tensor], tuple[int, ...]]) -> Tensor:
            # zeros, or False; only the shorter is padded (the running batch's caches are copied once, by cat)
            return torch.cat([F.pad(x, gap, value=False) if any(gap := pad(x)) else x for x in (a, b)])

        for mine, theirs in zip(self.self_attn, other.self_attn, strict=True):  # (B, H, L, Dh): pad L on the left
            mine.k, mine.v = (cat(x, y, lambda t: (0, 0, cols - t.size(2), 0)) for x, y in
                              ((mine.k, theirs.k), (mine.v, theirs.v)))
        for mine, theirs in zip(self.cross_attn, other.cross_attn, strict=True):  # (B, H, S, Dh): S on the right
            mine.k, mine.v = (cat(x, y, lambda t: (0, 0, 0, src - t.size(2))) for x, y in
                              ((mine.k, theirs.k), (mine.v, theirs.v)))
        self.key_mask = cat(self.key_mask, other.key_mask, lambda t: (cols - t.size(1), 0))
        self.memory_mask = cat(self.memory_mask, other.memory_mask, lambda t: (0, src - t.size(-1)))
        self.positions = torch.cat([self.positions, other.positions])


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

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache | None = None,
               weights: AttentionWeights | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V); with `cache`, only the new positions (a cache from
        `begin` has its cross-attention keys already: memory may be None, src_mask is its memory_mask)."""
        offset, self_mask = (0, None) if cache is None else cache.advance(tgt_in.size(1))
        x = self._embed(self.tgt_embed, self.tgt_pos, tgt_in, offset)
        rotation = self.tgt_pos.rotation(offset, tgt_in.size(1), tgt_in.device)  # None unless rotary
        for i, layer in enumerate(self.decoder):
            kv = (None, None) if cache is None else (cache.self_attn[i], cache.cross_attn[i])
            x = layer(x, memory, src_mask, *kv, weights, self_mask, rotation)
        logits = self.out_proj(self.dec_norm(x))  # (B, T, V)
        return logits + self.out_bias if self.cfg.output_bias else logits

    def new_cache(self) -> DecoderCache:
        return DecoderCache([KV() for _ in self.decoder], [KV() for _ in self.decoder])

    def begin(self, src: Tensor) -> DecoderCache:
        """Encode new sentences src (B, S) for a running batch: a cache of B rows at position 0, with the
        cross-attention keys and values of their memory computed once (rows join others with `join`)."""
        src_mask = self.src_mask(src)  # (B, 1, 1, S)
        memory = self.encode(src, src_mask)  # (B, S, D)
        cross = [KV(*layer.cross_attn.project_kv(memory)) for layer in self.decoder]
        b, h, dh = src.size(0), self.cfg.n_heads, self.d_model // self.cfg.n_heads
        empty = memory.new_zeros(b, h, 0, dh)  # (B, H, 0, Dh): nothing decoded yet
        return DecoderCache([KV(empty, empty) for _ in self.decoder], cross,
                            positions=torch.zeros(b, dtype=torch.long, device=src.device),
                            key_mask=torch.zeros(b, 0, dtype=torch.bool, device=src.device), memory_mask=src_mask)

    def set_attention_impl(self, impl: str) -> None:
        """Switch every attention module between "sdpa" and "reference"."""
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.impl = impl
