"""The RNN baseline: a bidirectional encoder and a GRU decoder with additive attention.

"Neural Machine Translation by Jointly Learning to Align and Translate" (Bahdanau et al. 2015):
at each output step the previous decoder state s_{t-1} scores every encoder state h_j with
v^T tanh(W s_{t-1} + U h_j), the softmax of the scores weighs the h_j into a context c_t, and
s_t = GRU([E y_{t-1}; c_t], s_{t-1}). Every step needs the previous one, in the encoder and
in the decoder: n sequential steps per layer, where self-attention needs one.

Shapes as in attention.py, plus E d_embed, Hd d_hidden, A d_attn, L n_layers.
The source mask is (B, 1, 1, S) bool, True at real tokens ("may attend"), as for the Transformer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attn_mt.config import RNNConfig

from .attention import AttentionWeights
from .seq2seq import Seq2Seq, init_embeddings, make_embeddings


class AdditiveAttention(nn.Module):
    """score(s, h_j) = v^T tanh(W s + U h_j) (Bahdanau et al. 2015, appendix A.1.2)."""

    def __init__(self, *, d_query: int, d_key: int, d_attn: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(d_key, d_attn, bias=False)  # U, applied once per sentence
        self.query_proj = nn.Linear(d_query, d_attn)  # W
        self.score = nn.Linear(d_attn, 1, bias=False)  # v

    def forward(self, query: Tensor, keys: Tensor, values: Tensor,
                mask: Tensor) -> tuple[Tensor, Tensor]:
        """query (B, Dq), keys = key_proj(values) (B, S, A), values (B, S, Dk), mask (B, S).

        Returns the context (B, Dk) and the weights (B, S), zero at masked positions.
        """
        scores = self.score(torch.tanh(keys + self.query_proj(query)[:, None]))[..., 0]  # (B, S)
        weights = scores.float().masked_fill(~mask, float("-inf")).softmax(-1).to(values.dtype)
        return (weights[:, None] @ values).squeeze(1), weights  # (B, Dk), (B, S)


@dataclass
class RNNCache:
    """The decoder state s_t (B, L, Hd) and the projected keys U h_j (B, S, A), batch first."""

    state: Tensor | None = None
    keys: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Keep, reorder or repeat the batch's entries in place (beam search)."""
        if self.state is not None:
            self.state = self.state.index_select(0, index)
            self.keys = self.keys.index_select(0, index)


class RNNSeq2Seq(Seq2Seq):
    """Bidirectional GRU/LSTM encoder, GRU decoder with additive attention, deep output layer.

    Same interface as the Transformer: `encode(src)` once, `decode(tgt_in, memory)` for a whole
    teacher-forced target or, with an `RNNCache`, step by step.
    """

    def __init__(self, cfg: RNNConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        self.cfg, self.pad_id, self.max_positions = cfg, pad_id, cfg.max_positions
        e, h, n = cfg.d_embed, cfg.d_hidden, cfg.n_layers
        self.src_embed, self.tgt_embed = make_embeddings(
            src_vocab=src_vocab, tgt_vocab=tgt_vocab, dim=e, pad_id=pad_id,
            share=shared_vocab and cfg.tie_embeddings)
        rnn = nn.GRU if cfg.cell == "gru" else nn.LSTM
        self.encoder = rnn(e, h, num_layers=n, dropout=cfg.dropout if n > 1 else 0.0,
                           batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(2 * h, n * h)  # s_0 from the mean encoder state
        self.attn = AdditiveAttention(d_query=h, d_key=2 * h, d_attn=cfg.d_attn)
        self.decoder = nn.ModuleList(nn.GRUCell(e + 2 * h if i == 0 else h, h) for i in range(n))
        self.pre_out = nn.Linear(h + 2 * h + e, e)  # deep output from [s_t; c_t; E y_{t-1}]
        self.out_proj = nn.Linear(e, tgt_vocab, bias=False)
        self.drop = nn.Dropout(cfg.dropout)
        init_embeddings(self.src_embed, self.tgt_embed, pad_id=pad_id)
        if cfg.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def encode(self, src: Tensor, src_mask: Tensor,
               weights: AttentionWeights | None = None) -> Tensor:
        """src: (B, S) ids -> memory (B, S, 2Hd); padded positions are zero and never read.

        The encoder has no attention: `weights` stays empty.
        """
        x = self.drop(self.src_embed(src))  # (B, S, E)
        lengths = src_mask.flatten(1).sum(1).cpu()
        # packing runs each sentence over its own length only, so padding cannot leak
        # into the backward direction
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return self.drop(out)  # (B, S, 2Hd)

    def _start(self, memory: Tensor, mask: Tensor) -> RNNCache:
        """Decoder state s_0 (B, L, Hd) and the projected keys (B, S, A) of a batch of memories."""
        m = mask.unsqueeze(-1).to(memory.dtype)  # (B, S, 1)
        mean = (memory * m).sum(1) / m.sum(1)  # (B, 2Hd)
        state = torch.tanh(self.init_state(mean)).view(memory.size(0), self.cfg.n_layers, -1)
        return RNNCache(state, self.attn.key_proj(memory))

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               cache: RNNCache | None = None, weights: AttentionWeights | None = None) -> Tensor:
        """tgt_in: (B, T) ids -> logits (B, T, V); with `cache`, only the new positions.

        `weights.cross` gets the additive attention as one (B, 1, T, S) "layer" with one head.
        """
        mask = src_mask.flatten(1)  # (B, S)
        c = cache if cache is not None and cache.state is not None else self._start(memory, mask)
        state, keys = list(c.state.unbind(1)), c.keys  # L x (B, Hd), (B, S, A)
        # the values in the dtype attention computes in (bf16 under autocast): cast once here,
        # not at every step, which would also keep T copies of the memory for backward
        values = memory.to(keys.dtype)  # (B, S, 2Hd)
        emb = self.drop(self.tgt_embed(tgt_in))  # (B, T, E)
        outs, attn = [], []
        for t in range(tgt_in.size(1)):  # the sequential part: step t needs s_{t-1}
            ctx, w = self.attn(state[-1], keys, values, mask)  # (B, 2Hd), (B, S)
            x = torch.cat([emb[:, t], ctx], dim=-1)  # (B, E + 2Hd)
            for i, cell in enumerate(self.decoder):
                state[i] = cell(x, state[i])  # (B, Hd)
                x = self.drop(state[i])
            outs.append(torch.cat([state[-1], ctx], dim=-1))  # (B, 3Hd)
            attn.append(w)
        if weights is not None:
            weights.cross.append(torch.stack(attn, 1).detach()[:, None])  # (B, 1, T, S)
        if cache is not None:
            cache.state, cache.keys = torch.stack(state, 1), keys
        out = torch.cat([torch.stack(outs, 1), emb], dim=-1)  # (B, T, 3Hd + E)
        return self.out_proj(self.drop(torch.tanh(self.pre_out(out))))  # (B, T, V)

    def new_cache(self) -> RNNCache:
        return RNNCache()
