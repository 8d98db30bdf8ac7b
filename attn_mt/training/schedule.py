"""Where a run stands (`TrainState`), and its learning-rate schedule and budget: pure functions of
the step and the clock. The words a run stops with are stops.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attn_mt.config import TrainConfig
from attn_mt.training.stops import Stop


@dataclass
class TrainState:
    """Where a run stands; with model, optimizer and RNG state, all that a resumed run needs."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already used
    best_bleu: float = -1.0
    bad_evals: int = 0  # evaluations since BLEU last improved
    bad_steps: int = 0  # consecutive non-finite losses
    skipped_steps: int = 0  # steps skipped for a non-finite loss, in all
    window_loss: float = 0.0  # summed loss and target tokens since the last progress update
    window_tokens: int = 0
    train_loss: float = math.nan  # mean loss per token over the last full window
    elapsed_s: float = 0.0  # training seconds, over all processes of the run
    tokens: int = 0  # target tokens trained on, in all
    stopped: str = ""  # why the run ended itself (a limit, early stopping); "" while it goes on


def lr_at(step: int, cfg: TrainConfig, progress: float = 0.0) -> float:
    """Linear warmup to cfg.lr over warmup_steps (step >= 1), then cfg.schedule: inverse-square-root
    decay; linear decay to 0 as `progress` (the spent fraction of the budget) goes from 0 to 1; or
    warmup-stable-decay (wsd): the peak rate until the last train.decay_fraction of the budget,
    then linear decay to 0 at its end.

    With the budget-following schedules (linear, wsd) the warmup also follows the budget: it ends
    at the latest when `progress` reaches train.warmup_fraction, so 5 minutes or 100 steps get
    warmup and decay too.
    """
    step = max(step, 1)
    warm = min(step / cfg.warmup_steps, 1.0) if cfg.warmup_steps else 1.0
    if cfg.schedule in ("linear", "wsd"):
        if cfg.warmup_fraction:
            warm = max(warm, min(progress / cfg.warmup_fraction, 1.0))
        if cfg.schedule == "wsd":
            return cfg.lr * warm * min(1.0, max(0.0, 1.0 - progress) / cfg.decay_fraction)
        return cfg.lr * warm * max(0.0, 1.0 - progress)
    if cfg.warmup_steps and step > cfg.warmup_steps:
        return cfg.lr * warm * math.sqrt(cfg.warmup_steps / step)
    return cfg.lr * warm


def budget_spent(cfg: TrainConfig, step: int, seconds: float, epochs: float,
                 tokens: int = 0) -> float:
    """The fraction of the training budget used: the largest of steps, target tokens, minutes and
    epochs."""
    parts = [epochs / cfg.max_epochs]
    if cfg.max_steps:
        parts.append(step / cfg.max_steps)
    if cfg.max_tokens:
        parts.append(tokens / cfg.max_tokens)
    if cfg.max_minutes:
        parts.append(seconds / (cfg.max_minutes * 60))
    return min(1.0, max(parts))


def limit_reached(cfg: TrainConfig, step: int, seconds: float, tokens: int = 0) -> str | None:
    """Why training must stop now (train.max_steps, max_tokens or max_minutes reached), or None."""
    if cfg.max_steps and step >= cfg.max_steps:
        return Stop.max_steps(cfg)
    if cfg.max_tokens and tokens >= cfg.max_tokens:
        return Stop.max_tokens(cfg)
    if cfg.max_minutes and seconds >= cfg.max_minutes * 60:
        return Stop.max_minutes(cfg)
    return None
