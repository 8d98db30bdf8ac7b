"""Turning source text into target text: batched greedy or beam search decoding with a key/value cache."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig, Penalty
from attn_mt.data.batching import pad
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.beam import Hypothesis, beam_search, length_penalty, log_probs
from attn_mt.models import Seq2Seq

log = logging.getLogger(__name__)


def max_lengths(src_lens: Tensor, cfg: DecodeConfig, limit: int) -> Tensor:
    """Per-sentence output limit a * |src| + b tokens (eos included), capped at the model's limit."""
    return (src_lens.float() * cfg.max_len_a + cfg.max_len_b).long().clamp(max=limit)


@torch.inference_mode()
def greedy_search(model: Seq2Seq, src: Tensor, max_len: Tensor, *, bos_id: int, eos_id: int,
                  alpha: float | Penalty = 0.0, use_cache: bool = True) -> list[Hypothesis]:
    """Most likely next token at each step, for a batch. src: (B, S); max_len: (B,).

    With the cache each step feeds only the newest token; without it, the whole prefix
    is re-run through the decoder (the slow way, kept for comparison and tests).
    Scores are log P / lp(length) as in beam search, so greedy and beam n-best compare.
    """
    b = src.size(0)
    src_mask = model.src_mask(src)
    memory = model.encode(src, src_mask)  # (B, S, D)
    cache = model.new_cache() if use_cache else None
    ys = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    log_prob = torch.zeros(b, device=src.device)  # (B,) log P of each output so far
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    max_len = max_len.to(src.device)
    for step in range(int(max_len.max())):
        inp = ys[:, -1:] if use_cache else ys
        logp = log_probs(model, model.decode(inp, memory, src_mask, cache)[:, -1])  # (B, V)
        nxt = logp.argmax(-1)
        nxt = torch.where(step + 1 >= max_len, torch.full_like(nxt, eos_id), nxt)  # forced stop
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
    # lone surrogates (undecodable bytes in argv) are not text SentencePiece accepts: use U+FFFD
    ids = tok.encode_src([t.encode("utf-8", "replace").decode("utf-8") for t in texts])
    long = sum(len(s) + 1 > limit for s in ids)
    if long:
        log.warning("%d input line(s) longer than the model's limit of %d tokens were truncated",
                    long, limit)
    return [s[: limit - 1] + [tok.eos_id] for s in ids]


def search(model: Seq2Seq, tok: Tokenizer, src: Tensor, max_len: Tensor, cfg: DecodeConfig,
           use_cache: bool = True) -> list[list[Hypothesis]]:
    """n-best lists for a batch of source ids (B, S): greedy for beam_size 1, else beam search."""
    ids = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, alpha=cfg.penalty, use_cache=use_cache)
    if cfg.beam_size == 1:
        return [[h] for h in greedy_search(model, src, max_len, **ids)]
    return beam_search(model, src, max_len, beam_size=cfg.beam_size, nbest=cfg.nbest, **ids)


@dataclass(frozen=True)
class Translation:
    """One output sentence with its log P(y | x) and length-normalised score."""

    text: str
    log_prob: float
    score: float


def translate_nbest(model: Seq2Seq, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
                    device: torch.device | str = "cpu", use_cache: bool = True) -> list[list[Translation]]:
    """The `cfg.nbest` best translations of each text, best first, in input order.

    Texts are sorted by length into batches of `cfg.batch_size` so little padding is decoded;
    beam_size 1 is greedy decoding. An empty (or all-space) text gives one empty translation.
    """
    model.eval()
    out: list[list[Translation]] = [[Translation("", 0.0, 0.0)] for _ in texts]
    todo = [i for i, t in enumerate(texts) if t.strip()]
    if not todo:
        return out
    srcs = prepare_sources(tok, [texts[i].strip() for i in todo], model.max_positions)
    order = sorted(range(len(todo)), key=lambda j: len(srcs[j]))
    for start in range(0, len(order), cfg.batch_size):
        chunk = order[start : start + cfg.batch_size]
        src = pad([srcs[j] for j in chunk], tok.pad_id).to(device)  # (B, S)
        lens = torch.tensor([len(srcs[j]) for j in chunk])
        hyps = search(model, tok, src, max_lengths(lens, cfg, model.max_positions), cfg, use_cache)
        for j, nbest in zip(chunk, hyps, strict=True):
            texts_j = tok.decode_tgt([h.tokens for h in nbest])
            out[todo[j]] = [Translation(t, h.log_prob, h.score) for t, h in zip(texts_j, nbest, strict=True)]
    return out


def translate(model: Seq2Seq, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
              device: torch.device | str = "cpu", use_cache: bool = True) -> list[str]:
    """The best translation of each text, in input order (greedy, or beam search if beam_size > 1)."""
    return [n[0].text for n in translate_nbest(model, tok, texts, cfg, device, use_cache)]
