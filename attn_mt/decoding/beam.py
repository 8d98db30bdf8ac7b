"""Beam search's choices (search.py's loop runs `Beam`), over many sentences at once, with n-best
lists and a GNMT length penalty.

Each sentence owns k consecutive hypotheses of the decoder batch: (B, k) -> (B*k). Beams only ever
move within their sentence's block, so the decoder cache reorders just its self-attention state
(`cache.reorder`), and every decision about a sentence looks at its own block only: its
hypotheses do not depend on which other sentences share the batch.
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
    """A finished output: token ids without bos/eos, log P(y | x), the length-normalised score."""

    tokens: list[int]
    log_prob: float
    score: float


def length_penalty(length: int | Tensor, alpha: float | Penalty) -> float | Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, section 7); |Y| counts eos. A
    `Penalty` of form "power" (DecodeConfig.penalty) gives |Y| ** alpha, transformers' one."""
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
    """scores (B, k) log P of the beams, logp (B, k, V) of their next tokens (after the rules) ->
    the step's `Candidates`."""
    b, k, v = logp.shape
    cand = (scores[:, :, None] + logp).view(b, k * v)  # (B, k*V)
    top, idx = cand.topk(min(2 * k, k * v), dim=1)  # (B, 2k), best first
    origin, token = idx // v, idx % v
    is_eos = token == eos_id
    ended = is_eos & (torch.arange(top.size(1), device=logp.device) < k) & top.isfinite()
    keep = torch.sort(is_eos.int(), dim=1, stable=True).indices[:, :k]  # (B, k)
    scores = top.gather(1, keep).masked_fill(is_eos.gather(1, keep), -math.inf)
    return Candidates(top, origin, token, ended, keep, scores)


def best_possible(log_prob: Tensor, length: int, max_len: Tensor, alpha: float | Penalty) -> Tensor:
    """Upper bound on the score of any continuation of the beams: log_prob (B, k) -> (B,); `length`
    the output length after one more token.

    log P only falls as tokens are added, so the best a beam can do is finish with its current
    log P at the length (between `length` and `max_len`) that divides it by the largest lp.
    """
    lp = length_penalty(max_len.float(), alpha).clamp(min=length_penalty(length, alpha))  # (B,)
    return log_prob.max(dim=1).values / lp


class Beam:
    """Beam search's chooser: k beams per sentence, k consecutive hypotheses of the batch. Each
    step keeps the k best extensions that do not end (`candidates`), and the batch follows them;
    a candidate ending in eos is a finished hypothesis. A sentence is done once the n-th best of
    its finished hypotheses can no longer be beaten by a continuation of its beams
    (`best_possible`), or at its length limit."""

    def __init__(self, max_len: Tensor, eos_id: int, k: int, alpha: float | Penalty = 0.6,
                 nbest: int = 1) -> None:
        if not 1 <= nbest <= k:
            raise ValueError(f"nbest={nbest} must be between 1 and beam_size={k}")
        b = len(max_len)
        self.k, self.eos_id = k, eos_id
        self.alpha, self.n = [alpha] * b, [nbest] * b  # (B,) each sentence's lp and n-best size
        self.scores = torch.full((b, k), -math.inf, device=max_len.device)  # (B, k) beams' log P
        self.scores[:, 0] = 0.0  # start from one beam, so the first step does not pick k copies
        self.finished: list[list[Hypothesis]] = [[] for _ in range(b)]
        self.active = set(range(b))  # sentences still searching
        self.max_len, self.last = max_len, max_len.tolist()  # (B,), and on the host
        self.limit = MaxLength(max_len.repeat_interleave(k), eos_id)  # (B*k,)

    def choose(self, step: int, logp: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """The step's tokens (B*k,) and the hypotheses of ys they extend (B*k,), from logp
        (B*k, V) and ys (B*k, 1 + step): bos and the tokens so far."""
        c = candidates(self.scores, logp.view(*self.scores.shape, -1), self.eos_id)
        self.scores = c.scores
        self.settle(c, ys, [step] * len(self.finished), self.bounds(step + 2))
        return self.follow(c)

    def settle(self, c: Candidates, ys: Tensor, steps: list[int], bound: list[float]) -> None:
        """Keep the hypotheses that end at this step (sentence s has predicted steps[s] tokens) and
        close the sentences whose n-best list no continuation can enter (bound[s]: the best score
        one could reach)."""
        k = self.k
        if bool(c.ended.any()):
            s_idx, c_idx = c.ended.nonzero(as_tuple=True)
            prefixes = ys[s_idx * k + c.origin[s_idx, c_idx], 1:].tolist()
            ends = zip(s_idx.tolist(), c.top[s_idx, c_idx].tolist(), prefixes, strict=True)
            for s, lp, prefix in ends:
                if s in self.active:
                    n = steps[s]
                    hyp = Hypothesis(prefix[:n], lp, lp / length_penalty(n + 1, self.alpha[s]))
                    self.finished[s].append(hyp)
        for s in list(self.active):
            scores_s, n = sorted((h.score for h in self.finished[s]), reverse=True), self.n[s]
            if steps[s] + 1 >= self.last[s] or (len(scores_s) >= n and scores_s[n - 1] >= bound[s]):
                self.active.discard(s)  # nothing left on the beam can enter its n-best list

    def follow(self, c: Candidates) -> tuple[Tensor, Tensor]:
        """The new beams: their tokens (B*k,) and the hypotheses they extend (B*k,)."""
        b, k = c.keep.shape
        block = torch.arange(b, device=c.keep.device)[:, None] * k  # (B, 1) each sentence's first
        return c.token.gather(1, c.keep).view(-1), (block + c.origin.gather(1, c.keep)).view(-1)

    def bounds(self, length: int) -> list[float]:
        """`best_possible` of each sentence (one alpha for all)."""
        return best_possible(self.scores, length, self.max_len, self.alpha[0]).tolist()

    def done(self) -> bool:
        return not self.active

    def nbest(self, ys: Tensor) -> list[list[Hypothesis]]:
        """Each sentence's n-best list, best first."""
        ranked = (sorted(f, key=lambda h: -h.score) for f in self.finished)
        return [hyps[:n] for hyps, n in zip(ranked, self.n, strict=True)]
