"""Greedy and beam search over one loop, with a key/value cache.

`steps` is the loop: encode the source once, then at each step a decoder step with the rules
(decoding/rules.py's `decode_step`) and a chooser that picks each hypothesis's next token: `Greedy`
here, `Beam` in beam.py. decoding/translate.py turns texts into batches for it and back.

Tested in tests/decoding/test_search.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from attn_mt.config import Penalty
from attn_mt.decoding.beam import Beam, Hypothesis, length_penalty
from attn_mt.decoding.rules import MaxLength, Rule, decode_step, step_rules
from attn_mt.models import Seq2Seq

Interrupt = Callable[[], None]  # called before each decoder step; raises to abandon the call


@torch.inference_mode()
def greedy_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int,
                  alpha: float | Penalty = 0.0, use_cache: bool = True,
                  interrupt: Interrupt | None = None,
                  rules: Sequence[Rule] = ()) -> list[Hypothesis]:
    """The most likely next token at each step (`Greedy`), for src (B, S); max_len (B,) >= 1."""
    chooser = Greedy(max_len.to(src.device), eos_id, alpha)
    loop = steps(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt,
                 rules=rules)
    return [n[0] for n in chooser.nbest(deque(loop, maxlen=1)[0])]  # from the last step's ys


@torch.inference_mode()
def beam_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int,
                beam_size: int, alpha: float | Penalty = 0.6, nbest: int = 1,
                use_cache: bool = True, interrupt: Interrupt | None = None,
                rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """The `nbest` highest-scoring outputs (<= beam_size) of each sentence, best first (beam.py's
    `Beam`), for src (B, S); max_len (B,) >= 1. Score: log P / lp(|y|), log P alone at alpha 0."""
    chooser = Beam(max_len.to(src.device), eos_id, beam_size, alpha, nbest)
    loop = steps(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt,
                 rules=rules)
    return chooser.nbest(deque(loop, maxlen=1)[0])


def steps(model: Seq2Seq, src: Tensor, chooser: Greedy | Beam, *, bos_id: int,
          use_cache: bool = True, interrupt: Interrupt | None = None,
          rules: Sequence[Rule] = ()) -> Iterator[Tensor]:
    """The search loop (run it under torch.inference_mode()): encode src (B, S), then a step at a
    time yield ys (N, 2 + step): bos and the tokens so far, until the chooser is done or every
    output is at its length limit. `rules` (a target prefix, sampling) join the model's banned
    ids and the length limit, each in its `order`. Without the cache each step feeds the whole
    output so far (the slow way, kept for comparison and tests).
    """
    src_mask = model.src_mask(src)
    memory = model.encode(src, src_mask)  # (B, S, D)
    if chooser.k > 1:  # k consecutive hypotheses per sentence
        memory = memory.repeat_interleave(chooser.k, dim=0)  # (N, S, D)
        src_mask = src_mask.repeat_interleave(chooser.k, dim=0)
    cache = model.new_cache() if use_cache else None
    rules = step_rules(model, rules, chooser.limit)
    ys = torch.full((memory.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (N, 1)
    for step in range(int(chooser.limit.max_len.max())):
        if interrupt is not None:
            interrupt()
        tgt_in = ys if cache is None else ys[:, -1:]  # (N, 1 + step) or (N, 1)
        logp = decode_step(model, tgt_in, memory, src_mask, cache, step=step, predicted=ys[:, 1:],
                           rules=rules)  # (N, V)
        out, extends = chooser.choose(step, logp, ys)  # (N,), beam search's (N,) or None
        if extends is not None:
            ys = ys[extends]
            if cache is not None:
                cache.reorder(extends)
        ys = torch.cat([ys, out[:, None]], dim=1)
        yield ys
        if chooser.done():
            return


class Greedy:
    """Greedy search's chooser: the most likely token of each hypothesis (one per sentence), and
    eos again after eos. Scores are log P / lp(length) as in beam search, so the two compare."""

    k = 1

    def __init__(self, max_len: Tensor, eos_id: int, alpha: float | Penalty = 0.0) -> None:
        self.limit = MaxLength(max_len, eos_id)  # max_len: (B,)
        self.eos_id = eos_id
        self.alpha = [alpha] * len(max_len)  # (B,) each sentence's length penalty
        self.log_prob = torch.zeros(len(max_len), device=max_len.device)  # (B,) log P so far
        self.ended = torch.zeros(len(max_len), dtype=torch.bool, device=max_len.device)  # (B,)

    def choose(self, step: int, logp: Tensor, ys: Tensor) -> tuple[Tensor, None]:
        # eos at the limit (the one token the length rule leaves) and after an output's eos
        out = logp.argmax(-1).masked_fill(self.limit.forced(step) | self.ended, self.eos_id)  # (B,)
        self.log_prob += logp.gather(1, out[:, None])[:, 0].masked_fill(self.ended, 0.0)
        self.ended |= out == self.eos_id
        return out, None

    def done(self) -> bool:
        return bool(self.ended.all())

    def nbest(self, ys: Tensor) -> list[list[Hypothesis]]:
        """Each sentence's one hypothesis: its tokens up to eos."""
        outs = zip(ys[:, 1:].tolist(), self.log_prob.tolist(), self.alpha, strict=True)
        return [[self.hypothesis(out, lp, alpha)] for out, lp, alpha in outs]

    def hypothesis(self, out: list[int], log_prob: float, alpha: float | Penalty) -> Hypothesis:
        tokens = out[: out.index(self.eos_id)] if self.eos_id in out else out
        return Hypothesis(tokens, log_prob, log_prob / length_penalty(len(tokens) + 1, alpha))
