"""Turning source text into target text: batched greedy or beam search decoding with a key/value cache.

One loop, one step at a time (`advance`): a decoder step (decoding/rules.py's `decode_step`), then a chooser
picks each row's next token: `Greedy` here, `Beam` in beam.py. `steps` runs it over a fixed batch (greedy and
beam search, the stream of api/steering.py); continuous.py's running batch runs it over sentences that join
and leave at every step, with the same choosers. Tested in tests/decoding/test_search.py.

One job: searching for translations, from the step to the batched translate calls built on it.
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
    """What the search loop asks of a search at each step: greedy (`Greedy`) or beam (beam.py's `Beam`)."""

    k: int  # decoder rows per sentence: 1 for greedy, the beam size for beam search
    limit: MaxLength  # the output length limit on those rows (the last rule of every step)

    def choose(self, step: int | Tensor, logp: Tensor, ys: Tensor) -> tuple[Tensor, Tensor | None]:
        """The step's tokens (rows,) from logp (rows, V) and ys (rows, 1 + W), and the rows of ys they
        extend ((rows,) indices; None: each row its own). `step`: every row's (an int), or each row's own."""
        ...

    def done(self) -> bool:
        """Whether nothing left to decode can change the outcome."""
        ...

    def nbest(self, ys: Tensor, sentences: list[int] | None = None) -> list[list[Hypothesis]]:
        """The n-best lists of `sentences` (default: all), best first (ys: (rows, 1 + W))."""
        ...


def advance(model: Seq2Seq, ys: Tensor, step: int | Tensor, chooser: Chooser, *, memory: Tensor | None,
            src_mask: Tensor, cache, rules: Sequence[Rule]) -> tuple[Tensor, Tensor | None]:
    """One pass of the search loop: each row's next token (rows,) and the rows of ys they extend (None: in
    place), from `decode_step` on each row's newest token (the whole prefix without a cache), then the chooser.

    ys: (rows, 1 + W) bos and each row's tokens, the newest at column `step`: an int where every row is at the
    same step (`steps`), (rows,) where each row is at its own (a running batch: rows right-padded).
    """
    if cache is None:
        inp = ys
    elif isinstance(step, int):
        inp = ys[:, step : step + 1]
    else:
        inp = ys.gather(1, step[:, None])  # (rows, 1)
    logp = decode_step(model, inp, memory, src_mask, cache, step=step, tokens=ys[:, 1:], rules=rules)
    return chooser.choose(step, logp, ys)


def steps(model: Seq2Seq, src: Tensor, chooser: Chooser, *, bos_id: int, use_cache: bool = True,
          interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> Iterator[Tensor]:
    """The search loop over a fixed batch: greedy, beam and the stream (run it under torch.inference_mode()):
    encode src (B, S), then `advance` a step at a time; yields ys (rows, 1 + step), bos first, after each step,
    until the chooser is done or every row is at its length limit.

    With the cache each step feeds only the newest token; without it, the whole prefix is re-run through the
    decoder (the slow way, kept for comparison and tests). `rules` (a forced target prefix, a sampled token:
    decoding/rules.py) come between the model's banned ids and the length limit.
    """
    src_mask = model.src_mask(src)
    memory = model.encode(src, src_mask)  # (B, S, D)
    if chooser.k > 1:  # k consecutive rows per sentence
        memory, src_mask = memory.repeat_interleave(chooser.k, dim=0), src_mask.repeat_interleave(chooser.k, dim=0)
    cache = model.new_cache() if use_cache else None
    rules = step_rules(model, rules, chooser.limit)
    ys = torch.full((memory.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (rows, 1 + step)
    for step in range(int(chooser.limit.max_len.max())):
        if interrupt is not None:
            interrupt()
        nxt, rows = advance(model, ys, step, chooser, memory=memory, src_mask=src_mask, cache=cache, rules=rules)
        if rows is not None:
            ys = ys[rows]
            if cache is not None:
                cache.reorder(rows)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        yield ys
        if chooser.done():
            return


@torch.inference_mode()
def run(model: Seq2Seq, src: Tensor, chooser: Chooser, *, bos_id: int, use_cache: bool = True,
        interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """The chooser's n-best lists once the search loop (`steps`) has run to its end."""
    loop = steps(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt, rules=rules)
    return chooser.nbest(deque(loop, maxlen=1)[0])  # the last step's ys


class Greedy:
    """Greedy search's chooser: the most likely token of each row (a row per sentence), kept in place; a row
    that has ended adds eos. Scores are log P / lp(length) as in beam search, so greedy and beam n-best
    compare; `alpha` is each sentence's own (a list) or one for all."""

    k = 1

    def __init__(self, max_len: Tensor, eos_id: int, alpha: float | Penalty | list = 0.0) -> None:
        self.limit = MaxLength(max_len, eos_id)  # max_len: (B,)
        self.eos_id = eos_id
        self.alpha = alpha if isinstance(alpha, list) else [alpha] * len(max_len)  # (B,)
        self.log_prob = torch.zeros(len(max_len), device=max_len.device)  # (B,) log P of each output so far
        self.ended = torch.zeros(len(max_len), dtype=torch.bool, device=max_len.device)  # (B,)

    def choose(self, step: int | Tensor, logp: Tensor, ys: Tensor) -> tuple[Tensor, None]:
        nxt = self.limit.greedy(step, logp).masked_fill(self.ended, self.eos_id)  # (B,)
        self.log_prob += logp.gather(1, nxt[:, None])[:, 0].masked_fill(self.ended, 0.0)
        self.ended |= nxt == self.eos_id
        return nxt, None

    def done(self) -> bool:
        return bool(self.ended.all())

    def nbest(self, ys: Tensor, sentences: list[int] | None = None) -> list[list[Hypothesis]]:
        """Each sentence's one hypothesis (of `sentences`, all by default): its tokens up to eos."""
        sentences = list(range(len(self.alpha))) if sentences is None else sentences
        idx = torch.tensor(sentences, dtype=torch.long, device=ys.device)
        out = []
        for s, row, lp in zip(sentences, ys[idx, 1:].tolist(), self.log_prob[idx].tolist(), strict=True):
            tokens = row[: row.index(self.eos_id)] if self.eos_id in row else row
            out.append([Hypothesis(tokens, lp, lp / length_penalty(len(tokens) + 1, self.alpha[s]))])
        return out


def greedy_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int,
                  alpha: float | Penalty = 0.0, use_cache: bool = True,
                  interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> list[Hypothesis]:
    """The most likely next token at each step, for a batch (`Greedy`). src: (B, S); max_len: (B,) >= 1.
    `rules` rule tokens out at each step (a forced target prefix, a sampled token); log P stays the model's."""
    chooser = Greedy(max_len.to(src.device), eos_id, alpha)
    nbest = run(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt, rules=rules)
    return [n[0] for n in nbest]


def beam_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int, beam_size: int,
                alpha: float | Penalty = 0.6, nbest: int = 1, use_cache: bool = True,
                interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """The `nbest` highest-scoring outputs for each source sentence, best first (beam.py's `Beam`).

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
    """
    chooser = Beam(max_len.to(src.device), eos_id, beam_size, alpha, nbest)
    return run(model, src, chooser, bos_id=bos_id, use_cache=use_cache, interrupt=interrupt, rules=rules)


def greedy(model: Seq2Seq, src: Tensor, max_len: Tensor, bos_id: int, eos_id: int,
           use_cache: bool = True) -> list[list[int]]:
    """Greedy token ids (without bos/eos) for a batch; see `greedy_search`."""
    return [h.tokens for h in greedy_search(model, src, max_len, bos_id=bos_id, eos_id=eos_id,
                                            use_cache=use_cache)]


def prepare_sources(tok: Tokenizer, texts: list[str], limit: int) -> list[list[int]]:
    """Source ids with eos, truncated to the model's position limit (one warning if any were)."""
    # lone surrogates (undecodable bytes in argv) are not text SentencePiece accepts: U+FFFD, as every input
    ids = tok.encode_src([clean(t) for t in texts])
    long = sum(len(s) + 1 > limit for s in ids)
    if long:
        log.warning("%d input line(s) longer than the model's limit of %d tokens were truncated",
                    long, limit)
    return [s[: limit - 1] + [tok.eos_id] for s in ids]


def search(model: Seq2Seq, tok: Tokenizer, src: Tensor, max_len: Tensor, cfg: DecodeConfig,
           use_cache: bool = True, interrupt: Interrupt | None = None,
           rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """n-best lists for a batch of source ids (B, S): greedy for beam_size 1, else beam search; `rules` beyond
    the model's and the length limit (decoding/rules.py)."""
    max_len = max_len.to(src.device)
    chooser = (Greedy(max_len, tok.eos_id, cfg.penalty) if cfg.beam_size == 1 else
               Beam(max_len, tok.eos_id, cfg.beam_size, cfg.penalty, cfg.nbest))
    return run(model, src, chooser, bos_id=tok.bos_id, use_cache=use_cache, interrupt=interrupt, rules=rules)


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
