"""Attention as it is learnt: at every evaluation of a run (train.record_attention, the default), and at step 0
before its first training step where the run starts fresh (BLEU unknown there), every head's attention on a few
fixed sentences, its role statistics (roles.py), entropy and coreference score (coref.py), kept in
RUN/attention_history.npz; `load_history(RUN)` (`attn_mt.history(RUN)`) reads it back as a `History`.

The probes, chosen when the run starts and kept in the file (a resumed run uses the same): the first N_VALID
validation pairs of at most MAX_LEN pieces a side (source with eos, decoder input with bos); the valid split's
contrastive items where the data has them (the pronoun variant), at most N_ITEMS; and, for an English source
and German target, the classic sentence "the animal didn't cross the street because it was too tired." and its
"too wide" twin (data/pronoun.py's `classic`, with its German). Each probe runs teacher-forced on its reference,
so that every evaluation's maps have the same shape; in eval mode, without gradients, leaving the model's mode and
every random stream as they were: a run records the same weights as one that does not.

The file: np.savez (uncompressed; read with allow_pickle=False), rewritten whole at each record through
RunDir.write_history (atomic). E records (step 0's, then one per evaluation), A attention modules, H heads,
P probes, R = len(ROLES):
    meta         (1,) str    JSON: format, model_kind, modules (A names), n_heads, roles (the R names), probes
                             (P objects: kind, source, target, src_tokens, tgt_tokens), items (the contrastive
                             probes' records, decoding/contrastive.py's format, in probe order)
    steps        (E,) int64  the step of each record, ascending (0 first where the run started fresh)
    bleu         (E,) float64        validation BLEU at that step (NaN: unknown, as at step 0)
    contrastive  (E,) float64        contrastive accuracy on the probe items (NaN: no items)
    entropy      (E, A, H) float32   mean attention entropy / log(#keys) over the probes' queries (1: uniform)
    roles        (R, E, A, H) float32  each role's share (roles.py; NaN where a role does not apply)
    coref        (E, A, H) float32   share of the contrastive probes each head resolves (only with items)
    map_{p}_{a}  (E, H, Q, K) float16  probe p's weights in module a: encoder self S x S, decoder self T x T,
                             cross T x S (S = len(src_tokens), T = len(tgt_tokens))
Entropy counts the keys a query may see: real (non-pad) ones, and in decoder self-attention none after it; a
query that sees one key only (the decoder's first) is left out.

Its size for configs/multi30k.yaml (the hour config; a German source: 4 validation probes, no items, no classic):
A = 9 modules (3 encoder self, 3 decoder self, 3 cross), H = 4, S, T <= MAX_LEN = 12, and step 0 and one evaluation
per epoch, at most 1 + max_epochs = 101 records (the hour on 2 CPU cores made 29-31 evaluations): maps at most
101 x 4 probes x 3 layers x 4 heads x (12*12 + 12*12 + 12*12) x 2 bytes = 4,188,672 bytes, roles 8 x 101 x 9 x 4 x
4 = 116,352, entropy 14,544, the rest (steps, BLEU, the meta's JSON as UTF-32, 42 arrays' npy and zip headers) under
40,000: at most 4,359,568 bytes (about 4.3 MB with Multi30k-length sentences; about 1.3 MB at 32 records). Past
MAX_RECORDS records a run records no more (the file would keep growing).

One job: a run's attention history: its probes, its recording at step 0 and each evaluation, its file.
Tested in tests/analysis/test_history.py.
"""

from __future__ import annotations

import json
import logging
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from attn_mt.config import ExperimentConfig
from attn_mt.data import checks
from attn_mt.data.batching import collate
from attn_mt.data.corpus import Corpus
from attn_mt.data.pronoun import classic
from attn_mt.data.sources import source
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.contrastive import items_from_records
from attn_mt.device import rng_state, set_rng_state
from attn_mt.errors import InputError
from attn_mt.models import AttentionWeights, Seq2Seq
from attn_mt.models.attention import causal_mask
from attn_mt.rundir import RunDir

from . import coref
from .roles import ROLES, Keys, RoleSums, key_info

if TYPE_CHECKING:
    from .history_view import HistoryView

log = logging.getLogger(__name__)

FORMAT = 1
N_VALID = 4  # validation probes
MAX_LEN = 12  # pieces a side of a validation probe (eos, bos included): the size bound above
N_ITEMS = 32  # contrastive probes at most
MAX_RECORDS = 200  # records at most (step 0's included)
PROBE_KINDS = ("valid", "contrastive", "classic")
EXPERT = tuple(r for r in ROLES if r != "conf")  # roles a head can be the expert of (conf: how sharp, not what)


@dataclass(frozen=True)
class Probe:
    kind: str  # "valid" | "contrastive" | "classic"
    source: str  # the source sentence
    target: str  # the reference target: the maps are recorded teacher-forced on it, the same shape at every step
    src_tokens: list[str]  # S pieces, eos included
    tgt_tokens: list[str]  # T pieces: the decoder input (bos + reference pieces)


@dataclass(frozen=True, eq=False)
class History:
    """A run's recorded attention, evaluation by evaluation, from step 0 (the untrained model) where the run started
    fresh (the module docstring: shapes and meanings)."""

    model_kind: str  # "transformer" | "rnn"
    steps: list[int]  # E evaluations, ascending; 0 first (before training) where the run started fresh
    modules: list[str]  # A modules: "encoder 1 self", ..., "decoder 1 self", ..., "decoder 1 cross", ...
    #                     (kind by kind, layer by layer); the RNN: ["decoder cross"]
    n_heads: int  # H (the RNN: 1)
    roles: dict[str, np.ndarray]  # role (roles.ROLES) -> (E, A, H) float32, NaN where the role does not apply
    entropy: np.ndarray  # (E, A, H) mean entropy over the probes' queries / log(#keys): 1.0 = uniform
    coref: np.ndarray | None  # (E, A, H) share of the contrastive probes this head resolves; None without them
    contrastive: list[float | None]  # (E,) contrastive accuracy on the probe items; None without them
    bleu: list[float | None]  # (E,) validation BLEU at that step (None: unknown, as at step 0)
    probes: list[Probe]  # P probe sentences
    maps: list[list[np.ndarray]]  # maps[p][a]: (E, H, Q, K) float16, queries x keys of module a for probe p
    items: list[dict] = field(default_factory=list, repr=False)  # the contrastive probes' records, in probe order

    def view(self, name: str = "") -> HistoryView:
        """The history drawn (history_view.py): a notebook shows its page (a step slider over every head's map and
        role curves); `.save_html(path)` writes the page, `.save_png(path)` the summary picture. `name`: a title."""
        from .history_view import HistoryView

        return HistoryView(self, checks.text(name, "name", empty=True))

    def role_step(self, min_share: float = 0.5) -> dict[tuple[int, int], tuple[str, int] | None]:
        """(module, head) -> (its dominant role at the last evaluation, the step from which it has held it), or None
        where no role reaches `min_share` then. A head holds a role at an evaluation when that role's value (a
        share of its attention; mono: a rank correlation) is at least `min_share`; the dominant one is the largest
        of those it holds (EXPERT: every role but conf)."""
        out: dict[tuple[int, int], tuple[str, int] | None] = {}
        if not self.steps:
            return {(a, h): None for a in range(len(self.modules)) for h in range(self.n_heads)}
        values = np.stack([self.roles[r] for r in EXPERT])  # (R', E, A, H)
        held = np.nan_to_num(values, nan=-np.inf) >= min_share
        for a in range(len(self.modules)):
            for h in range(self.n_heads):
                last = np.where(held[:, -1, a, h], values[:, -1, a, h], -np.inf)
                if not held[:, -1, a, h].any():
                    out[a, h] = None
                    continue
                r = int(np.argmax(last))
                out[a, h] = (EXPERT[r], self.steps[_held_since(held[r, :, a, h])])
        return out

    def coref_step(self, threshold: float = 0.8) -> tuple[int, int, int] | None:
        """(module, head, step) of the head that resolves the most contrastive probes at the last evaluation, if it
        resolves at least `threshold` of them, with the step from which it has; None otherwise or without items."""
        if self.coref is None or not self.steps:
            return None
        last = np.nan_to_num(self.coref[-1], nan=-1.0)  # (A, H)
        a, h = (int(i) for i in np.unravel_index(int(np.argmax(last)), last.shape))
        if last[a, h] < threshold:
            return None
        return a, h, self.steps[_held_since(np.nan_to_num(self.coref[:, a, h], nan=-1.0) >= threshold)]

    def uniform_step(self, margin: float = 0.1) -> int | None:
        """The first step at which the mean entropy of all heads has left uniform (below 1 - `margin`); None if
        it never has. A run started fresh has its untrained model's entropy at step 0, the measured start."""
        for step, e in zip(self.steps, self.entropy, strict=True):
            if np.isfinite(e).any() and float(np.nanmean(e)) < 1.0 - margin:
                return step
        return None


def _held_since(held: np.ndarray) -> int:
    """The index from which `held` (E,) bool is true to its end (its last element is)."""
    off = np.flatnonzero(~held)
    return int(off[-1]) + 1 if off.size else 0


def module_shape(name: str, probe: Probe) -> tuple[int, int]:
    """(queries, keys) of a module for a probe: encoder self S x S, decoder self T x T, cross T x S."""
    s, t = len(probe.src_tokens), len(probe.tgt_tokens)
    if name.endswith("cross"):
        return t, s
    return (s, s) if name.startswith("encoder") else (t, t)


def _floats(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _optional(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values.tolist()]


def to_arrays(h: History) -> dict[str, np.ndarray]:
    """The file's arrays (the module docstring), for np.savez."""
    meta = {"format": FORMAT, "model_kind": h.model_kind, "modules": h.modules, "n_heads": h.n_heads,
            "roles": list(ROLES), "probes": [vars(p) for p in h.probes], "items": h.items}
    arrays = {"meta": np.array([json.dumps(meta, ensure_ascii=False)]),
              "steps": np.array(h.steps, dtype=np.int64), "bleu": _floats(h.bleu),
              "contrastive": _floats(h.contrastive), "entropy": np.asarray(h.entropy, dtype=np.float32),
              "roles": np.stack([np.asarray(h.roles[r], dtype=np.float32) for r in ROLES])}
    if h.coref is not None:
        arrays["coref"] = np.asarray(h.coref, dtype=np.float32)
    for p, per_module in enumerate(h.maps):
        for a, m in enumerate(per_module):
            arrays[f"map_{p}_{a}"] = np.asarray(m, dtype=np.float16)
    return arrays


def save_history(h: History, files: RunDir) -> None:
    """Write `h` as the run's attention_history.npz, whole (atomically)."""
    arrays = to_arrays(h)
    files.write_history(lambda f: np.savez(f, **arrays))


def history_path(run_dir: str | Path) -> Path:
    """A run directory's history file; a path to an .npz file is taken as it is."""
    path = Path(run_dir)
    return path if path.suffix == ".npz" and not path.is_dir() else RunDir(path).history


def load_history(run_dir: str | Path) -> History:
    """The History of a run directory (or of an attention_history.npz file); an InputError naming the file when it
    is missing, cut short or not a history."""
    path = history_path(run_dir)
    if not path.is_file():
        why = "not found (the run records it with train.record_attention: true, at its first evaluation)"
        raise InputError(f"{path}: {why}", "run_dir", named=True)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise InputError(f"{path}: not an attention history (cut short, or not an .npz archive of arrays)", "run_dir",
                         named=True) from None
    try:
        return from_arrays(arrays)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        why = f"no {e}" if isinstance(e, KeyError) else str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise InputError(f"{path}: not an attention history ({why})", "run_dir", named=True) from None


def _shape(arrays: dict, name: str, shape: tuple, kind: str) -> np.ndarray:
    a = arrays[name]
    if a.shape != shape or a.dtype.kind != kind:
        raise ValueError(f"{name} has shape {a.shape} ({a.dtype}), expected {shape}")
    return a


def from_arrays(arrays: dict[str, np.ndarray]) -> History:
    """A History from the file's arrays, every shape checked (ValueError/KeyError/TypeError naming what is wrong)."""
    meta = json.loads(str(_shape(arrays, "meta", (1,), "U")[0]))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else None}, expected {FORMAT}")
    modules, n_heads, roles = list(meta["modules"]), int(meta["n_heads"]), list(meta["roles"])
    probes = [Probe(str(p["kind"]), str(p["source"]), str(p["target"]), [str(t) for t in p["src_tokens"]],
                    [str(t) for t in p["tgt_tokens"]]) for p in meta["probes"]]
    if any(p.kind not in PROBE_KINDS for p in probes) or not set(ROLES) <= set(roles):
        raise ValueError("unknown probe kinds or roles")
    steps = _shape(arrays, "steps", arrays["steps"].shape[:1], "i")
    e, shape = len(steps), (len(steps), len(modules), n_heads)
    if np.any(np.diff(steps) <= 0):
        raise ValueError("steps are not ascending")
    all_roles = _shape(arrays, "roles", (len(roles), *shape), "f")
    maps = [[_shape(arrays, f"map_{p}_{a}", (e, n_heads, *module_shape(m, probe)), "f")
             for a, m in enumerate(modules)] for p, probe in enumerate(probes)]
    coref = _shape(arrays, "coref", shape, "f") if "coref" in arrays else None
    return History(str(meta["model_kind"]), [int(s) for s in steps], modules, n_heads,
                   {r: all_roles[roles.index(r)] for r in ROLES}, _shape(arrays, "entropy", shape, "f"), coref,
                   _optional(_shape(arrays, "contrastive", (e,), "f")), _optional(_shape(arrays, "bleu", (e,), "f")),
                   probes, maps, [dict(i) for i in meta.get("items", [])])


def make_probe(kind: str, src: str, ref: str, tok: Tokenizer) -> Probe:
    """A probe of a sentence pair, its pieces as the model reads them (source and eos; bos and the reference)."""
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


def prepare(probes: list[Probe], records: list[dict], tok: Tokenizer, limit: int) -> Prepared | None:
    """The batch of `probes`; None where there are none, or where this tokenizer does not give their pieces (they
    were chosen by another)."""
    if not probes or any(make_probe(p.kind, p.source, p.target, tok) != p for p in probes):
        return None
    s_ids, t_ids = tok.encode_src([p.source for p in probes]), tok.encode_tgt([p.target for p in probes])
    rows = [i for i, p in enumerate(probes) if p.kind == "contrastive"]
    items = items_from_records(records) if records else []
    located = [coref.locate(i, tok, limit) for i in items]
    if len(rows) != len(items) or any(x is None for x in located):
        return None
    batch = collate(s_ids, t_ids, tok.pad_id, tok.bos_id, tok.eos_id)
    src_counts, tgt_counts = Counter(i for s in s_ids for i in s), Counter(i for t in t_ids for i in t)
    return Prepared(batch.src, batch.tgt_in, key_info(batch.src, tok.src, src_counts, tok.pad_id, tok.eos_id),
                    key_info(batch.tgt_in, tok.tgt, tgt_counts, tok.pad_id, tok.bos_id), rows,
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
    """(H,) the mean over the real queries that see two keys or more (`allowed` (B, Tq, Tk), `q_valid` (B, Tq)) of
    the entropy of their weights w (B, H, Tq, Tk) over log(#keys they see); NaN where no query does."""
    n = allowed.sum(-1)  # (B, Tq)
    use = q_valid & (n >= 2)
    ent = -(w * w.clamp_min(1e-30).log()).sum(-1) / n.clamp_min(2).log()[:, None]  # (B, H, Tq)
    count = use.sum()
    return (ent * use[:, None]).sum((0, 2)) / count if count else torch.full((w.size(1),), float("nan"))


def _modules(model_kind: str, weights: AttentionWeights) -> list[tuple[str, str, int, Tensor]]:
    """(name, coref kind, layer, weights (P, H, Tq, Tk)) of every attention module, kind by kind."""
    if model_kind == "rnn":
        return [("decoder cross", "cross", 0, weights.cross[0])]
    return [(f"{side} {i + 1} {what}", kind, i, w) for side, what, kind, ws in (
        ("encoder", "self", "encoder", weights.encoder_self), ("decoder", "self", "decoder", weights.decoder_self),
        ("decoder", "cross", "cross", weights.cross)) for i, w in enumerate(ws)]


@torch.inference_mode()
def measure(model: Seq2Seq, tok: Tokenizer, model_kind: str, probes: list[Probe], prep: Prepared) -> Record:
    """The probes' attention in `model` as it is, teacher-forced, and what is measured on it."""
    device = next(model.parameters()).device
    weights = AttentionWeights()
    src, tgt_in = prep.src.to(device), prep.tgt_in.to(device)
    src_mask = model.src_mask(src)
    model.decode(tgt_in, model.encode(src, src_mask, weights), src_mask, weights=weights)
    modules = [(name, kind, layer, w.float().cpu()) for name, kind, layer, w in _modules(model_kind, weights)]
    roles, entropies = [], []
    for _, kind, _, w in modules:
        keys = prep.tgt_keys if kind == "decoder" else prep.src_keys
        queries = prep.src_keys.valid if kind == "encoder" else prep.tgt_keys.valid
        sums = RoleSums(w.size(1))
        sums.add(w, queries, keys, self_attention=kind != "cross", causal=kind == "decoder")
        roles.append([[np.nan if x[r] is None else x[r] for x in sums.shares()] for r in ROLES])  # (R, H)
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
    out = {kind: coref.Resolution(*(torch.zeros(n, heads, dtype=torch.float64) for _ in range(3)), len(prep.rows))
           for kind, n in layers.items()}
    by_kind: dict[str, list[Tensor]] = {}
    for _, kind, _, w in modules:
        by_kind.setdefault(kind, []).append(w[prep.rows])
    coref.tally(out, prep.located, by_kind)
    return np.array([(out[kind].resolved[layer] / len(prep.rows)).numpy() for _, kind, layer, _ in modules])


def appended(h: History, step: int, record: Record, bleu: float | None) -> History:
    """`h` with `record` of `step` added (one of that step or later replaced: an evaluation again at one step)."""
    h = truncated(h, step - 1)
    if h.steps and (h.modules != record.modules or h.n_heads != record.roles.shape[2]):
        raise ValueError("the model's attention modules changed")
    roles = {r: _cat(h.roles.get(r), record.roles[i]) for i, r in enumerate(ROLES)}
    maps = [[_cat(old[a] if old else None, m) for a, m in enumerate(new)]
            for old, new in zip(h.maps or [[]] * len(record.maps), record.maps, strict=True)]
    return History(h.model_kind, [*h.steps, step], record.modules, record.roles.shape[2], roles,
                   _cat(h.entropy, record.entropy), _cat(h.coref, record.coref), [*h.contrastive, record.contrastive],
                   [*h.bleu, bleu], h.probes, maps, h.items)


def _cat(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """`a` (E, ...) with `b` (...) added as its last row; None without `b`."""
    return None if b is None else b[None] if a is None or not len(a) else np.concatenate([a, b[None]])


def truncated(h: History, step: int) -> History:
    """`h` without the records after `step`."""
    keep = sum(s <= step for s in h.steps)
    if keep == len(h.steps):
        return h
    cut = (lambda a: None if a is None else a[:keep])  # noqa: E731
    return History(h.model_kind, h.steps[:keep], h.modules, h.n_heads, {r: cut(a) for r, a in h.roles.items()},
                   cut(h.entropy), cut(h.coref), h.contrastive[:keep], h.bleu[:keep], h.probes,
                   [[cut(m) for m in per] for per in h.maps], h.items)


def empty(model_kind: str, probes: list[Probe], items: list[dict]) -> History:
    """A history of no evaluations yet: its modules and arrays come with the first record."""
    return History(model_kind, [], [], 0, {}, np.zeros((0, 0, 0), np.float32), None, [], [], probes, [], items)


class Recorder:
    """training.validation.Observer: the attention on the probes at step 0 and each evaluation, into `run_dir`'s
    attention_history.npz (a run directory, or compare-rnn's folder of one of its models)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.files = RunDir(Path(run_dir))
        self.history: History | None = None
        self.prep: Prepared | None = None
        self.tok: Tokenizer | None = None
        self.full = False

    def rewind(self, step: int, corpus: Corpus, cfg: ExperimentConfig, model: Seq2Seq) -> None:
        """Start a history at step 0 with its first record, `model` before any training step (BLEU unknown), or go
        on with the file's, its records after `step` dropped; a file that is damaged or was made with other probes
        is started again (without a step-0 record), with a warning."""
        kind, limit, tok = cfg.model.kind, cfg.model.max_positions, corpus.tok
        self.history, self.prep, self.tok, self.full = None, None, tok, False
        if step and self.files.history.is_file():
            try:
                h = load_history(self.files.history)
                self.prep = prepare(h.probes, h.items, tok, limit) if h.model_kind == kind else None
                if self.prep is None:
                    raise InputError(f"{self.files.history}: recorded with other probes or another model")
                self.history = truncated(h, step)
                if len(self.history.steps) < len(h.steps):  # as RunDir.rewind's metrics: written again from here
                    save_history(self.history, self.files)
            except InputError as e:
                log.warning("%s; the attention history starts again", e)
        if self.history is None:
            probes, records = choose_probes(corpus, cfg)
            self.history, self.prep = empty(kind, probes, records), prepare(probes, records, tok, limit)
            if not probes:
                log.warning("no validation pair of at most %d pieces a side, no contrastive item, no English source: "
                            "no attention history is recorded", MAX_LEN)
            if step == 0:
                self.on_evaluation(0, model, tok, {})

    def on_evaluation(self, step: int, model: Seq2Seq, tokenizer: Tokenizer, metrics: dict) -> None:
        """Record the evaluation of `step` and write the file again, whole."""
        h, prep = self.history, self.prep
        if h is None or prep is None or not h.probes:
            return
        if len([s for s in h.steps if s < step]) >= MAX_RECORDS:
            if not self.full:
                log.warning("%s: %d evaluations recorded, no more", self.files.history, MAX_RECORDS)
                self.full = True
            return
        device, was_training = next(model.parameters()).device, model.training
        rng = rng_state(device)
        model.eval()
        try:
            record = measure(model, tokenizer, h.model_kind, h.probes, prep)
        finally:
            model.train(was_training)
            set_rng_state(rng, device)
        bleu = metrics.get("valid_bleu")
        self.history = appended(h, step, record, None if bleu is None else float(bleu))
        save_history(self.history, self.files)
