"""Turning source text into target text: batched greedy or beam search decoding with a key/value cache."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig, Penalty
from attn_mt.data.batching import pad
from attn_mt.data.checks import clean
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.beam import Hypothesis, beam_search, length_penalty
from attn_mt.decoding.rules import MaxLength, Rule, decode_step, step_rules
from attn_mt.models import Seq2Seq

log = logging.getLogger(__name__)
Interrupt = Callable[[], None]  # called before each decoder step; raises to abandon the call


def max_lengths(src_lens: Tensor, cfg: DecodeConfig, limit: int) -> Tensor:
    """Per-sentence output limit a * |src| + b tokens (eos included), capped at the model's limit."""
    return (src_lens.float() * cfg.max_len_a + cfg.max_len_b).long().clamp(max=limit)


@torch.inference_mode()
def greedy_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int,
                  alpha: float | Penalty = 0.0, use_cache: bool = True,
                  interrupt: Interrupt | None = None, rules: Sequence[Rule] = ()) -> list[Hypothesis]:
    """Most likely next token at each step, for a batch. src: (B, S); max_len: (B,).

    With the cache each step feeds only the newest token; without it, the whole prefix
    is re-run through the decoder (the slow way, kept for comparison and tests).
    Scores are log P / lp(length) as in beam search, so greedy and beam n-best compare. `rules` rule tokens
    out at each step (a forced target prefix, a sampled token: decoding/rules.py); log P stays the model's.
    """
    b = src.size(0)
    src_mask = model.src_mask(src)
    memory = model.encode(src, src_mask)  # (B, S, D)
    cache = model.new_cache() if use_cache else None
    limit = MaxLength(max_len.to(src.device), eos_id)
    rules = step_rules(model, rules, limit)
    ys = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1 + step)
    log_prob = torch.zeros(b, device=src.device)  # (B,) log P of each output so far
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    for step in range(int(max_len.max())):
        if interrupt is not None:
            interrupt()
        inp = ys[:, -1:] if use_cache else ys
        logp = decode_step(model, inp, memory, src_mask, cache, step=step, tokens=ys[:, 1:], rules=rules)
        nxt = limit.greedy(step, logp)
        nxt = nxt.masked_fill(done, eos_id)
        log_prob += logp.gather(1, nxt[:, None])[:, 0].masked_fill(done, 0.0)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    out = []
    for row, lp in zip(ys[:, 1:].tolist(), log_prob.tolist(), strict=True):
        tokens = row[: row.index(eos_id)] if eos_id in row else row
        out.append(Hypothesis(tokens, lp, lp / length_penalty(len(tokens) + 1, alpha)))
    return out


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
    ids = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, alpha=cfg.penalty, use_cache=use_cache, interrupt=interrupt,
               rules=rules)
    if cfg.beam_size == 1:
        return [[h] for h in greedy_search(model, src, max_len, **ids)]
    return beam_search(model, src, max_len, beam_size=cfg.beam_size, nbest=cfg.nbest, **ids)


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
