"""Budget runs that size themselves to the machine: `model.size: auto`.

A run with a clock budget (`train.max_minutes`) and `model.size: auto` first times a few training
steps of each shape of LADDER on its own batches, at this machine's speed and precision (at most
MEASURE_SHARE of the budget), then predicts for each shape how many epochs of this corpus the rest
of the budget trains, evaluations included, and picks the shape whose measured learning curve
(CURVES: validation BLEU against epochs, on Multi30k) is highest there. The warmup is fitted to the
predicted number of steps, so a short run leaves warmup early enough to learn.

`plan` is the one call training's set-up makes (the config to train, and the record of the choice);
`choose` is a pure function of the measured speeds, the corpus size and the budget; `measure` does
the timing; `apply` turns a choice into the config the run trains (and `Choice.overrides` into the
config overrides that reproduce it without the automatic choice).

One job: choosing the shape a clock budget trains (`plan`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import torch

from attn_mt.config import ConfigError, ExperimentConfig
from attn_mt.data.batching import token_batches
from attn_mt.data.corpus import Corpus
from attn_mt.decoding.translate import translate
from attn_mt.device import Stopwatch, autocast
from attn_mt.models import build_model, count_params
from attn_mt.training.trainer import TrainStep

log = logging.getLogger(__name__)
MEASURE_SHARE = 0.05  # of the budget, at most, spent timing the ladder
WARMUP_SHARE = 0.15  # the fitted warmup: at most this share of the predicted steps


@dataclass(frozen=True)
class Shape:
    """One rung of the ladder: a Transformer shape and its batch size (target tokens per step)."""

    name: str
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    batch_tokens: int


LADDER = (
    # the same model, four times the updates of a 4096-token epoch
    Shape("d256-L3-b1024", 256, 4, 3, 1024, 1024),
    # the 7.6M-parameter Multi30k model, twice the updates per epoch
    Shape("d256-L3-b2048", 256, 4, 3, 1024, 2048),
    Shape("d128-L3-b4096", 128, 4, 3, 512, 4096),  # 2.4M parameters, about 3x fewer FLOPs per token
)

# Validation BLEU (greedy, the first 300 validation sentences, best so far) after each epoch on
# Multi30k de -> en (29k pairs) and at the run's end, with the quick config's recipe (the
# speedrun's: Muon head by head, warmup-stable-decay at 2e-3, EMA 0.99, no dropout, 8k joint BPE),
# one run per rung bounded by target tokens (1.71M for the 7.6M model, 3.42M for the small one), so
# the rate decays over each run's last 30%: the points before that are a run that has not decayed
# yet, below what a run ending there scores (the quick config's 1.6-epoch runs end at valid 35.8,
# the 1024-token curve says 33.6); the rungs share the bias. docs/results.md ("Budget runs that size
# themselves") gives the runs. BLEU against epochs does not depend on the machine's speed.
CURVES: dict[str, tuple[tuple[float, float], ...]] = {  # (epochs, best validation BLEU so far)
    "d256-L3-b1024": ((1, 29.31), (2, 36.42), (3, 37.76), (3.87, 38.96)),
    "d256-L3-b2048": ((1, 25.91), (2, 36.47), (3, 38.26), (3.87, 38.79)),
    "d128-L3-b4096": ((1, 1.20), (2, 17.95), (3, 28.99), (4, 32.72), (5, 33.93), (6, 35.52),
                      (7, 35.52), (7.73, 35.52)),
}


def predicted_bleu(name: str, epochs: float) -> float:
    """The curve of shape `name` at `epochs`: linear between measured epochs (from 0 BLEU at epoch
    0), flat after the last one (no extrapolation upwards)."""
    points = ((0.0, 0.0), *CURVES[name])
    if epochs >= points[-1][0]:
        return points[-1][1]
    for (e0, b0), (e1, b1) in zip(points, points[1:], strict=False):
        if epochs <= e1:
            return b0 + (b1 - b0) * (epochs - e0) / (e1 - e0)
    return points[-1][1]


@dataclass(frozen=True)
class Measured:
    """One shape timed on this machine: training and evaluation speed, and its batches per epoch."""

    shape: Shape
    tokens_per_s: float  # target tokens of training per second
    eval_s: float  # seconds one evaluation takes (validation loss and greedy BLEU)
    steps_per_epoch: int
    params: int = 0


@dataclass(frozen=True)
class Choice:
    """The chosen shape, what was predicted for it, and every candidate's prediction (for the
    log)."""

    shape: Shape
    steps: int  # predicted optimizer steps in the budget
    epochs: float
    bleu: float  # predicted validation BLEU
    warmup_steps: int
    table: tuple[dict, ...]
    measure_s: float = 0.0

    def overrides(self) -> list[str]:
        """Config overrides (key=value) that train this shape without the automatic choice."""
        s = self.shape
        return ["model.size=fixed", f"model.d_model={s.d_model}", f"model.n_heads={s.n_heads}",
                f"model.n_layers={s.n_layers}", f"model.d_ff={s.d_ff}",
                f"train.batch_tokens={s.batch_tokens}", f"train.warmup_steps={self.warmup_steps}"]

    def to_json(self) -> dict:
        return {"chosen": self.shape.name, "shape": asdict(self.shape),
                "predicted_steps": self.steps, "predicted_epochs": round(self.epochs, 2),
                "predicted_valid_bleu": round(self.bleu, 2), "warmup_steps": self.warmup_steps,
                "measure_s": round(self.measure_s, 1), "candidates": list(self.table),
                "overrides": self.overrides()}


def choose(measured: list[Measured], corpus_tokens: int, budget_s: float,
           warmup_steps: int) -> Choice:
    """The shape with the highest predicted validation BLEU after `budget_s` seconds of training and
    evaluation (one evaluation per epoch) on a corpus of `corpus_tokens` target tokens; ties go to
    the faster shape. `warmup_steps` (the config's) is cut to WARMUP_SHARE of the predicted
    steps."""
    if not measured:
        raise ValueError("no shape was measured")
    rows, best = [], None
    # the faster shape first: it wins ties
    for m in sorted(measured, key=lambda m: -m.tokens_per_s):
        # one epoch of training and its evaluation
        epoch_s = corpus_tokens / m.tokens_per_s + m.eval_s
        epochs = budget_s / epoch_s
        steps = int(epochs * m.steps_per_epoch)
        bleu = predicted_bleu(m.shape.name, epochs)
        rows.append({"shape": m.shape.name, "params": m.params,
                     "tokens_per_s": round(m.tokens_per_s), "eval_s": round(m.eval_s, 1),
                     "predicted_epochs": round(epochs, 2), "predicted_steps": steps,
                     "predicted_valid_bleu": round(bleu, 2)})
        if best is None or bleu > best[2] + 1e-9:
            best = (m, steps, bleu, epochs)
    m, steps, bleu, epochs = best
    warmup = max(1, min(warmup_steps, int(WARMUP_SHARE * steps)))
    return Choice(m.shape, steps, epochs, bleu, warmup, tuple(rows))


CHOSEN = {"model": ("d_model", "n_heads", "n_layers", "d_ff"),
          "train": ("batch_tokens", "warmup_steps")}  # what
#   a choice sets (apply): a resumed run keeps these as its checkpoint's config has them
#   (resume.resumed_config)


def apply(cfg: ExperimentConfig, shape: Shape, warmup_steps: int) -> ExperimentConfig:
    """The config trained with `shape` and the fitted warmup (model.size stays as it was: `auto` in
    a sized run's config.yaml and checkpoints says the shape was chosen, and a resumed run keeps
    it)."""
    model = replace(cfg.model, d_model=shape.d_model, n_heads=shape.n_heads,
                    n_layers=shape.n_layers, d_ff=shape.d_ff)
    return replace(cfg, model=model, train=replace(cfg.train, batch_tokens=shape.batch_tokens,
                                                   warmup_steps=warmup_steps))


def replaced(cfg: ExperimentConfig, choice: Choice) -> str:
    """What the choice replaces of the configured shape (a user's override of model.d_model
    included), as a log line; "" when it keeps all of it."""
    chosen = apply(cfg, choice.shape, choice.warmup_steps)
    keys = [(part, k) for part, names in CHOSEN.items() for k in names]
    changed = [f"{a}.{k}={getattr(getattr(cfg, a), k)} (now {getattr(getattr(chosen, a), k)})"
               for a, k in keys if getattr(getattr(cfg, a), k) != getattr(getattr(chosen, a), k)]
    return (f"size: model.size: auto replaces the configured {', '.join(changed)}; set "
            "model.size=fixed to train the configured shape") if changed else ""


class Sizes(NamedTuple):
    """What the ladder needs to know of the corpus, read from it once."""

    train_lengths: tuple  # (source lengths, target lengths) of the training split
    valid_tokens: int  # target tokens of the validation split
    epoch_tokens: int  # target tokens of one epoch of training (with eos), what tokens/s counts


def sizes(cfg: ExperimentConfig, corpus: Corpus) -> Sizes:
    """The corpus's sizes the ladder and the choice use."""
    train, valid = corpus.lengths(cfg.data.splits.train), corpus.lengths(cfg.data.splits.valid)
    return Sizes(train, int(sum(valid[1])), int(sum(train[1])) + len(train[1]))


def measure(cfg: ExperimentConfig, corpus: Corpus, known: Sizes, device: torch.device,
            precision: str, ladder: tuple[Shape, ...] | None = None,
            steps: int = 3) -> list[Measured]:
    """Time `steps` training steps and one short greedy translation of each shape on this corpus,
    each after an untimed pass over the same batches (bf16 kernels are slow the first time they meet
    a shape; a long run meets its shapes again and again), within MEASURE_SHARE of the budget: a
    shape not reached in time is left out."""
    tc, split = cfg.train, cfg.data.splits.train
    limit_s = MEASURE_SHARE * tc.max_minutes * 60
    valid_src = corpus.text[cfg.data.splits.valid][0]
    n_valid = min(len(valid_src), tc.bleu_sentences)
    probe = valid_src[:16]
    t_start, out = time.perf_counter(), []
    for shape in LADDER if ladder is None else ladder:
        if out and time.perf_counter() - t_start > limit_s:
            log.info("size: %s not measured (the ladder's share of the budget is spent)",
                     shape.name)
            break
        shaped = apply(cfg, shape, tc.warmup_steps)
        torch.manual_seed(tc.seed)
        model = build_model(shaped.model, **corpus.tok.sizes()).to(device).train()
        params = count_params(model)
        step = TrainStep(model, shaped.train, device, precision)
        index = token_batches(*known.train_lengths, shape.batch_tokens, tc.seed, 0)
        batches = [b.to(device) for b in corpus.batches(split, index[:steps])]
        # the first pass meets each batch's shapes (kernels, allocations) once
        for _pass in ("untimed", "timed"):
            with Stopwatch(device) as train:
                for batch in batches:
                    # a tiny rate: timing, not learning
                    step.update(step.backward([batch], batch.n_tokens), 1e-9)
        tokens_per_s = sum(b.n_tokens for b in batches) / train.seconds
        greedy = replace(cfg.decode, beam_size=1, nbest=1)
        with autocast(device, precision):
            translate(model.eval(), corpus.tok, probe[:4], greedy, device)  # untimed, as above
            with Stopwatch(device) as decode:
                translate(model, corpus.tok, probe, greedy, device)
        eval_s = (decode.seconds * n_valid / max(1, len(probe)) + known.valid_tokens
                  / (3 * tokens_per_s))
        out.append(Measured(shape, tokens_per_s, eval_s, len(index), params))
        log.info("size: %s (%.2fM parameters) trains %.0f tokens/s, evaluates in %.1f s",
                 shape.name, params / 1e6, tokens_per_s, eval_s)
        del model, step
    return out


def auto(cfg: ExperimentConfig) -> bool:
    """Whether the config asks for an automatic size (model.size: auto; an RNN's config has no
    size)."""
    return getattr(cfg.model, "size", "fixed") == "auto"


def wanted(cfg: ExperimentConfig) -> bool:
    """Whether the run sizes itself: model.size: auto and a clock budget (without one, e.g. a step
    budget, the configured shape trains as it is)."""
    return auto(cfg) and cfg.train.max_minutes > 0


def plan(cfg: ExperimentConfig, corpus: Corpus, device: torch.device, precision: str,
         distributed: bool = False) -> tuple[ExperimentConfig, Choice | None]:
    """The config a fresh run trains, and the record of an automatic choice (None: the configured
    shape).

    `model.size: auto` with a clock budget measures the ladder on `corpus` at this machine's speed
    and chooses (`size_run`); a resumed run does not come here (resume.resumed_config keeps the
    shape it chose)."""
    if not auto(cfg):
        return cfg, None
    if not wanted(cfg):
        log.info("model.size: auto sizes a clock budget (train.max_minutes); without one the "
                 "configured shape trains")
        return cfg, None
    if distributed:
        raise ConfigError("model.size=auto sizes one process to its machine; under torchrun give "
                          "the shape (the overrides a single-process auto run logs)", "model.size")
    return size_run(cfg, corpus, device, precision)


def size_run(cfg: ExperimentConfig, corpus: Corpus, device: torch.device,
             precision: str) -> tuple[ExperimentConfig,
                                      Choice]:
    """Measure the ladder, choose, log what was measured and chosen and why; (the sized config, the
    choice)."""
    known = sizes(cfg, corpus)
    with Stopwatch() as watch:
        measured = measure(cfg, corpus, known, device, precision)
    spent = watch.seconds
    choice = choose(measured, known.epoch_tokens, cfg.train.max_minutes * 60 - spent,
                    cfg.train.warmup_steps)
    choice = replace(choice, measure_s=spent)
    for row in choice.table:
        log.info("size: %-8s %6.2fM  %6d tokens/s  ~%5.1f epochs, %5d steps  -> valid BLEU ~%.1f",
                 row["shape"], row["params"] / 1e6, row["tokens_per_s"], row["predicted_epochs"],
                 row["predicted_steps"], row["predicted_valid_bleu"])
    log.info("size: chose %s (measured in %.0f s); the same run without the automatic choice "
             "overrides %s", choice.shape.name, spent, " ".join(choice.overrides()))
    if line := replaced(cfg, choice):
        log.info(line)
    return apply(cfg, choice.shape, choice.warmup_steps), choice
