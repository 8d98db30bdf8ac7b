"""Beam search's choices (search.py's loop runs `Beam`), over many sentences at once, with n-best lists and a GNMT
length penalty.

Each sentence owns k consecutive rows of the decoder batch: (B, k) -> (B*k). Beams only ever
move within their sentence's block of rows, so the decoder cache reorders just its self-attention
state (`cache.reorder`), and every decision about a sentence looks at that sentence's rows only:
its hypotheses do not depend on which other sentences share the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from attn_mt.config import Penalty
from attn_mt.decoding.rules import MaxLength


@dataclass(frozen=True)
class Hypothesis:
    """A finished output: token ids without bos/eos, log P(y | x), and the length-normalised score."""

    tokens: list[int]
    log_prob: float
    score: float


def length_penalty(length: int | Tensor, alpha: float | Penalty) -> float | Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, section 7); |Y| counts eos. A `Penalty` of
    form "power" (DecodeConfig.penalty) gives |Y| ** alpha, transformers' length_penalty."""
    if isinstance(alpha, Penalty):
        return length ** alpha.alpha if alpha.form == "power" else ((5 + length) / 6) ** alpha.alpha
    return ((5 + length) / 6) ** alpha


class Candidates(NamedTuple):
    """One beam step's choice for B sentences of k beams, from the 2k best extensions of each."""

    top: Tensor  # (B, 2k) log P of the candidates, best first
    origin: Tensor  # (B, 2k) the beam each extends
    token: Tensor  # (B, 2k) the token it adds
    ended: Tensor  # (B, 2k) eos among the k best: a finished hypothesis
    keep: Tensor  # (B, k) the candidates that continue as the new beams (the k best not ending)
    scores: Tensor  # (B, k) their log P (-inf where fewer than k do not end)


def candidates(scores: Tensor, logp: Tensor, eos_id: int) -> Candidates:
    """scores (B, k) log P of the beams, logp (B, k, V) of their next tokens (after the rules) -> the step's
    `Candidates`. Offline and continuous beam search (decoding/continuous.py) both decide with this."""
    b, k, v = logp.shape
    cand = (scores[:, :, None] + logp).view(b, k * v)  # (B, k*V)
    top, idx = cand.topk(min(2 * k, k * v), dim=1)  # (B, 2k), best first
    origin, token = idx // v, idx % v
    is_eos = token == eos_id
    ended = is_eos & (torch.arange(top.size(1), device=logp.device) < k) & top.isfinite()
    keep = torch.sort(is_eos.int(), dim=1, stable=True).indices[:, :k]  # (B, k)
    scores = top.gather(1, keep).masked_fill(is_eos.gather(1, keep), -math.inf)
    return Candidates(top, origin, token, ended, keep, scores)


def best_possible(log_prob: Tensor, length: int | Tensor, max_len: Tensor, alpha: float | Penalty) -> Tensor:
    """Upper bound on the score of any continuation of active beams. log_prob: (B, k) -> (B,);
    `length` the output length after one more token (an int, or (B,) per sentence).

    log P only falls as tokens are added, so the best a beam can do is finish with its current
    log P at the length (between `length` and `max_len`) that divides it by the largest lp.
    """
    if isinstance(length, Tensor):  # per sentence: the int version's values, rounded once to float32
        least = length_penalty(length.double(), alpha).float()
    else:
        least = length_penalty(length, alpha)
    lp = length_penalty(max_len.float(), alpha).clamp(min=least)  # (B,)
    return log_prob.max(dim=1).values / lp


class Beam:
    """Beam search's chooser (search.py's loop runs it): k beams per sentence on k consecutive rows, each step
    the k best extensions that do not end (`candidates`), the rows reordered to follow them; a candidate ending
    in eos is a finished hypothesis. A sentence is done once the `nbest`-th best of its finished hypotheses can
    no longer be beaten by any continuation of its beams (`best_possible`), or at the length limit."""

    def __init__(self, max_len: Tensor, eos_id: int, k: int, alpha: float | Penalty = 0.6, nbest: int = 1) -> None:
        if not 1 <= nbest <= k:
            raise ValueError(f"nbest={nbest} must be between 1 and beam_size={k}")
        b, dev = len(max_len), max_len.device
        self.k, self.n, self.eos_id, self.alpha, self.max_len = k, nbest, eos_id, alpha, max_len  # max_len: (B,)
        self.limit = MaxLength(max_len.repeat_interleave(k), eos_id)
        self.scores = torch.full((b, k), -math.inf, device=dev)  # (B, k) log P of the active beams
        self.scores[:, 0] = 0.0  # start from one beam, so the first step does not pick k copies
        self.block = torch.arange(b, device=dev)[:, None] * k  # (B, 1) first row of each sentence
        self.finished: list[list[Hypothesis]] = [[] for _ in range(b)]
        self.active = set(range(b))  # sentences still searching

    def choose(self, step: int, logp: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        b, k = self.scores.shape
        c = candidates(self.scores, logp.view(b, k, -1), self.eos_id)  # logp: (B*k, V)
        if bool(c.ended.any()):
            s_idx, c_idx = c.ended.nonzero(as_tuple=True)
            prefixes = ys[s_idx * k + c.origin[s_idx, c_idx], 1:].tolist()
            for s, lp, prefix in zip(s_idx.tolist(), c.top[s_idx, c_idx].tolist(), prefixes, strict=True):
                if s in self.active:
                    self.finished[s].append(Hypothesis(prefix, lp, lp / length_penalty(step + 1, self.alpha)))
        self.scores = c.scores
        bound = best_possible(self.scores, step + 2, self.max_len, self.alpha).tolist()  # (B,)
        for s in list(self.active):
            scores_s = sorted((h.score for h in self.finished[s]), reverse=True)
            if len(scores_s) >= self.n and scores_s[self.n - 1] >= bound[s]:
                self.active.discard(s)  # nothing left on the beam can enter its n-best list
        rows = (self.block + c.origin.gather(1, c.keep)).view(-1)  # (B*k,) surviving rows
        return c.token.gather(1, c.keep).view(-1), rows

    def done(self) -> bool:
        return not self.active

    def nbest(self, ys: Tensor) -> list[list[Hypothesis]]:
        return [sorted(f, key=lambda h: -h.score)[: self.n] for f in self.finished]
