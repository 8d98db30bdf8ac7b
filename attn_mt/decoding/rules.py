"""One decoder step, written once: the model's next-token log P, then the rules, each in turn.

A rule sees the step, the log P of each hypothesis's next token and its tokens so far, and rules
tokens out (sets them to -inf); the search then picks among the rest, so log P stays the model's.
A batch holds one hypothesis per sentence (greedy) or k consecutive ones (beam search).

    rule        order   rules out
    BanIds      BAN     the model's banned ids (model.banned), always
    MaxLength   LIMIT   everything but eos at an output's last position

A caller adds its own (api/steering.py's prefix, FORCE; sampling, DRAW); all run in `order`.

Tested in tests/decoding/test_rules.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from attn_mt.models import DecoderCache, Seq2Seq

BAN, FORCE, DRAW, LIMIT = range(4)  # a rule's place: what it rules out, then what it keeps


class Rule(Protocol):
    order: int  # BAN, FORCE, DRAW or LIMIT: its place among a step's rules
    def apply(self, step: int, logp: Tensor, predicted: Tensor) -> Tensor:
        """logp (N, V) with tokens ruled out at -inf; predicted (N, step): the ids so far."""
        ...


def only(logp: Tensor, keep: Tensor) -> Tensor:
    """logp (N, V) with all but keep[i] at -inf where keep[i] >= 0; a kept -inf (ruled out) is 0."""
    k = keep.clamp(min=0)[:, None]  # (N, 1)
    kept = torch.full_like(logp, -math.inf).scatter(1, k, logp.gather(1, k).nan_to_num(neginf=0.0))
    return torch.where((keep < 0)[:, None], logp, kept)  # no host sync per token


class BanIds:
    """Ids never generated: -inf after the softmax, so the rest keep their probabilities."""

    order = BAN

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)

    def apply(self, step: int, logp: Tensor, predicted: Tensor) -> Tensor:
        logp[..., self.ids] = -math.inf
        return logp


class MaxLength:
    """Only eos at the last position of each output: step + 1 >= max_len (N,), eos included."""

    order = LIMIT

    def __init__(self, max_len: Tensor, eos_id: int) -> None:
        self.max_len, self.eos_id = max_len, eos_id
        self.first = int(max_len.min()) if max_len.numel() else 0  # no output ends before this

    def forced(self, step: int) -> Tensor:
        """(N,) True where the output is at its last position."""
        return step + 1 >= self.max_len

    def apply(self, step: int, logp: Tensor, predicted: Tensor) -> Tensor:
        if step + 1 < self.first:
            return logp
        return only(logp, torch.where(self.forced(step), self.eos_id, -1))


def step_rules(model: Seq2Seq, rules: Sequence[Rule], limit: MaxLength) -> list[Rule]:
    """A search's rules in `order` (stable): the model's banned ids, the caller's, the limit."""
    banned = getattr(model, "banned", None)
    return sorted([*([BanIds(banned)] if banned else []), *rules, limit], key=lambda r: r.order)


def decode_step(model: Seq2Seq, tgt_in: Tensor, memory: Tensor | None, src_mask: Tensor,
                cache: DecoderCache | None, *, step: int, predicted: Tensor,
                rules: Sequence[Rule]) -> Tensor:
    """log P (N, V) of the next token: the decoder on `tgt_in` (N, 1), the newest tokens, with the
    cache (without one: the whole output so far), log-softmax in float32, then each rule."""
    logp = model.decode(tgt_in, memory, src_mask, cache)[:, -1].float().log_softmax(-1)  # (N, V)
    for rule in rules:
        logp = rule.apply(step, logp, predicted)
    return logp
