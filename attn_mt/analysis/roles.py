"""What a head does, measured on its attention weights (Voita et al., ACL 2019, found such heads in
NMT).

For each head, averaged over the real query tokens of the analysed sentences:
    prev, same, next  the weight on the key one position before, at, or one after the query's own
                      position (self-attention only; the decoder's causal mask leaves no next
                      token);
    rare              the weight on the sentence's rarest token: the fewest occurrences among the
                      analysed sentences of that side, ties to the lower SentencePiece score (a
                      later BPE merge, a less likely unigram piece); special and punctuation pieces
                      excluded;
    eos               the weight on the end of the sentence: the source's eos, or the decoder
                      input's bos (it has no eos; bos is where its heads park weight);
    punct             the weight on punctuation pieces together;
    conf              the largest weight of each query (1: one key, 1 / n: spread evenly);
    mono              (cross-attention) Spearman's rank correlation of the source position a target
                      position attends to most (argmax) with the target position, per sentence of 3
                      or more target tokens, averaged: 1 is a monotone alignment, 0 none (a constant
                      argmax counts 0).

Tested in tests/analysis/test_heads.py and tests/data/test_pronoun.py.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

ROLES = ("prev", "same", "next", "rare", "eos", "punct", "conf", "mono")


def is_punct(piece: str) -> bool:
    """A SentencePiece piece made only of punctuation ("." or "▁," but not "▁" alone)."""
    text = piece.lstrip("\u2581")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


@dataclass
class Keys:
    """What the roles need to know of a batch's key tokens."""

    valid: Tensor  # (B, Tk) bool: real tokens
    rare: Tensor  # (B,) position of each sentence's rarest token, -1 where it has none
    boundary: Tensor  # (B,) position of eos (source) or bos (decoder input)
    punct: Tensor  # (B, Tk) bool


def key_info(ids: Tensor, sp, counts: Counter, pad_id: int, boundary_id: int) -> Keys:
    """Keys of a padded batch of ids (B, Tk) of one side; `sp` that side's SentencePieceProcessor
    and `counts` how often each id occurs in the analysed sentences of that side."""
    rows = ids.tolist()
    special = [[i == pad_id or sp.is_control(i) or sp.is_unknown(i) for i in row] for row in rows]
    punct = [[is_punct(sp.id_to_piece(i)) and not s for i, s in zip(row, sp_row, strict=True)]
             for row, sp_row in zip(rows, special, strict=True)]
    rare = []
    for row, s_row, p_row in zip(rows, special, punct, strict=True):
        words = [j for j, i in enumerate(row) if not s_row[j] and not p_row[j]]
        rare.append(min(words, key=lambda j: (counts[row[j]], sp.get_score(row[j]))) if words
                    else -1)
    boundary = [row.index(boundary_id) if boundary_id in row else 0 for row in rows]
    return Keys(ids != pad_id, torch.tensor(rare), torch.tensor(boundary),
                torch.tensor(punct, dtype=torch.bool))


class RoleSums:
    """Running sums of each role's share per head (H,) and the number of queries (or sentences) they
    cover, for one attention module; `shares()` divides."""

    def __init__(self, n_heads: int) -> None:
        self.sums = {r: torch.zeros(n_heads, dtype=torch.float64) for r in ROLES}
        self.counts = dict.fromkeys(ROLES, 0)

    def _add(self, role: str, x: Tensor, valid: Tensor) -> None:
        """x: (B, H, T) per-query values, valid: (B, T) the queries that count."""
        self.sums[role] += (x.double() * valid[:, None, :]).sum((0, 2)).cpu()
        self.counts[role] += int(valid.sum())

    def add(self, w: Tensor, q_valid: Tensor, keys: Keys, *, self_attention: bool,
            causal: bool) -> None:
        """One batch's weights w (B, H, Tq, Tk); q_valid (B, Tq) the real queries."""
        b, h, tq, tk = w.shape
        q_pos = torch.arange(tq, device=w.device)[None, :]  # (1, Tq)
        if self_attention:
            self._add("same", w.diagonal(0, 2, 3), q_valid)
            # query j + 1, key j
            self._add("prev", w.diagonal(-1, 2, 3), q_valid[:, 1:] & keys.valid[:, :-1])
            if not causal:
                # query j, key j + 1
                self._add("next", w.diagonal(1, 2, 3), q_valid[:, :-1] & keys.valid[:, 1:])
        for role, idx in (("rare", keys.rare), ("eos", keys.boundary)):
            # (B, H, Tq)
            at = w.gather(3, idx.clamp(min=0).view(b, 1, 1, 1).expand(b, h, tq, 1))[..., 0]
            seen = q_valid & (idx >= 0)[:, None]
            self._add(role, at, seen & (q_pos >= idx[:, None]) if causal else seen)
        self._add("punct", (w * keys.punct[:, None, None, :]).sum(-1), q_valid)
        self._add("conf", w.max(-1).values, q_valid)
        if not self_attention:
            self._add_monotony(w.argmax(-1), q_valid)

    def _add_monotony(self, argmax: Tensor, q_valid: Tensor) -> None:
        """argmax (B, H, Tq): each query's most attended key."""
        for a, n in zip(argmax.cpu().numpy(), q_valid.sum(1).tolist(), strict=True):
            if n >= 3:
                self.sums["mono"] += torch.tensor([spearman(row[:n]) for row in a],
                                                  dtype=torch.float64)
                self.counts["mono"] += 1

    def shares(self) -> list[dict[str, float | None]]:
        """Per head: role -> mean share (None where nothing was measured, e.g. `next` in the
        decoder)."""
        return [{r: (round(float(self.sums[r][i] / self.counts[r]), 4) if self.counts[r] else None)
                 for r in ROLES} for i in range(len(self.sums["conf"]))]


def spearman(positions: np.ndarray) -> float:
    """Rank correlation of a sequence of source positions with its order (0, 1, 2, ...); 0 if
    constant."""
    ranks = _ranks(positions.astype(np.float64))
    order = np.arange(len(positions), dtype=np.float64)
    if ranks.std() == 0:
        return 0.0
    return float(np.corrcoef(ranks, order)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank."""
    ranks = np.empty(len(x))
    ranks[x.argsort(kind="stable")] = np.arange(len(x))
    _, group = np.unique(x, return_inverse=True)
    return (np.bincount(group, ranks) / np.bincount(group))[group]
