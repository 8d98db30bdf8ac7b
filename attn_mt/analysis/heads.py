"""Which heads matter and what each one does: each masked in turn and measured; which to prune.

Mask one head at a time and measure the change in BLEU and loss (Michel et al., NeurIPS 2019),
measure its roles (roles.py), and choose the heads to prune.

Masking and pruning a head: masking.py. BLEU is greedy (evaluate with beam 1 scores the same), loss
is the mean per-token cross-entropy of the references, teacher-forced.

Given a contrastive set with word positions (`items`), each head also gets its coreference measures
(coref.py: how often its attention from the pronoun prefers the antecedent to the other noun) and
the contrastive accuracy with it masked; the top resolving heads of each kind are then masked
together.

Pruning removes, one at a time, the head whose masking raises the loss least, re-measuring the
others after each removal (the loss is smooth where BLEU on a few hundred sentences moves in noisy
steps), then writes the result into the weights (masking.prune); pruned.py makes the checkpoint.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from attn_mt.config import DecodeConfig
from attn_mt.data.batching import Batch, collate
from attn_mt.data.lines import DataError
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.contrastive import Item
from attn_mt.decoding.metrics import bleu
from attn_mt.decoding.translate import translate
from attn_mt.errors import InputError
from attn_mt.models import AttentionWeights, mean_loss
from attn_mt.models.transformer import Transformer

from . import coref, intervals
from .masking import Head, all_heads, attention_modules, masked, prune
from .overview import HeadsReport
from .roles import RoleSums, key_info

BATCH = 50  # sentences per teacher-forced batch


class HeadsError(DataError):
    """Bad input to `attn-mt heads` (one line naming the flag)."""


def check_request(src: Path | None, ref: Path | None, contrastive: Path | None, n: int = 0,
                  out: Path | None = None) -> None:
    """What `attn-mt heads` needs, checked before a model loads: `src` with `ref`, `contrastive`, or
    both; and a pruning count `n` with the `out` file it writes, or neither."""
    if n and out is None:
        raise InputError(f"`n` {n} needs `out` FILE: where to write the pruned checkpoint")
    if out is not None and not n:
        raise InputError("`out` is where `n` writes the pruned checkpoint; give `n` too")
    if (src is None) != (ref is None) or (src is None and contrastive is None):
        raise InputError("give `src` with `ref` (sentences and their references), `contrastive` "
                         "FILE, or both")
    # Model.prune measures BLEU on sentences, not on a set
    if n and (src is None or contrastive is not None):
        raise InputError("pruning (`n`) measures each head on `src` and `ref`; give them, without "
                         "`contrastive`", "contrastive" if contrastive is not None else "src")


@dataclass
class Sentences:
    """The analysed sentences: texts for BLEU, teacher-forced batches (reference targets) for loss
    and roles, and how often each subword occurs in them, per side (the rarest token of
    roles.py)."""

    src: list[str]
    ref: list[str]
    batches: list[Batch]
    src_counts: Counter
    tgt_counts: Counter


def sentences(src: list[str], ref: list[str], tok: Tokenizer, limit: int) -> Sentences:
    """Batches of `src` and `ref` of at most `limit` positions a side (the model's), sorted by
    length."""
    s_ids = [s[: limit - 1] for s in tok.encode_src(src)]  # collate appends eos
    # and puts bos in front of the decoder input
    t_ids = [t[: limit - 1] for t in tok.encode_tgt(ref)]
    order = sorted(range(len(src)), key=lambda i: (len(s_ids[i]), len(t_ids[i])))
    chunks = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    batches = [collate([s_ids[i] for i in c], [t_ids[i] for i in c], tok.pad_id, tok.bos_id,
                       tok.eos_id)
               for c in chunks]
    return Sentences(src, ref, batches, Counter(i for s in s_ids for i in s),
                     Counter(i for t in t_ids for i in t))


def measure(model: Transformer, tok: Tokenizer, data: Sentences, dcfg: DecodeConfig,
            device: torch.device) -> tuple[float, float, list[str]]:
    """(BLEU of the translations, loss of the references, the translations) on the analysed
    sentences."""
    hyps = translate(model, tok, data.src, dcfg, device)
    return bleu(hyps, data.ref), mean_loss(model, data.batches, model.pad_id, device), hyps


@torch.inference_mode()
def measure_roles(model: Transformer, tok: Tokenizer, data: Sentences, device: torch.device,
                  ) -> dict[Head, dict[str, float | None]]:
    """Every head's roles (roles.py) on the teacher-forced references."""
    sums = {(kind, i): RoleSums(m.n_heads) for kind, mods in attention_modules(model).items()
            for i, m in enumerate(mods)}
    for batch in data.batches:
        weights = AttentionWeights()
        src, tgt_in = batch.src.to(device), batch.tgt_in.to(device)
        src_mask = model.src_mask(src)
        model.decode(tgt_in, model.encode(src, src_mask, weights), src_mask, weights=weights)
        src_keys = key_info(batch.src, tok.src, data.src_counts, tok.pad_id, tok.eos_id)
        tgt_keys = key_info(batch.tgt_in, tok.tgt, data.tgt_counts, tok.pad_id, tok.bos_id)
        for kind, ws, keys, queries in (("encoder", weights.encoder_self, src_keys, src_keys.valid),
                                        ("decoder", weights.decoder_self, tgt_keys, tgt_keys.valid),
                                        ("cross", weights.cross, src_keys, tgt_keys.valid)):
            for i, w in enumerate(ws):
                sums[kind, i].add(w.float().cpu(), queries, keys, self_attention=kind != "cross",
                                  causal=kind == "decoder")
    return {Head(kind, i + 1, h + 1): shares for (kind, i), s in sums.items()
            for h, shares in enumerate(s.shares())}


def analyse(model: Transformer, cfg, tok: Tokenizer, sources: list[str], refs: list[str], *,
            name: str, before: list[Head] = (), n_sentences: int = 200, prune_n: int = 0,
            device: torch.device | str = "cpu", items: Sequence[Item] = (),
            ) -> tuple[HeadsReport, list[Head]]:
    """Mask every head of a loaded Transformer in turn on the first `n_sentences` of
    `sources`/`refs`, measure the roles (and on the first `n_sentences` contrastive `items`,
    coreference), and with `prune_n` prune that many heads greedily, in place; returns the report
    and the heads pruned (`name` labels the report: the checkpoint's path)."""
    if len(sources) != len(refs):
        raise HeadsError(f"sources and references differ: {len(sources)} against {len(refs)} lines",
                         "refs")
    if not sources:
        raise HeadsError("no sentences to analyse", "sources")
    dev = torch.device(device)
    before = list(before)
    heads = all_heads(model)
    if prune_n > len(heads) - len(before):
        left = f" ({len(before)} pruned already)" if before else ""
        raise HeadsError(f"cannot prune {prune_n} heads: the model has {len(heads)}{left}", "prune")
    data = sentences(sources[:n_sentences], refs[:n_sentences], tok, model.max_positions)
    dcfg = replace(cfg.decode, beam_size=1, nbest=1)
    start = time.perf_counter()
    items = list(items)[:n_sentences]
    accuracy = ((lambda: coref.accuracy(model, tok, items, dev).accuracy) if items
                else (lambda: None))  # noqa: E731
    base_bleu, base_loss, base_hyps = measure(model, tok, data, dcfg, dev)
    base_acc = accuracy()
    masked_scores, stats = {}, {}
    for h in tqdm(heads, desc="masking heads", unit="head", disable=None, leave=False):
        with masked(model, [h]):
            b, loss, hyps = measure(model, tok, data, dcfg, dev)
            masked_scores[h] = (b, loss, accuracy())
        stats[h] = intervals.sentence_stats(hyps, data.ref)
    per_head = (time.perf_counter() - start) / (len(heads) + 1)
    roles = measure_roles(model, tok, data, dev)
    base_stats, idx = intervals.sentence_stats(base_hyps, data.ref), intervals.draws(len(data.src))
    rows = [{"kind": h.kind, "layer": h.layer, "head": h.head, "bleu": b, "loss": round(loss, 4),
             "d_bleu": round(b - base_bleu, 2),
             **dict(zip(("d_bleu_low", "d_bleu_high"),
                        intervals.delta_interval(base_stats, stats[h], idx), strict=True)),
             "d_loss": round(loss - base_loss, 4), "roles": roles[h]}
            for h, (b, loss, _) in masked_scores.items()]
    report = HeadsReport(name, len(data.src), base_bleu, round(base_loss, 4), rows,
                         round(per_head, 2), pruned_before=[str(h) for h in before])
    if items:
        measure_coref(model, tok, items, dev, report, base_acc,
                      {h: acc for h, (_, _, acc) in masked_scores.items()})
    gone: list[Head] = []
    if prune_n:
        gone = prune_greedily(model, tok, data, dcfg, dev, prune_n,
                              [h for h in heads if h not in before],
                              {h: s[1] for h, s in masked_scores.items()}, before, report)
        prune(model, gone)
        # the pruned weights, no mask
        bleu_after, loss_after, _ = measure(model, tok, data, dcfg, dev)
        report.bleu_after, report.loss_after = bleu_after, round(loss_after, 4)
    report.seconds = round(time.perf_counter() - start, 1)
    return report, gone


def measure_coref(model: Transformer, tok: Tokenizer, items: list[Item], dev: torch.device,
                  report: HeadsReport, base: float, masked_accuracy: dict[Head, float]) -> None:
    """Fill in `report`'s coreference: each head's resolution (coref.py) and its masked contrastive
    accuracy, then the top resolving heads of each kind masked together (those of TOP that the kind
    has)."""
    report.contrastive = base
    resolution, located = coref.resolution(model, tok, items, dev)
    for row in report.heads:
        h = Head(row["kind"], row["layer"], row["head"])
        row["coref"] = resolution[h.kind].row(h.layer - 1, h.head - 1) if located else None
        row["contrastive"] = masked_accuracy[h]
        row["d_contrastive"] = round(masked_accuracy[h] - base, 4)
    top = []
    for kind in ("encoder", "cross") if located else ():
        ranked = sorted((r for r in report.heads if r["kind"] == kind),
                        key=lambda r: -r["coref"]["resolved"])
        for k in (k for k in coref.TOP if k <= len(ranked)):
            chosen = [Head(kind, r["layer"], r["head"]) for r in ranked[:k]]
            with masked(model, chosen):
                acc = coref.accuracy(model, tok, items, dev).accuracy
            top.append({"heads": [str(h) for h in chosen], "contrastive": acc,
                        "d_contrastive": round(acc - base, 4)})
    report.coref = {"items": len(items), "located": located, "top": top}


def prune_greedily(model: Transformer, tok: Tokenizer, data: Sentences, dcfg: DecodeConfig,
                   dev: torch.device, n: int, candidates: list[Head],
                   first_losses: dict[Head, float], before: list[Head],
                   report: HeadsReport) -> list[Head]:
    """Remove, n times, the candidate whose masking (with those removed so far) raises the loss
    least; each step's BLEU and loss go into `report.pruned`. Returns the removed heads in order."""
    gone, left = [], list(candidates)
    bar = tqdm(total=sum(len(left) - k for k in range(1, n)), desc="pruning", unit="head",
               disable=None, leave=False)
    for k in range(n):
        losses = dict(first_losses) if k == 0 else {}  # first step: the masking pass measured them
        for h in left if k else ():
            with masked(model, [*before, *gone, h]):
                losses[h] = mean_loss(model, data.batches, model.pad_id, dev)
            bar.update()
        best = min(left, key=lambda h: (losses[h], h))
        left.remove(best)
        gone.append(best)
        with masked(model, [*before, *gone]):
            b = bleu(translate(model, tok, data.src, dcfg, dev), data.ref)
        report.pruned.append({"head": str(best), "bleu": b, "loss": round(losses[best], 4)})
    bar.close()
    return gone
