"""The RNN baseline: a bidirectional encoder and a GRU decoder with additive attention.

"Neural Machine Translation by Jointly Learning to Align and Translate" (Bahdanau et al. 2015):
at each output step the previous decoder state s_{t-1} scores every encoder state h_j with
v^T tanh(W s_{t-1} + U h_j), the softmax of the scores weighs the h_j into a context c_t, and
s_t = GRU([E y_{t-1}; c_t], s_{t-1}). Every step needs the previous one, in the encoder and
in the decoder: n sequential steps per layer, where self-attention needs one.

Shapes as in attention.py, plus E d_embed, Hd d_hidden, A d_attn, L n_layers.
The source mask is (B, S) bool, True at real tokens ("may attend").
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..config import RNNConfig


class AdditiveAttention(nn.Module):
    """score(s, h_j) = v^T tanh(W s + U h_j) (Bahdanau et al. 2015, appendix A.1.2)."""

    def __init__(self, *, d_query: int, d_key: int, d_attn: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(d_key, d_attn, bias=False)  # U, applied once per sentence
        self.query_proj = nn.Linear(d_query, d_attn)  # W
        self.score = nn.Linear(d_attn, 1, bias=False)  # v

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """query (B, Dq), keys = key_proj(values) (B, S, A), values (B, S, Dk), mask (B, S).

        Returns the context (B, Dk) and the weights (B, S), zero at masked positions.
        """
        scores = self.score(torch.tanh(keys + self.query_proj(query)[:, None])).squeeze(-1)  # (B, S)
        weights = scores.float().masked_fill(~mask, float("-inf")).softmax(-1).to(values.dtype)
        return (weights[:, None] @ values).squeeze(1), weights  # (B, Dk), (B, S)


class RNNSeq2Seq(nn.Module):
    """Bidirectional GRU/LSTM encoder, GRU decoder with additive attention, deep output layer.

    Same interface as the Transformer: `encode(src)` once, `decode(tgt_in, memory)` for a whole
    teacher-forced target or, with a cache, step by step. The cache holds the decoder state and
    the projected keys, batch first, so beam search can reorder or repeat them along dim 0.
    """

    def __init__(self, cfg: RNNConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        self.cfg, self.pad_id = cfg, pad_id
        e, h, n = cfg.d_embed, cfg.d_hidden, cfg.n_layers
        self.tgt_embed = nn.Embedding(tgt_vocab, e, padding_idx=pad_id)
        share_src = shared_vocab and cfg.tie_embeddings
        self.src_embed = self.tgt_embed if share_src else nn.Embedding(src_vocab, e, padding_idx=pad_id)
        rnn = nn.GRU if cfg.cell == "gru" else nn.LSTM
        self.encoder = rnn(e, h, num_layers=n, dropout=cfg.dropout if n > 1 else 0.0,
                           batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(2 * h, n * h)  # s_0 from the mean encoder state
        self.attn = AdditiveAttention(d_query=h, d_key=2 * h, d_attn=cfg.d_attn)
        self.decoder = nn.ModuleList(nn.GRUCell(e + 2 * h if i == 0 else h, h) for i in range(n))
        self.pre_out = nn.Linear(h + 2 * h + e, e)  # deep output from [s_t; c_t; E y_{t-1}]
        self.out_proj = nn.Linear(e, tgt_vocab, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.last_weights: Tensor | None = None  # attention of the last decode call (B, T, S)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=e**-0.5)
            emb.weight.data[pad_id].zero_()
        if cfg.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    def src_mask(self, src: Tensor) -> Tensor:
        return src != self.pad_id  # (B, S)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src: (B, S) ids -> memory (B, S, 2Hd); padded positions are zero and never read."""
        x = self.dropout(self.src_embed(src))  # (B, S, E)
        lengths = src_mask.sum(1).cpu()
        # packing runs each sentence over its own length only, so padding cannot leak
        # into the backward direction
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return self.dropout(out)  # (B, S, 2Hd)

    def _start(self, memory: Tensor, src_mask: Tensor) -> dict:
        """Decoder state s_0 (B, L, Hd) and the projected keys (B, S, A) of a batch of memories."""
        m = src_mask.unsqueeze(-1).to(memory.dtype)  # (B, S, 1)
        mean = (memory * m).sum(1) / m.sum(1)  # (B, 2Hd)
        state = torch.tanh(self.init_state(mean)).view(memory.size(0), self.cfg.n_layers, -1)
        return {"state": state, "keys": self.attn.key_proj(memory)}

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               cache: list[dict] | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V).

        With `cache` (from new_cache(), filled by the first call), `tgt_in` holds only the new
        positions and the decoder continues from the cached state.
        """
        c = cache[0] if cache is not None and cache[0] else self._start(memory, src_mask)
        state, keys = list(c["state"].unbind(1)), c["keys"]  # L x (B, Hd), (B, S, A)
        # the values in the dtype attention computes in (bf16 under autocast): cast once here,
        # not at every step, which would also keep T copies of the memory for backward
        values = memory.to(keys.dtype)  # (B, S, 2Hd)
        emb = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        outs, weights = [], []
        for t in range(tgt_in.size(1)):  # the sequential part: step t needs s_{t-1}
            ctx, w = self.attn(state[-1], keys, values, src_mask)  # (B, 2Hd), (B, S)
            x = torch.cat([emb[:, t], ctx], dim=-1)  # (B, E + 2Hd)
            for i, cell in enumerate(self.decoder):
                state[i] = cell(x, state[i])  # (B, Hd)
                x = self.dropout(state[i])
            outs.append(torch.cat([state[-1], ctx], dim=-1))  # (B, 3Hd)
            weights.append(w)
        self.last_weights = torch.stack(weights, 1).detach()  # (B, T, S)
        if cache is not None:
            cache[0].update(state=torch.stack(state, 1), keys=keys)
        out = torch.cat([torch.stack(outs, 1), emb], dim=-1)  # (B, T, 3Hd + E)
        return self.out_proj(self.dropout(torch.tanh(self.pre_out(out))))  # (B, T, V)

    def new_cache(self) -> list[dict]:
        return [{}]

    def reorder_cache(self, cache: list[dict], index: Tensor) -> list[dict]:
        """Keep, reorder or repeat batch rows of the cache in place (beam search); returns it."""
        for layer in cache:
            for key, value in layer.items():
                layer[key] = value.index_select(0, index)
        return cache

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for a batch."""
        src_mask = self.src_mask(src)
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask)
