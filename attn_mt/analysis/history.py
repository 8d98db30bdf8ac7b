"""Attention as it is learnt: at every evaluation of a run (train.record_attention, the default),
and at step 0 before its first training step where the run starts fresh (BLEU unknown there), every
head's attention on a few fixed sentences (probes.py), its role statistics (roles.py), entropy and
coreference score (coref.py), kept in RUN/attention_history.npz (history_file.py: its layout and
checked reading); `load_history(RUN)` (`attn_mt.history(RUN)`) reads it back as a `History`. The
recording leaves the model's mode and every random stream as they were: a run records the same
weights as one that does not.

One job: a run's attention history: the History and its summaries, its recording at step 0 and each
evaluation, its arrays. Tested in tests/analysis/test_history.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attn_mt.config import ExperimentConfig
from attn_mt.data import checks
from attn_mt.data.corpus import Corpus
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.device import rng_state, set_rng_state
from attn_mt.errors import InputError
from attn_mt.models import Seq2Seq
from attn_mt.rundir import RunDir

from . import history_file
from .history_file import FORMAT, MAX_RECORDS, Loaded, Meta
from .probes import MAX_LEN, Prepared, Probe, Record, choose_probes, measure, module_shape, prepare
from .roles import ROLES

if TYPE_CHECKING:
    from .history_view import HistoryView

log = logging.getLogger(__name__)

__all__ = ["MAX_LEN", "History", "Probe", "Recorder", "from_arrays", "load_history", "module_shape",
           "save_history", "to_arrays"]
EXPERT = tuple(r for r in ROLES if r != "conf")  # roles a head can be the expert of (not conf)


@dataclass(frozen=True, eq=False)
class History:
    """A run's recorded attention, evaluation by evaluation, from step 0 (the untrained model) where
    the run started fresh (the module docstring: shapes and meanings)."""

    model_kind: str  # "transformer" | "rnn"
    steps: list[int]  # E evaluations, ascending; 0 first (before training) where it started fresh
    modules: list[str]  # A modules: "encoder 1 self", ..., "decoder 1 self", ..., "decoder 1 cross"
    #                     (kind by kind, layer by layer); the RNN: ["decoder cross"]
    n_heads: int  # H (the RNN: 1)
    roles: dict[str, np.ndarray]  # role (roles.ROLES) -> (E, A, H) float32, NaN: does not apply
    entropy: np.ndarray  # (E, A, H) mean entropy over the probes' queries / log(#keys): 1 = uniform
    coref: np.ndarray | None  # (E, A, H) share of the contrastive probes a head resolves (or None)
    contrastive: list[float | None]  # (E,) contrastive accuracy on the probe items (or None)
    bleu: list[float | None]  # (E,) validation BLEU at that step (None: unknown, as at step 0)
    probes: list[Probe]  # P probe sentences
    maps: list[list[np.ndarray]]  # maps[p][a]: (E, H, Q, K) float16: probe p's queries x keys in a
    items: list[dict] = field(default_factory=list, repr=False)  # the contrastive probes' records

    def view(self, name: str = "") -> HistoryView:
        """The history drawn (history_view.py): a notebook shows its page (a step slider over every
        head's map and role curves); `.save_html(path)` writes the page, `.save_png(path)` the
        summary picture. `name`: a title."""
        from .history_view import HistoryView

        return HistoryView(self, checks.text(name, "name", empty=True))

    def role_step(self, min_share: float = 0.5) -> dict[tuple[int, int], tuple[str, int] | None]:
        """(module, head) -> (its dominant role at the last evaluation, the step from which it has
        held it), or None where no role reaches `min_share` then. A head holds a role at an
        evaluation when that role's value (a share of its attention; mono: a rank correlation) is at
        least `min_share`; the dominant one is the largest of those it holds (EXPERT: every role but
        conf)."""
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
        """(module, head, step) of the head that resolves the most contrastive probes at the last
        evaluation, if it resolves at least `threshold` of them, with the step from which it has;
        None otherwise or without items."""
        if self.coref is None or not self.steps:
            return None
        last = np.nan_to_num(self.coref[-1], nan=-1.0)  # (A, H)
        a, h = (int(i) for i in np.unravel_index(int(np.argmax(last)), last.shape))
        if last[a, h] < threshold:
            return None
        held = np.nan_to_num(self.coref[:, a, h], nan=-1.0) >= threshold
        return a, h, self.steps[_held_since(held)]

    def uniform_step(self, margin: float = 0.1) -> int | None:
        """The first step at which the mean entropy of all heads has left uniform (below 1 -
        `margin`); None if it never has. A run started fresh has its untrained model's entropy at
        step 0, the measured start."""
        for step, e in zip(self.steps, self.entropy, strict=True):
            if np.isfinite(e).any() and float(np.nanmean(e)) < 1.0 - margin:
                return step
        return None


def _held_since(held: np.ndarray) -> int:
    """The index from which `held` (E,) bool is true to its end (its last element is)."""
    off = np.flatnonzero(~held)
    return int(off[-1]) + 1 if off.size else 0



def _floats(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _optional(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values.tolist()]


def to_arrays(h: History) -> dict[str, np.ndarray]:
    """The file's arrays (the module docstring), for np.savez."""
    meta = {"format": FORMAT, "model_kind": h.model_kind, "modules": h.modules,
            "n_heads": h.n_heads,
            "roles": list(ROLES), "probes": [vars(p) for p in h.probes], "items": h.items}
    arrays = {"meta": np.array([json.dumps(meta, ensure_ascii=False)]),
              "steps": np.array(h.steps, dtype=np.int64), "bleu": _floats(h.bleu),
              "contrastive": _floats(h.contrastive),
              "entropy": np.asarray(h.entropy, dtype=np.float32),
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
    """The History of a run directory (or of an attention_history.npz file); an InputError naming
    the file when it is missing, cut short, not a history, or beyond history_file.py's bounds."""
    path = history_path(run_dir)
    if not path.is_file():
        why = "not found (a run records it with train.record_attention: true, at each evaluation)"
        raise InputError(f"{path}: {why}", "run_dir", named=True)
    return built(*history_file.read(path))


def from_arrays(arrays: dict[str, np.ndarray]) -> History:
    """A History from the file's arrays, every shape and value checked (history_file.py;
    ValueError/KeyError naming what is wrong)."""
    return built(*history_file.checked(Loaded(arrays)))


def built(meta: Meta, arrays: dict[str, np.ndarray]) -> History:
    """The History of checked meta and arrays."""
    n = len(meta.modules)
    maps = [[arrays[f"map_{p}_{a}"] for a in range(n)] for p in range(len(meta.probes))]
    return History(meta.model_kind, [int(s) for s in arrays["steps"]], meta.modules, meta.n_heads,
                   {r: arrays["roles"][meta.roles.index(r)] for r in ROLES}, arrays["entropy"],
                   arrays.get("coref"), _optional(arrays["contrastive"]), _optional(arrays["bleu"]),
                   meta.probes, maps, meta.items)


def appended(h: History, step: int, record: Record, bleu: float | None) -> History:
    """`h` with `record` of `step` added (one of that step or later replaced: an evaluation again at
    one step)."""
    h = truncated(h, step - 1)
    if h.steps and (h.modules != record.modules or h.n_heads != record.roles.shape[2]):
        raise ValueError("the model's attention modules changed")
    roles = {r: _cat(h.roles.get(r), record.roles[i]) for i, r in enumerate(ROLES)}
    maps = [[_cat(old[a] if old else None, m) for a, m in enumerate(new)]
            for old, new in zip(h.maps or [[]] * len(record.maps), record.maps, strict=True)]
    return History(h.model_kind, [*h.steps, step], record.modules, record.roles.shape[2], roles,
                   _cat(h.entropy, record.entropy), _cat(h.coref, record.coref),
                   [*h.contrastive, record.contrastive],
                   [*h.bleu, bleu], h.probes, maps, h.items)


def _cat(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """`a` (E, ...) with `b` (...) added as its last row; None without `b`."""
    if b is None:
        return None
    return b[None] if a is None or not len(a) else np.concatenate([a, b[None]])


def truncated(h: History, step: int) -> History:
    """`h` without the records after `step`."""
    keep = sum(s <= step for s in h.steps)
    if keep == len(h.steps):
        return h
    cut = (lambda a: None if a is None else a[:keep])  # noqa: E731
    return History(h.model_kind, h.steps[:keep], h.modules, h.n_heads,
                   {r: cut(a) for r, a in h.roles.items()},
                   cut(h.entropy), cut(h.coref), h.contrastive[:keep], h.bleu[:keep], h.probes,
                   [[cut(m) for m in per] for per in h.maps], h.items)


def empty(model_kind: str, probes: list[Probe], items: list[dict]) -> History:
    """A history of no evaluations yet: its modules and arrays come with the first record."""
    return History(model_kind, [], [], 0, {}, np.zeros((0, 0, 0), np.float32), None, [], [], probes,
                   [], items)


class Recorder:
    """training.validation.Observer: the attention on the probes at step 0 and each evaluation, into
    `run_dir`'s attention_history.npz (a run directory, or compare-rnn's folder of one of its
    models)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.files = RunDir(Path(run_dir))
        self.history: History | None = None
        self.prep: Prepared | None = None
        self.tok: Tokenizer | None = None
        self.full = False

    def rewind(self, step: int, corpus: Corpus, cfg: ExperimentConfig, model: Seq2Seq) -> None:
        """Start a history at step 0 with its first record, `model` before any training step (BLEU
        unknown), or go on with the file's, its records after `step` dropped; a file that is damaged
        or was made with other probes is started again (without a step-0 record), with a warning."""
        kind, limit, tok = cfg.model.kind, cfg.model.max_positions, corpus.tok
        self.history, self.prep, self.tok, self.full = None, None, tok, False
        if step and self.files.history.is_file():
            try:
                h = load_history(self.files.history)
                self.prep = prepare(h.probes, h.items, tok, limit) if h.model_kind == kind else None
                if self.prep is None:
                    why = "recorded with other probes or another model"
                    raise InputError(f"{self.files.history}: {why}")
                self.history = truncated(h, step)
                if len(self.history.steps) < len(h.steps):  # as RunDir.rewind's metrics
                    save_history(self.history, self.files)
            except InputError as e:
                log.warning("%s; the attention history starts again", e)
        if self.history is None:
            probes, records = choose_probes(corpus, cfg)
            self.history = empty(kind, probes, records)
            self.prep = prepare(probes, records, tok, limit)
            if not probes:
                log.warning("no validation pair of at most %d pieces a side, no contrastive item, "
                            "no English source: no attention history is recorded", MAX_LEN)
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
