"""The probe sentences of a run's attention history (history.py), and what one evaluation measures
on them.

The probes, chosen when the run starts and kept in the file (a resumed run uses the same): the first
N_VALID validation pairs of at most MAX_LEN pieces a side (source with eos, decoder input with bos);
the valid split's contrastive items where the data has them (the pronoun variant), at most N_ITEMS;
and, for an English source and German target, the classic sentence "the animal didn't cross the
street because it was too tired." and its "too wide" twin (data/pronoun.py's `classic`, with its
German). Each probe runs teacher-forced on its reference, so that every evaluation's maps have the
same shape; in eval mode, without gradients (history.Recorder leaves the model's mode and every
random stream as they were: a run records the same weights as one that does not). Entropy counts the
keys a query may see: real (non-pad) ones, and in decoder self-attention none after it; a query that
sees one key only (the decoder's first) is left out.

One job: the probes and one evaluation's measures on them. Tested in tests/analysis/test_history.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attn_mt.config import ExperimentConfig
from attn_mt.data.batching import collate
from attn_mt.data.corpus import Corpus
from attn_mt.data.pronoun import classic
from attn_mt.data.sources import source
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.contrastive import items_from_records
from attn_mt.models import AttentionWeights, Seq2Seq
from attn_mt.models.attention import causal_mask

from . import coref
from .roles import ROLES, Keys, RoleSums, key_info

N_VALID = 4  # validation probes
MAX_LEN = 12  # pieces a side of a validation probe (eos, bos included): history_file's size bound
N_ITEMS = 32  # contrastive probes at most
PROBE_KINDS = ("valid", "contrastive", "classic")


@dataclass(frozen=True)
class Probe:
    kind: str  # "valid" | "contrastive" | "classic"
    source: str  # the source sentence
    target: str  # the reference: the maps are recorded teacher-forced on it (one shape each step)
    src_tokens: list[str]  # S pieces, eos included
    tgt_tokens: list[str]  # T pieces: the decoder input (bos + reference pieces)


def module_shape(name: str, probe: Probe) -> tuple[int, int]:
    """(queries, keys) of a module for a probe: encoder self S x S, decoder self T x T,
    cross T x S."""
    s, t = len(probe.src_tokens), len(probe.tgt_tokens)
    if name.endswith("cross"):
        return t, s
    return (s, s) if name.startswith("encoder") else (t, t)


def make_probe(kind: str, src: str, ref: str, tok: Tokenizer) -> Probe:
    """A probe of a sentence pair, its pieces as the model reads them (source and eos; bos and the
    reference)."""
    src, ref = src.strip(), ref.strip()
    s_ids, t_ids = tok.encode_src([src])[0], tok.encode_tgt([ref])[0]
    return Probe(kind, src, ref, [tok.src.id_to_piece(i) for i in [*s_ids, tok.eos_id]],
                 tok.tgt_pieces([tok.bos_id, *t_ids]))


def choose_probes(corpus: Corpus, cfg: ExperimentConfig) -> tuple[list[Probe], list[dict]]:
    """The probes of a new history (the module docstring), and the contrastive probes' records."""
    tok, limit, data = corpus.tok, cfg.model.max_positions, cfg.data
    longest = min(MAX_LEN, limit)
    probes: list[Probe] = []
    for src, ref in zip(*corpus.text[data.splits.valid], strict=True):
        if len(probes) == N_VALID:
            break
        if src.strip() and ref.strip():
            p = make_probe("valid", src, ref, tok)
            if max(len(p.src_tokens), len(p.tgt_tokens)) <= longest:
                probes.append(p)
    records: list[dict] = []
    for record in source(data).contrastive(data.splits.valid) or []:
        if len(records) == N_ITEMS:
            break
        item = items_from_records([record])[0]
        if coref.locate(item, tok, limit) is not None:
            probes.append(make_probe("contrastive", item.src, item.ref, tok))
            records.append(record)
    if (data.src_lang, data.tgt_lang) == ("en", "de"):
        for predicate in ("tired", "wide"):
            ex = classic(predicate)
            p = make_probe("classic", ex.en, ex.de, tok)
            if max(len(p.src_tokens), len(p.tgt_tokens)) <= limit:
                probes.append(p)
    return probes, records


@dataclass
class Prepared:
    """The probes as one teacher-forced batch, and what the roles and coreference need of it."""

    src: Tensor  # (P, S) source ids, eos, padding
    tgt_in: Tensor  # (P, T) bos, reference ids, padding
    src_keys: Keys
    tgt_keys: Keys
    rows: list[int]  # the contrastive probes' rows
    located: list[coref.Located]  # theirs, in order
    items: list  # their decoding.contrastive Items


def prepare(probes: list[Probe], records: list[dict], tok: Tokenizer,
            limit: int) -> Prepared | None:
    """The batch of `probes`; None where there are none, or where this tokenizer does not give their
    pieces (they were chosen by another)."""
    if not probes or any(make_probe(p.kind, p.source, p.target, tok) != p for p in probes):
        return None
    s_ids = tok.encode_src([p.source for p in probes])
    t_ids = tok.encode_tgt([p.target for p in probes])
    rows = [i for i, p in enumerate(probes) if p.kind == "contrastive"]
    items = items_from_records(records) if records else []
    located = [coref.locate(i, tok, limit) for i in items]
    if len(rows) != len(items) or any(x is None for x in located):
        return None
    batch = collate(s_ids, t_ids, tok.pad_id, tok.bos_id, tok.eos_id)
    src_counts = Counter(i for s in s_ids for i in s)
    tgt_counts = Counter(i for t in t_ids for i in t)
    src_keys = key_info(batch.src, tok.src, src_counts, tok.pad_id, tok.eos_id)
    tgt_keys = key_info(batch.tgt_in, tok.tgt, tgt_counts, tok.pad_id, tok.bos_id)
    return Prepared(batch.src, batch.tgt_in, src_keys, tgt_keys, rows,
                    [x for x in located if x is not None], items)


@dataclass
class Record:
    """One evaluation's measures (A modules, H heads, P probes)."""

    modules: list[str]
    roles: np.ndarray  # (R, A, H)
    entropy: np.ndarray  # (A, H)
    coref: np.ndarray | None  # (A, H)
    contrastive: float | None
    maps: list[list[np.ndarray]]  # [p][a] (H, Q, K) float16


def entropy(w: Tensor, allowed: Tensor, q_valid: Tensor) -> Tensor:
    """(H,) the mean over the real queries that see two keys or more (`allowed` (B, Tq, Tk),
    `q_valid` (B, Tq)) of the entropy of their weights w (B, H, Tq, Tk) over log(#keys they see);
    NaN where no query does."""
    n = allowed.sum(-1)  # (B, Tq)
    use = q_valid & (n >= 2)
    ent = -(w * w.clamp_min(1e-30).log()).sum(-1) / n.clamp_min(2).log()[:, None]  # (B, H, Tq)
    count = use.sum()
    if not count:
        return torch.full((w.size(1),), float("nan"))
    return (ent * use[:, None]).sum((0, 2)) / count


def _modules(model_kind: str, weights: AttentionWeights) -> list[tuple[str, str, int, Tensor]]:
    """(name, coref kind, layer, weights (P, H, Tq, Tk)) of every attention module, kind by kind."""
    if model_kind == "rnn":
        return [("decoder cross", "cross", 0, weights.cross[0])]
    return [(f"{side} {i + 1} {what}", kind, i, w) for side, what, kind, ws in (
        ("encoder", "self", "encoder", weights.encoder_self),
        ("decoder", "self", "decoder", weights.decoder_self),
        ("decoder", "cross", "cross", weights.cross)) for i, w in enumerate(ws)]


@torch.inference_mode()
def measure(model: Seq2Seq, tok: Tokenizer, model_kind: str, probes: list[Probe],
            prep: Prepared) -> Record:
    """The probes' attention in `model` as it is, teacher-forced, and what is measured on it."""
    device = next(model.parameters()).device
    weights = AttentionWeights()
    src, tgt_in = prep.src.to(device), prep.tgt_in.to(device)
    src_mask = model.src_mask(src)
    model.decode(tgt_in, model.encode(src, src_mask, weights), src_mask, weights=weights)
    modules = [(name, kind, layer, w.float().cpu())
               for name, kind, layer, w in _modules(model_kind, weights)]
    roles, entropies = [], []
    for _, kind, _, w in modules:
        keys = prep.tgt_keys if kind == "decoder" else prep.src_keys
        queries = prep.src_keys.valid if kind == "encoder" else prep.tgt_keys.valid
        sums = RoleSums(w.size(1))
        sums.add(w, queries, keys, self_attention=kind != "cross", causal=kind == "decoder")
        shares = sums.shares()
        roles.append([[np.nan if x[r] is None else x[r] for x in shares] for r in ROLES])  # (R, H)
        allowed = keys.valid[:, None, :].expand(-1, w.size(2), -1)  # (P, Tq, Tk)
        if kind == "decoder":
            allowed = allowed & causal_mask(w.size(2))
        entropies.append(entropy(w, allowed, queries).numpy())
    maps = [[w[p, :, :q, :k].to(torch.float16).numpy() for name, _, _, w in modules
             for q, k in [module_shape(name, probe)]] for p, probe in enumerate(probes)]
    coref_share, contrastive = None, None
    if prep.rows:
        coref_share = resolved(modules, prep)
        contrastive = coref.accuracy(model, tok, prep.items, device).accuracy
    return Record([m[0] for m in modules], np.array(roles, dtype=np.float32).transpose(1, 0, 2),
                  np.array(entropies, dtype=np.float32), coref_share, contrastive, maps)


def resolved(modules: list[tuple[str, str, int, Tensor]], prep: Prepared) -> np.ndarray:
    """(A, H) the share of the contrastive probes each head resolves (coref.py)."""
    layers, heads = Counter(kind for _, kind, _, _ in modules), modules[0][3].size(1)
    out = {kind: coref.Resolution(*(torch.zeros(n, heads, dtype=torch.float64) for _ in range(3)),
                                  len(prep.rows)) for kind, n in layers.items()}
    by_kind: dict[str, list[Tensor]] = {}
    for _, kind, _, w in modules:
        by_kind.setdefault(kind, []).append(w[prep.rows])
    coref.tally(out, prep.located, by_kind)
    return np.array([(out[kind].resolved[layer] / len(prep.rows)).numpy()
                     for _, kind, layer, _ in modules])

