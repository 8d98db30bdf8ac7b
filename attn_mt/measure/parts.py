"""The parts of a training step, timed apart: where a step's time goes (`attn-mt bench` prints
them).

    >>> step_parts(trainer, steps=10)  # a training.trainer.Trainer; median ms per part
    >>> config_parts(cfg, prelude(cfg, ...), steps=10)  # the same for a config's model, as training
                                                        builds it

(scripts/profile_step.py --parts prints them for a config.)

The trainer's own `Trainer.step` runs, with timers put into the objects it calls (instance
attributes, taken out again after the step): where one part ends and the next begins the device is
synchronised and the clock read, so the parts tile the step, in the order the step runs them:
    batch      the step's batches taken (collated, or from the prefetch thread) and moved to the
               device
    forward    the model's forward pass, to the logits
    loss       token_loss of the logits
    backward   the backward pass
    schedule   the training clock, the budget spent and the learning rate
    clip       the rate set, the gradients unscaled and clipped (clip_grad_norm_)
    checks     whether the loss and gradient norm are finite (HostChecks: one host sync;
               DeviceChecks), and the step counted
    optimizer  the optimizer step, the gradient scaler's update and zero_grad
    ema        the weights' moving average (when train.ema_decay is set)
Steps with timers take turns with plain steps, timed whole: the sum of the parts against the whole
step shows what the timers' synchronisations add. Both walk the epoch as training does (a new epoch
when one ends), each step on the next batches: medians over different batches, so take ten steps or
more. With train.accum_steps > 1 the move of a batch after the first to the device counts as
backward.

Tested in tests/measure/test_parts.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from attn_mt.config import ExperimentConfig
from attn_mt.device import Stopwatch, sync
from attn_mt.measure.prelude import Prelude
from attn_mt.models import build_model
from attn_mt.training.trainer import Trainer

PARTS = ("batch", "forward", "loss", "backward", "clip", "checks", "optimizer", "ema", "schedule")


class Timeline:
    """Seconds per part of one step: `mark(part)` ends the running part (the device synchronised
    first) and starts `part` (None: nothing more)."""

    def __init__(self, trainer: Trainer) -> None:
        self.device, self.part, self.t = trainer.device, None, 0.0
        self.seconds = {p: 0.0 for p in PARTS if p != "ema" or trainer.ema is not None}

    def mark(self, part: str | None) -> None:
        sync(self.device)
        now = time.perf_counter()
        if self.part is not None:
            self.seconds[self.part] += now - self.t
        self.part, self.t = part, now

    def around(self, fn: Callable, part: str, then: str) -> Callable:
        """`fn`, its call timed as `part`, followed by `then`."""
        def run(*args, **kwargs):
            self.mark(part)
            out = fn(*args, **kwargs)
            self.mark(then)
            return out
        return run


@contextmanager
def timers(trainer: Trainer, line: Timeline) -> Iterator[None]:
    """The block's steps marked on `line`: timers in the model call, the scaler's scale (the loss,
    scaled, goes to backward), `update`, the checks and the moving average (see the module
    docstring)."""
    net, checks, ema = trainer.net, trainer.checks, trainer.ema
    scale = trainer.scaler.scale
    trainer.net = line.around(net, "forward", "loss")
    trainer.scaler.scale = lambda loss: (line.mark("backward"), scale(loss))[1]
    trainer.update = line.around(trainer.update, "clip", "checks")
    checks.before = line.around(checks.before, "checks", "optimizer")
    checks.after = line.around(checks.after, "checks", "optimizer")
    if ema is not None:
        ema.update = line.around(ema.update, "ema", "optimizer")
    try:
        yield
    finally:
        trainer.net = net
        for owner, name in [(trainer.scaler, "scale"), (trainer, "update"), (checks, "before"),
                            (checks, "after"), (ema, "update")]:
            if owner is not None:
                vars(owner).pop(name, None)  # the class's method again


def timed_step(trainer: Trainer, clock: Callable[[], float]) -> dict[str, float]:
    """One `trainer.step`, its seconds per part."""
    line = Timeline(trainer)

    def marked_clock() -> float:
        line.mark("schedule")
        return clock()

    with timers(trainer, line):
        line.mark("batch")
        trainer.step(marked_clock)
        line.mark(None)
    return line.seconds


def whole_step(trainer: Trainer, clock: Callable[[], float]) -> float:
    """One plain `trainer.step`, its seconds (the device synchronised before and after)."""
    with Stopwatch(trainer.device) as watch:
        trainer.step(clock)
    return watch.seconds


def step_parts(trainer: Trainer, steps: int = 10, warmup: int = 2) -> dict:
    """Median ms per part over `steps` steps with timers, and of the whole step over as many plain
    steps, the two in turns, after `warmup` of each; the parts' share of the whole step and their
    sum against it."""
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731  training seconds, as the run's clock
    parts: list[dict[str, float]] = []
    whole: list[float] = []
    for i in range(warmup + steps):
        # which goes first alternates
        for kind in ("parts", "whole") if i % 2 == 0 else ("whole", "parts"):
            if kind == "parts":
                parts.append(timed_step(trainer, clock))
            else:
                whole.append(whole_step(trainer, clock))
            if trainer.epoch_done:
                trainer.next_epoch()
    parts, whole = parts[warmup:], whole[warmup:]
    ms = {p: statistics.median(s[p] for s in parts) * 1e3 for p in parts[0]}
    whole_ms = statistics.median(whole) * 1e3
    return {"optimizer_name": trainer.cfg.optimizer, "precision": trainer.precision, "steps": steps,
            "ms": ms, "share": {p: v / whole_ms for p, v in ms.items()},
            "sum_ms": sum(ms.values()), "whole_ms": whole_ms,
            "timed_step_ms": statistics.median(sum(s.values()) for s in parts) * 1e3}


def config_parts(cfg: ExperimentConfig, start: Prelude, steps: int = 10, warmup: int = 2) -> dict:
    """step_parts of the config's model, built and trained as training does (seeded; the config's
    precision, attention and optimizer) from the start of the corpus's first epoch."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, **start.corpus.tok.sizes()).to(start.device).train()
    trainer = Trainer(model, cfg, start.corpus, start.device, start.precision)
    with trainer.feed:  # its thread, on CUDA, stops at the end
        return step_parts(trainer, steps, warmup)


def parts_table(r: dict) -> list[str]:
    """step_parts' figures as lines of text."""
    lines = [f"parts of a step ({r['precision']}, {r['optimizer_name']}; median of {r['steps']} "
             f"steps, the device synchronised around each part):",
             f"{'part':<12}{'ms':>9}{'share':>8}"]
    lines += [f"{p:<12}{ms:>9.2f}{r['share'][p]:>8.1%}" for p, ms in r["ms"].items()]
    lines.append(f"{'sum':<12}{r['sum_ms']:>9.2f}{r['sum_ms'] / r['whole_ms']:>8.1%}  of the whole "
                 f"step, {r['whole_ms']:.2f} ms timed without the part timers")
    return lines
