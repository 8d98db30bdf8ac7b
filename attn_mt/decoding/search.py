"""Searching for translations: greedy and beam search over one loop, with a key/value cache.

`steps` is the loop: encode the source once, then at each step a decoder step with the rules
(decoding/rules.py's `decode_step`) and a chooser that picks each hypothesis's next token: `Greedy`
here, `Beam` in beam.py. Above it, the batched translate calls, text in and text out.

One job: searching for translations, from the loop to the batched translate calls built on it.
Tested in tests/decoding/test_search.py.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig, Penalty
from attn_mt.data.batching import pad
from attn_mt.data.checks import clean
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.beam import Beam, Hypothesis, length_penalty
from attn_mt.decoding.rules import MaxLength, Rule, decode_step, step_rules
from attn_mt.models import Seq2Seq

log = logging.getLogger(__name__)
Interrupt = Callable[[], None]  # called before each decoder step; raises to abandon the call


def max_lengths(src_lens: Tensor, cfg: DecodeConfig, limit: int) -> Tensor:
    """Per-sentence output limit a * |src| + b tokens (eos included), capped at the model's limit."""
    return (src_lens.float() * cfg.max_len_a + cfg.max_len_b).long().clamp(max=limit)


class Chooser(Protocol):
    """What the loop asks of a search at each step: greedy (`Greedy`) or beam (beam.py's `Beam`)."""

    k: int  # hypotheses per sentence: 1 for greedy, the beam size for beam search
    limit: MaxLength  # their output length limit (the last rule of every step)

    def choose(self, step: int, logp: Tensor, ys: Tensor) -> tuple[Tensor, Tensor | None]:
        """The step's tokens (N,) from logp (N, V) and ys (N, 1 + step), and the hypotheses of ys
        they extend ((N,) indices; None: each its own)."""

    def done(self) -> bool: ...  # nothing left to decode can change the outcome

    def nbest(self, ys: Tensor) -> list[list[Hypothesis]]: ...  # from the last ys, best first


def steps(model: Seq2Seq, src: Tensor, chooser: Chooser, *, bos_id: int, use_cache: bool = True,
          interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> Iterator[Tensor]:
    """The search loop (run it under torch.inference_mode()): encode src (B, S), then a step at a
    time yield ys (N, 1 + step + 1): bos and the tokens so far, until the chooser is done or every
    output is at its length limit. `rules` (a target prefix, sampling) come between the model's
    banned ids and the length limit.

    With the cache each step feeds only the newest token; without it, the whole output so far
    (the slow way, kept for comparison and tests).
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
    """Greedy search's chooser: the most likely token of each hypothesis (one per sentence); after
    eos, eos again. Scores are log P / lp(length) as in beam search, so greedy and beam n-best compare."""

    k = 1

    def __init__(self, max_len: Tensor, eos_id: int, alpha: float | Penalty = 0.0) -> None:
        self.limit = MaxLength(max_len, eos_id)  # max_len: (B,)
        self.eos_id = eos_id
        self.alpha = [alpha] * len(max_len)  # (B,) each sentence's length penalty
        self.log_prob = torch.zeros(len(max_len), device=max_len.device)  # (B,) log P so far
        self.ended = torch.zeros(len(max_len), dtype=torch.bool, device=max_len.device)  # (B,)

    def choose(self, step: int, logp: Tensor, ys: Tensor) -> tuple[Tensor, None]:
        # eos at the limit, even where the rules left no token (a sampled draw that was not eos)
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


@torch.inference_mode()
def run(model: Seq2Seq, src: Tensor, chooser: Chooser, *, bos_id: int, use_cache: bool = True,
        interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """The chooser's n-best lists once the loop (`steps`) has run to its end."""
    loop = steps(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt,
                 rules=rules)
    return chooser.nbest(deque(loop, maxlen=1)[0])  # the last step's ys


def greedy_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int,
                  alpha: float | Penalty = 0.0, use_cache: bool = True,
                  interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> list[Hypothesis]:
    """The most likely next token at each step (`Greedy`), for src (B, S); max_len (B,) >= 1."""
    chooser = Greedy(max_len.to(src.device), eos_id, alpha)
    nbest = run(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt,
                rules=rules)
    return [n[0] for n in nbest]


def beam_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int,
                beam_size: int, alpha: float | Penalty = 0.6, nbest: int = 1,
                use_cache: bool = True, interrupt: Interrupt | None = None,
                rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """The `nbest` highest-scoring outputs (<= beam_size) of each sentence, best first (beam.py's
    `Beam`): src (B, S) right-padded, max_len (B,) output tokens with eos; score = log P / lp(|y|)
    (alpha 0: log P alone). Without the cache each step feeds the whole output so far."""
    chooser = Beam(max_len.to(src.device), eos_id, beam_size, alpha, nbest)
    return run(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt,
               rules=rules)


def greedy(model: Seq2Seq, src: Tensor, max_len: Tensor, bos_id: int, eos_id: int,
           use_cache: bool = True) -> list[list[int]]:
    """Greedy token ids (without bos/eos) for a batch; see `greedy_search`."""
    hyps = greedy_search(model, src, max_len, bos_id=bos_id, eos_id=eos_id, use_cache=use_cache)
    return [h.tokens for h in hyps]


def search(model: Seq2Seq, tok: Tokenizer, src: Tensor, max_len: Tensor, cfg: DecodeConfig,
           use_cache: bool = True, interrupt: Interrupt | None = None,
           rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """n-best lists for src (B, S): greedy for beam_size 1, else beam search; `rules` as above."""
    max_len = max_len.to(src.device)
    chooser = (Greedy(max_len, tok.eos_id, cfg.penalty) if cfg.beam_size == 1 else
               Beam(max_len, tok.eos_id, cfg.beam_size, cfg.penalty, cfg.nbest))
    return run(model, src, chooser, bos_id=tok.bos_id, use_cache=use_cache, interrupt=interrupt,
               rules=rules)


def prepare_sources(tok: Tokenizer, texts: list[str], limit: int) -> list[list[int]]:
    """Source ids with eos, truncated to the model's position limit (one warning if any were)."""
    # lone surrogates (undecodable bytes in argv) are not text SentencePiece accepts: U+FFFD, as every input
    ids = tok.encode_src([clean(t) for t in texts])
    long = sum(len(s) + 1 > limit for s in ids)
    if long:
        log.warning("%d input line(s) longer than the model's limit of %d tokens were truncated",
                    long, limit)
    return [s[: limit - 1] + [tok.eos_id] for s in ids]


@dataclass(frozen=True)
class Translation:
    """One output sentence with its log P(y | x) and length-normalised score."""

    text: str
    log_prob: float
    score: float


def translations(tok: Tokenizer, nbest: list[Hypothesis]) -> list[Translation]:
    """Hypotheses (target ids) as texts with their scores."""
    texts = tok.decode_tgt([h.tokens for h in nbest])
    return [Translation(t, h.log_prob, h.score) for t, h in zip(texts, nbest, strict=True)]


def translate_batches(tok: Tokenizer, texts: list[str], limit: int, batch_size: int,
                      decode: Callable[[list[list[int]], list[int]], list[list[Hypothesis]]],
                      interrupt: Interrupt | None = None) -> list[list[Translation]]:
    """The batched translate loop of every decoder (ours, CTranslate2's): n-best translations of each text,
    in input order.

    Texts are encoded (truncated to `limit` positions), sorted by length into batches of `batch_size` so
    little padding is decoded, and each batch's source ids go to `decode` with the texts' indices (for what a
    caller gives per text), which returns its n-best lists;
    an empty (or all-space) text gets one empty translation. `interrupt` is called before each batch.
    """
    out: list[list[Translation]] = [[Translation("", 0.0, 0.0)] for _ in texts]
    todo = [i for i, t in enumerate(texts) if t.strip()]
    srcs = prepare_sources(tok, [texts[i].strip() for i in todo], limit) if todo else []
    order = sorted(range(len(todo)), key=lambda j: len(srcs[j]))
    for start in range(0, len(order), batch_size):
        if interrupt is not None:
            interrupt()
        chunk = order[start : start + batch_size]
        for j, nbest in zip(chunk, decode([srcs[j] for j in chunk], [todo[j] for j in chunk]), strict=True):
            out[todo[j]] = translations(tok, nbest)
    return out


def translate_nbest(model: Seq2Seq, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
                    device: torch.device | str = "cpu", use_cache: bool = True,
                    interrupt: Interrupt | None = None) -> list[list[Translation]]:
    """The `cfg.nbest` best translations of each text, best first, in input order (`translate_batches`);
    beam_size 1 is greedy decoding. `interrupt` is called before each decoder step."""
    model.eval()

    def decode(srcs: list[list[int]], _rows: list[int]) -> list[list[Hypothesis]]:
        src = pad(srcs, tok.pad_id).to(device)  # (B, S)
        max_len = max_lengths(torch.tensor([len(s) for s in srcs]), cfg, model.max_positions)
        return search(model, tok, src, max_len, cfg, use_cache, interrupt)

    return translate_batches(tok, texts, model.max_positions, cfg.batch_size, decode)


def translate(model: Seq2Seq, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
              device: torch.device | str = "cpu", use_cache: bool = True) -> list[str]:
    """The best translation of each text, in input order (greedy, or beam search if beam_size > 1)."""
    return [n[0].text for n in translate_nbest(model, tok, texts, cfg, device, use_cache)]
