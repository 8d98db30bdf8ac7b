"""Batched beam search over many sentences at once, with n-best lists and a GNMT length penalty.

Each sentence owns k consecutive rows of the decoder batch: (B, k) -> (B*k). Beams only ever
move within their sentence's block of rows, so the decoder cache reorders just its self-attention
state (`cache.reorder`), and every decision about a sentence looks at that sentence's rows only:
its hypotheses do not depend on which other sentences share the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from attn_mt.config import Penalty
from attn_mt.decoding.rules import MaxLength, Rule, decode_step, step_rules
from attn_mt.models import Seq2Seq


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


@torch.inference_mode()
def beam_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int, beam_size: int,
                alpha: float | Penalty = 0.6, nbest: int = 1, use_cache: bool = True,
                interrupt: Callable[[], None] | None = None, rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """The `nbest` highest-scoring outputs for each source sentence, best first.

    Args:
        model: encodes once, then decodes step by step with its cache.
        src: (B, S) source ids, right-padded.
        max_len: (B,) the most output tokens per sentence, eos included; eos is forced there.
        beam_size: k active hypotheses per sentence.
        alpha: length penalty exponent; score = log P / lp(|y|). 0 ranks by log P alone.
        nbest: hypotheses returned per sentence (<= beam_size).
        use_cache: feed only the newest token each step (else re-run the whole prefix).
        interrupt: called before each decoder step (it raises to abandon the search).
        rules: beyond the model's and the length limit, on the (B*k) rows (a forced target prefix: rules.py).

    Finished hypotheses are collected until the `nbest`-th best of them can no longer be beaten
    by any continuation of the active beams (see `best_possible`), or the length limit.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be between 1 and beam_size={beam_size}")
    b, k, dev = src.size(0), beam_size, src.device
    src_mask = model.src_mask(src)
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)  # (B*k, S, D)
    src_mask = src_mask.repeat_interleave(k, dim=0)
    cache = model.new_cache() if use_cache else None
    max_len = max_len.to(dev)
    rules = step_rules(model, rules, MaxLength(max_len.repeat_interleave(k), eos_id))
    scores = torch.full((b, k), -math.inf, device=dev)  # (B, k) log P of the active beams
    scores[:, 0] = 0.0  # start from one beam, so the first step does not pick k copies
    ys = torch.full((b * k, 1), bos_id, dtype=torch.long, device=dev)  # (B*k, 1 + step)
    block = torch.arange(b, device=dev)[:, None] * k  # (B, 1) first row of each sentence
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    active = set(range(b))  # sentences still searching
    for step in range(int(max_len.max())):
        if interrupt is not None:
            interrupt()
        inp = ys[:, -1:] if use_cache else ys
        logp = decode_step(model, inp, memory, src_mask, cache, step=step, tokens=ys[:, 1:], rules=rules)
        c = candidates(scores, logp.view(b, k, -1), eos_id)  # logp: (B*k, V)
        if bool(c.ended.any()):
            s_idx, c_idx = c.ended.nonzero(as_tuple=True)
            prefixes = ys[s_idx * k + c.origin[s_idx, c_idx], 1:].tolist()
            for s, lp, prefix in zip(s_idx.tolist(), c.top[s_idx, c_idx].tolist(), prefixes, strict=True):
                if s in active:
                    finished[s].append(Hypothesis(prefix, lp, lp / length_penalty(step + 1, alpha)))
        scores = c.scores
        rows = (block + c.origin.gather(1, c.keep)).view(-1)  # (B*k,) surviving rows
        ys = torch.cat([ys[rows], c.token.gather(1, c.keep).view(-1, 1)], dim=1)
        if cache is not None:
            cache.reorder(rows)
        bound = best_possible(scores, step + 2, max_len, alpha).tolist()  # (B,)
        for s in list(active):
            scores_s = sorted((h.score for h in finished[s]), reverse=True)
            if len(scores_s) >= nbest and scores_s[nbest - 1] >= bound[s]:
                active.discard(s)  # nothing left on the beam can enter its n-best list
        if not active:
            break
    return [sorted(f, key=lambda h: -h.score)[:nbest] for f in finished]
