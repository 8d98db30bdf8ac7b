"""The training step: forward, loss, backward, clip, optimizer update (`TrainStep`), and a place in
a corpus's batches with the run's counters around it (`Trainer`).

`TrainStep` is that step for any model and any batches (`attn-mt bench` times it on fixed
batches). `Trainer` walks a corpus's token batches epoch by epoch; `train` drives one Trainer,
`compare-rnn` two of them on one clock. The parts a config may vary (the optimizer, several
processes, the checks for a non-finite loss, how batches are made, a guided alignment loss) are
chosen once, at set-up, by training/variants.py; the step reads the same with each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attn_mt.config import ExperimentConfig, TrainConfig
from attn_mt.data.batching import Batch, token_batches
from attn_mt.data.corpus import Corpus
from attn_mt.device import autocast
from attn_mt.models import Seq2Seq, token_loss
from attn_mt.training import variants
from attn_mt.training.schedule import TrainState, budget_spent, lr_at


class TrainStep:
    """A model's optimizer, and the step that updates it.

    `net` is what runs forward and backward: the model itself, or the model wrapped for several
    processes or compiled (variants.build_net). With several processes (`world`) the batches are
    this process's shares, `n_tokens` counts the whole global batch, and the gradients are
    averaged over the processes, hence the factor world.size.
    """

    def __init__(self, model: Seq2Seq, cfg: TrainConfig, device: torch.device, precision: str, *,
                 net: nn.Module | None = None, world: variants.World = variants.World()) -> None:
        self.model, self.net, self.cfg = model, (model if net is None else net), cfg
        self.device, self.precision, self.world = device, precision, world
        self.opt = variants.make_optimizer(model, cfg, precision)  # AdamW, or Muon for matrices
        self.scaler = variants.make_scaler(device, precision)  # fp16's loss scaling, or none
        self.ema = variants.make_ema(model, cfg)  # the weights' moving average, or None
        self.guide = variants.make_guide(model, cfg)  # guided alignment's loss term, or none
        self.checks = variants.make_checks(cfg, device, self.ema, self.scaler.is_enabled())

    @property
    def grad_norm(self) -> float | None:
        """The gradient norm before clipping, of the last step read (not with fp16)."""
        return self.checks.grad_norm

    def backward(self, batches: Iterable[Batch], n_tokens: int,
                 weights: list[float] | None = None) -> torch.Tensor:
        """Accumulate the gradient of the mean loss over `batches`; returns their summed loss."""
        batches = list(batches)
        weights = weights or [1.0] * len(batches)
        total = torch.zeros((), device=self.device)
        for i, (batch, weight) in enumerate(zip(batches, weights, strict=True)):
            batch = batch.to(self.device)
            with self.world.accumulating(self.net, last=i == len(batches) - 1):
                with autocast(self.device, self.precision):
                    logits = self.net(batch.src, batch.tgt_in)  # (B, T, V)
                    loss = token_loss(logits, batch.tgt_out, self.cfg.label_smoothing,
                                      self.model.pad_id, self.cfg.z_loss)
                    loss = self.guide(loss, batch) * weight
                self.scaler.scale(loss * self.world.size / n_tokens).backward()
            total += loss.detach()
        return total

    def update(self, loss: torch.Tensor, lr: float) -> float | None:
        """Set the rate `lr`, clip the gradients, then the optimizer step (and the average's
        update) unless the checks find the summed `loss` or the gradient norm not finite. Returns
        the loss as read (None: skipped, or not read with deferred checks)."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.scaler.unscale_(self.opt)
        norm = None  # checked, clipped or not, but not with fp16: its scaler skips inf gradients
        if self.cfg.clip_norm:
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        elif not self.scaler.is_enabled():
            norm = nn.utils.get_total_norm([p.grad for p in self.model.parameters()
                                            if p.grad is not None])
        if self.checks.before(self.opt, loss, None if self.scaler.is_enabled() else norm):
            self.scaler.step(self.opt)
            if self.ema is not None:
                self.ema.update()
        self.checks.after()
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        return self.checks.loss

    def evaluated(self) -> contextlib.AbstractContextManager:
        """A block in which the model holds the weights that are evaluated and saved: the moving
        average with train.ema_decay, else the trained weights themselves."""
        return contextlib.nullcontext() if self.ema is None else self.ema.swapped_in()


@dataclass(frozen=True)
class Step:
    """What one `Trainer.step` did: its summed loss (None: skipped, or not read with deferred
    checks), global target tokens and rate, the clock and Ctrl-C flag as every process agreed on
    them, and its place in the schedule (None: a skipped step with host checks takes none)."""

    loss: float | None
    n_tokens: int
    lr: float
    elapsed: float
    interrupted: bool
    number: int | None


class Trainer(TrainStep):
    """A TrainStep that walks through a corpus's token batches, epoch by epoch, in the order
    (seed, epoch) fixes, keeping the counters of the run in `state` (exact after `read`)."""

    def __init__(self, model: Seq2Seq, cfg: ExperimentConfig, corpus: Corpus,
                 device: torch.device, precision: str, *, net: nn.Module | None = None,
                 world: variants.World = variants.World()) -> None:
        super().__init__(model, cfg.train, device, precision, net=net, world=world)
        self.src_lens, self.tgt_lens = corpus.lengths(cfg.data.splits.train)
        self.state = TrainState()
        self.collate = variants.make_collate(cfg, corpus, device, world)
        self.feed = variants.make_feed(device)  # batches built in place, or ahead in a thread
        self._plan: tuple[int, Sequence[list[int]]] = (-1, [])

    def read(self) -> None:
        """The counters into `state`, exact. Raises TrainError when train.max_bad_steps
        consecutive steps were not finite."""
        self.checks.read(self.state)

    def epoch_batches(self) -> Sequence[list[int]]:
        """The index batches of the current epoch (computed once per epoch)."""
        if self._plan[0] != self.state.epoch:
            tc = self.cfg
            self._plan = (self.state.epoch, token_batches(
                self.src_lens, self.tgt_lens, tc.batch_tokens, tc.seed, self.state.epoch,
                buckets=tc.length_buckets))
        return self._plan[1]

    @property
    def epoch_done(self) -> bool:
        return self.state.batch_in_epoch >= len(self.epoch_batches())

    def next_epoch(self) -> None:
        self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0

    def group(self, batches: Sequence[list[int]], epoch: int,
              start: int) -> tuple[int, list[Batch], list[float]]:
        """The batches of the optimizer step that begins at batch `start` of `epoch`'s plan
        `batches`: (global target tokens, this process's collated batches, their weights); a
        function of its arguments alone."""
        group = batches[start : start + self.cfg.accum_steps]
        tgt_lens = np.asarray(self.tgt_lens)
        n_tokens = sum(int(tgt_lens[b].sum()) + len(b) for b in group)  # eos included
        shares = [self.world.shard(b) for b in group]
        draws = (self.cfg.seed, epoch, start)  # subword samples: a resumed run draws the same
        return n_tokens, self.collate([s for s, _ in shares], draws), [w for _, w in shares]

    def step(self, clock: Callable[[], float], stop_requested: Callable[[], bool] = lambda: False,
             spent: float | None = None) -> Step:
        """One optimizer step on the next `accum_steps` batches of the epoch.

        After the backward pass, `clock()` (training seconds) and `spent` (the budget fraction,
        default from the config's limits) set the learning rate.
        """
        st, tc, batches = self.state, self.cfg, self.epoch_batches()
        epoch, start, after = st.epoch, st.batch_in_epoch, st.batch_in_epoch + tc.accum_steps
        n_tokens, made, weights = self.feed.take((epoch, start),
                                                 lambda: self.group(batches, epoch, start))
        if after < len(batches):  # the next step's batches, built during this one
            self.feed.ahead((epoch, after), lambda: self.group(batches, epoch, after))
        loss = self.backward(made, n_tokens, weights)
        elapsed, interrupted = clock(), stop_requested()
        loss, interrupted, elapsed = self.world.agree(loss, interrupted, elapsed)
        if spent is None:
            steps, tokens = self.checks.counted(st)
            epochs = st.epoch + st.batch_in_epoch / len(batches)
            spent = budget_spent(tc, steps, elapsed, epochs, tokens)
        number = self.checks.next_step(st)
        lr = lr_at(number, tc, spent)
        st.batch_in_epoch += len(weights)
        value = self.update(loss, lr)
        counted = self.checks.count(st, n_tokens)
        return Step(value, n_tokens, lr, elapsed, interrupted, number if counted else None)
