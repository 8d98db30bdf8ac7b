"""One decoder step, written once: the model's next-token log P, then the rules, each in turn.

A rule sees the step, the log P of every row's next token and the tokens so far, and rules tokens out
(sets them to -inf); the search (greedy, beam, the stream, the server's running batch) then picks among
the rest, so log P stays the model's. Rows are a batch's sentences (greedy) or their beams, k consecutive
rows per sentence (beam). In the server's running batch rows stand at different steps: there `step` is
(rows,) and `tokens` right-padded (a row's own are its first step[row]). Every loop applies `step_rules`:
the model's, then the caller's, then the length limit, whose `greedy` is greedy search's pick.

    rule            rules out
    BanIds          the model's banned ids (model.banned), always
    MaxLength       everything but eos at a row's last position
    Prefix          everything but the prefix's next token, while a row is inside its target prefix
    Sample          everything but a token drawn from softmax(log P / temperature), a generator per row

Tested in tests/decoding/test_rules.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from attn_mt.models import Seq2Seq


class Rule(Protocol):
    def apply(self, step: int | Tensor, logp: Tensor, tokens: Tensor) -> Tensor:
        """log P (rows, V) with tokens ruled out at -inf; tokens: (rows, step) the ids so far (no bos)."""
        ...


def only(logp: Tensor, keep: Tensor) -> Tensor:
    """logp (rows, V) with every token but keep[row] at -inf, in the rows where keep >= 0 (others as they are)."""
    mask = torch.full_like(logp, -math.inf).scatter(1, keep.clamp(min=0)[:, None], 0.0)
    return torch.where((keep < 0)[:, None], logp, logp + mask)  # read on the device: no sync per token


class BanIds:
    """Ids never generated, at -inf after the softmax (as transformers' generate() bans them: the others keep
    their probabilities)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)

    def apply(self, step: int | Tensor, logp: Tensor, tokens: Tensor) -> Tensor:
        logp[..., self.ids] = -math.inf
        return logp


class MaxLength:
    """Only eos at a row's last position: step + 1 >= max_len (rows,), eos included in the length."""

    def __init__(self, max_len: Tensor, eos_id: int) -> None:
        self.max_len, self.eos_id = max_len, eos_id
        self.first = int(max_len.min()) if max_len.numel() else 0  # before this step no row is at its limit

    def forced(self, step: int | Tensor) -> Tensor:
        """(rows,) the rows at their last position."""
        return step + 1 >= self.max_len

    def apply(self, step: int | Tensor, logp: Tensor, tokens: Tensor) -> Tensor:
        if isinstance(step, int) and step + 1 < self.first:
            return logp
        forced = self.forced(step)  # (rows,)
        if not isinstance(step, int) and not bool(forced.any()):  # rows at different steps: look
            return logp
        return only(logp, torch.where(forced, self.eos_id, -1))

    def greedy(self, step: int | Tensor, logp: Tensor) -> Tensor:
        """(rows,) greedy search's pick: the most likely token; eos at a row's limit (even where the rules left
        no token: a sampled row whose draw was not eos)."""
        return torch.where(self.forced(step), self.eos_id, logp.argmax(-1))


class Prefix:
    """A target prefix per sentence (k rows each): a row inside its prefix keeps only the prefix's next token."""

    def __init__(self, prefixes: list[list[int]], device: torch.device | str) -> None:
        self.width = max((len(p) for p in prefixes), default=0)
        self.table = torch.tensor([p + [-1] * (self.width - len(p)) for p in prefixes], dtype=torch.long,
                                  device=device).view(len(prefixes), self.width)  # (B, P): -1 past each prefix

    def apply(self, step: int, logp: Tensor, tokens: Tensor) -> Tensor:
        if step >= self.width:
            return logp
        k = logp.size(0) // self.table.size(0)
        return only(logp, self.table[:, step].repeat_interleave(k))


class Sample:
    """Sampling: each row keeps only a token drawn from softmax(log P / temperature), from its own generator
    (sampling is beam 1: a row per sentence). A row another rule has left one token keeps it (drawn surely)."""

    def __init__(self, temperature: float, seeds: list[int], device: torch.device | str) -> None:
        self.temperature = max(temperature, 1e-30)  # a float32 divisor (below: greedy all the same)
        self.draw = [torch.Generator(device=device).manual_seed(s) for s in seeds]  # (B,)

    def apply(self, step: int, logp: Tensor, tokens: Tensor) -> Tensor:
        top = logp.max(-1, keepdim=True).values  # the best token's at 0: no overflow for any temperature
        probs = ((logp - top) / self.temperature).softmax(-1)  # (B, V)
        drawn = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, self.draw, strict=True)])
        return only(logp, drawn)


def step_rules(model: Seq2Seq, rules: Sequence[Rule], limit: MaxLength) -> list[Rule]:
    """Every loop's rules, in this order: the model's banned ids (model.banned, if any), the caller's (a prefix,
    sampling), the length limit."""
    banned = getattr(model, "banned", None)
    return [*([BanIds(banned)] if banned else []), *rules, limit]


def decode_step(model: Seq2Seq, inp: Tensor, memory: Tensor | None, src_mask: Tensor, cache, *,
                step: int | Tensor, tokens: Tensor, rules: Sequence[Rule]) -> Tensor:
    """log P (rows, V) of each row's next token after `rules`: one decoder step on `inp` (rows, 1) with the
    cache (or the whole prefix without one), log-softmax in float32, then each rule in turn."""
    logp = model.decode(inp, memory, src_mask, cache)[:, -1].float().log_softmax(-1)  # (rows, V)
    for rule in rules:
        logp = rule.apply(step, logp, tokens)
    return logp
