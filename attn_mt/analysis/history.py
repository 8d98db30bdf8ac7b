"""Attention as it is learnt: at every evaluation of a run (train.record_attention, the default), every head's
attention on a few fixed sentences, its role statistics (roles.py), entropy and coreference score (coref.py),
kept in RUN/attention_history.npz; `load_history(RUN)` (`attn_mt.history(RUN)`) reads it back as a `History`.

The probes, chosen when the run starts and kept in the file (a resumed run uses the same): the first N_VALID
validation pairs of at most MAX_LEN pieces a side (source with eos, decoder input with bos); the valid split's
contrastive items where the data has them (the pronoun variant), at most N_ITEMS; and, for an English source
and German target, the classic sentence "the animal didn't cross the street because it was too tired." and its
"too wide" twin (data/pronoun.py's `classic`, with its German). Each probe runs teacher-forced on its reference,
so that every evaluation's maps have the same shape; in eval mode, without gradients, leaving the model's mode and
every random stream as they were: a run records the same weights as one that does not.

The file: np.savez (uncompressed; read with allow_pickle=False), rewritten whole at each evaluation through
RunDir.write_history (atomic). E evaluations, A attention modules, H heads, P probes, R = len(ROLES):
    meta         (1,) str    JSON: format, model_kind, modules (A names), n_heads, roles (the R names), probes
                             (P objects: kind, source, target, src_tokens, tgt_tokens), items (the contrastive
                             probes' records, decoding/contrastive.py's format, in probe order)
    steps        (E,) int64  the step of each evaluation, ascending
    bleu         (E,) float64        validation BLEU at that step (NaN: unknown)
    contrastive  (E,) float64        contrastive accuracy on the probe items (NaN: no items)
    entropy      (E, A, H) float32   mean attention entropy / log(#keys) over the probes' queries (1: uniform)
    roles        (R, E, A, H) float32  each role's share (roles.py; NaN where a role does not apply)
    coref        (E, A, H) float32   share of the contrastive probes each head resolves (only with items)
    map_{p}_{a}  (E, H, Q, K) float16  probe p's weights in module a: encoder self S x S, decoder self T x T,
                             cross T x S (S = len(src_tokens), T = len(tgt_tokens))
Entropy counts the keys a query may see: real (non-pad) ones, and in decoder self-attention none after it; a
query that sees one key only (the decoder's first) is left out.

Its size for configs/multi30k.yaml (the hour config; a German source: 4 validation probes, no items, no classic):
A = 9 modules (3 encoder self, 3 decoder self, 3 cross), H = 4, S, T <= MAX_LEN = 12, and one evaluation per
epoch, at most max_epochs = 100 (the hour on 2 CPU cores made 29-31): maps at most 100 x 4 probes x 3 layers x
4 heads x (12*12 + 12*12 + 12*12) x 2 bytes = 4,147,200 bytes, roles 8 x 100 x 9 x 4 x 4 = 115,200, entropy
14,400, the rest (steps, BLEU, meta, the zip's headers) under 20,000: at most 4,296,800 bytes (about 1.3 MB
at 31 evaluations). Past MAX_RECORDS evaluations a run records no more (the file would keep growing).

One job: a run's attention history: its probes, its recording at each evaluation, its file.
Tested in tests/analysis/test_history.py.
"""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn_mt.errors import InputError
from attn_mt.rundir import RunDir

from .roles import ROLES

log = logging.getLogger(__name__)

FORMAT = 1
N_VALID = 4  # validation probes
MAX_LEN = 12  # pieces a side of a validation probe (eos, bos included): the size bound above
N_ITEMS = 32  # contrastive probes at most
MAX_RECORDS = 200  # evaluations recorded at most
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
    """A run's recorded attention, evaluation by evaluation (the module docstring: shapes and meanings)."""

    model_kind: str  # "transformer" | "rnn"
    steps: list[int]  # E evaluations, ascending
    modules: list[str]  # A modules: "encoder 1 self", ..., "decoder 1 self", ..., "decoder 1 cross", ...
    #                     (kind by kind, layer by layer); the RNN: ["decoder cross"]
    n_heads: int  # H (the RNN: 1)
    roles: dict[str, np.ndarray]  # role (roles.ROLES) -> (E, A, H) float32, NaN where the role does not apply
    entropy: np.ndarray  # (E, A, H) mean entropy over the probes' queries / log(#keys): 1.0 = uniform
    coref: np.ndarray | None  # (E, A, H) share of the contrastive probes this head resolves; None without them
    contrastive: list[float | None]  # (E,) contrastive accuracy on the probe items; None without them
    bleu: list[float | None]  # (E,) validation BLEU at that step
    probes: list[Probe]  # P probe sentences
    maps: list[list[np.ndarray]]  # maps[p][a]: (E, H, Q, K) float16, queries x keys of module a for probe p
    items: list[dict] = field(default_factory=list, repr=False)  # the contrastive probes' records, in probe order
    # (views of a History, for notebooks and pages, belong here: `view()`, by the views' module)

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
        it never has."""
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
