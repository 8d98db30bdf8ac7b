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
    """Beam search's chooser: k beams per sentence on k consecutive rows, each step the k best extensions that
    do not end (`candidates`), the rows reordered to follow them; a candidate ending in eos is a finished
    hypothesis. A sentence is done once the n-th best of its finished hypotheses can no longer be beaten by any
    continuation of its beams (`best_possible`), or at its length limit. `alpha` and `nbest` are each sentence's
    own (a list) or one for all; `step` is every row's (an int), or each row's own (a running batch's: rows
    at different steps, continuous.py)."""

    def __init__(self, max_len: Tensor, eos_id: int, k: int, alpha: float | Penalty | list = 0.6,
                 nbest: int | list[int] = 1) -> None:
        b, dev = len(max_len), max_len.device
        self.alpha = alpha if isinstance(alpha, list) else [alpha] * b  # (B,) each sentence's length penalty
        self.n = nbest if isinstance(nbest, list) else [nbest] * b  # (B,) and its n-best list's size
        for n in self.n:
            if not 1 <= n <= k:
                raise ValueError(f"nbest={n} must be between 1 and beam_size={k}")
        self.k, self.eos_id = k, eos_id
        self.scores = torch.full((b, k), -math.inf, device=dev)  # (B, k) log P of the active beams
        self.scores[:, 0] = 0.0  # start from one beam, so the first step does not pick k copies
        self.finished: list[list[Hypothesis]] = [[] for _ in range(b)]
        self.active = set(range(b))  # sentences still searching
        self._limit(max_len)

    def _limit(self, max_len: Tensor) -> None:
        self.max_len = max_len  # (B,)
        self.last = max_len.tolist()  # (B,) the same on the host: the stop rule reads it every step
        self.limit = MaxLength(max_len.repeat_interleave(self.k), self.eos_id)  # (B*k,) rows

    def choose(self, step: int | Tensor, logp: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """step: the decoded step of every row (int), or of each row ((B*k,), a running batch's); logp (B*k, V);
        ys (B*k, 1 + W) bos and each row's tokens, right-padded."""
        b, k = self.scores.shape
        at = step if isinstance(step, int) else step.view(b, k)[:, 0]  # each sentence's step
        steps = [at] * b if isinstance(at, int) else at.tolist()
        c = candidates(self.scores, logp.view(b, k, -1), self.eos_id)
        if bool(c.ended.any()):
            s_idx, c_idx = c.ended.nonzero(as_tuple=True)
            prefixes = ys[s_idx * k + c.origin[s_idx, c_idx], 1:].tolist()
            for s, lp, prefix in zip(s_idx.tolist(), c.top[s_idx, c_idx].tolist(), prefixes, strict=True):
                if s in self.active:
                    n = steps[s]
                    hyp = Hypothesis(prefix[:n], lp, lp / length_penalty(n + 1, self.alpha[s]))
                    self.finished[s].append(hyp)
        self.scores = c.scores
        bound = self._bounds(at + 2)  # (B,)
        for s in list(self.active):
            scores_s, n = sorted((h.score for h in self.finished[s]), reverse=True), self.n[s]
            if steps[s] + 1 >= self.last[s] or (len(scores_s) >= n and scores_s[n - 1] >= bound[s]):
                self.active.discard(s)  # nothing left on the beam can enter its n-best list
        block = torch.arange(b, device=logp.device)[:, None] * k  # (B, 1) first row of each sentence
        rows = (block + c.origin.gather(1, c.keep)).view(-1)  # (B*k,) the rows the new beams extend
        return c.token.gather(1, c.keep).view(-1), rows

    def _bounds(self, length: int | Tensor) -> list[float]:
        """`best_possible` of each sentence, for each alpha apart (one call where all share one)."""
        if len(set(self.alpha)) == 1:
            return best_possible(self.scores, length, self.max_len, self.alpha[0]).tolist()
        bound = [0.0] * len(self.alpha)
        for a in set(self.alpha):
            rows = [s for s, x in enumerate(self.alpha) if x == a]
            idx = torch.tensor(rows, device=self.scores.device)
            part = length[idx] if isinstance(length, Tensor) else length
            for s, v in zip(rows, best_possible(self.scores[idx], part, self.max_len[idx], a).tolist(), strict=True):
                bound[s] = v
        return bound

    def done(self) -> bool:
        return not self.active

    def nbest(self, ys: Tensor, sentences: list[int] | None = None) -> list[list[Hypothesis]]:
        """The n-best lists of `sentences` (all by default), best first."""
        return [sorted(self.finished[s], key=lambda h: -h.score)[: self.n[s]]
                for s in (range(len(self.finished)) if sentences is None else sentences)]
