"""Turning source text into target text: batched greedy decoding with a key/value cache."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from .config import DecodeConfig
from .data import pad
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)


def max_lengths(src_lens: Tensor, cfg: DecodeConfig, limit: int) -> Tensor:
    """Per-sentence output limit a * |src| + b tokens (eos included), capped at the model's limit."""
    return (src_lens.float() * cfg.max_len_a + cfg.max_len_b).long().clamp(max=limit)


@torch.inference_mode()
def greedy(model, src: Tensor, max_len: Tensor, bos_id: int, eos_id: int,
           use_cache: bool = True) -> list[list[int]]:
    """Most likely next token at each step, for a batch. src: (B, S); max_len: (B,).

    With the cache each step feeds only the newest token; without it, the whole prefix
    is re-run through the decoder (the slow way, kept for comparison and tests).
    Returns token ids without bos/eos.
    """
    b = src.size(0)
    src_mask = model.src_mask(src)
    memory = model.encode(src, src_mask)  # (B, S, D)
    cache = model.new_cache() if use_cache else None
    ys = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    done = torch.zeros(b, dtype=torch.bool, device=src.device)
    max_len = max_len.to(src.device)
    for step in range(int(max_len.max())):
        inp = ys[:, -1:] if use_cache else ys
        logits = model.decode(inp, memory, src_mask, cache)[:, -1]  # (B, V)
        nxt = logits.argmax(-1)
        nxt = torch.where(step + 1 >= max_len, torch.full_like(nxt, eos_id), nxt)  # forced stop
        nxt = nxt.masked_fill(done, eos_id)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    out = []
    for row in ys[:, 1:].tolist():
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


def prepare_sources(tok: Tokenizer, texts: list[str], limit: int) -> list[list[int]]:
    """Source ids with eos, truncated to the model's position limit (one warning if any were)."""
    ids = tok.encode_src(texts)
    long = sum(len(s) + 1 > limit for s in ids)
    if long:
        log.warning("%d input line(s) longer than the model's limit of %d tokens were truncated",
                    long, limit)
    return [s[: limit - 1] + [tok.eos_id] for s in ids]


def translate(model, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
              device: torch.device | str = "cpu", use_cache: bool = True) -> list[str]:
    """Translate `texts` in batches of similar length; outputs are in input order."""
    model.eval()
    out = [""] * len(texts)
    todo = [i for i, t in enumerate(texts) if t.strip()]
    if not todo:
        return out
    srcs = prepare_sources(tok, [texts[i].strip() for i in todo], model.max_positions)
    order = sorted(range(len(todo)), key=lambda j: len(srcs[j]))
    for start in range(0, len(order), cfg.batch_size):
        chunk = order[start : start + cfg.batch_size]
        src = pad([srcs[j] for j in chunk], tok.pad_id).to(device)
        lens = torch.tensor([len(srcs[j]) for j in chunk])
        hyps = greedy(model, src, max_lengths(lens, cfg, model.max_positions),
                      tok.bos_id, tok.eos_id, use_cache)
        for j, text in zip(chunk, tok.decode_tgt(hyps)):
            out[todo[j]] = text
    return out
