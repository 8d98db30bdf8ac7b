"""The training step, in one place: forward, loss, backward with accumulation, unscale, clip,
non-finite skip, optimizer and learning-rate step.

`TrainStep` is that step for any model and any batches (`attn-mt bench` times it on fixed
batches). `Trainer` adds a place in a corpus's batch stream and the counters of a run
(`TrainState`); `train` drives one Trainer, `compare-rnn` two of them on one clock. On CUDA the
step reads nothing from the device (train.skip_check, training/deferred.py): the counters come in at `read`.

One job: the optimizer step and the run's place and counters around it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attn_mt.config import ExperimentConfig, TrainConfig
from attn_mt.data.batching import Batch, to_bucket, token_batches
from attn_mt.data.corpus import Corpus
from attn_mt.data.prefetch import Prefetcher
from attn_mt.device import autocast
from attn_mt.errors import Interrupted, TrainError
from attn_mt.models import Seq2Seq, loss_sum
from attn_mt.training import distributed
from attn_mt.training.deferred import Guard, Tally
from attn_mt.training.distributed import World
from attn_mt.training.ema import WeightEMA
from attn_mt.training.muon import MuonAdamW
from attn_mt.training.schedule import budget_spent, lr_at

log = logging.getLogger(__name__)


class TrainInterrupted(TrainError, Interrupted):
    """Ctrl-C: the run saved checkpoint_last.pt and stopped; `resume=True` continues it."""


def too_many_bad(step: int, in_a_row: int) -> TrainError:
    """The error that stops a run after train.max_bad_steps non-finite steps in a row (host or deferred checks)."""
    return TrainError(f"stopped at step {step}: {in_a_row} non-finite losses in a row (train.max_bad_steps); "
                      "try a lower train.lr or train.clip_norm")


def make_optimizer(model: nn.Module, cfg: TrainConfig, precision: str = "fp32") -> torch.optim.Optimizer:
    """AdamW with the configured betas and weight decay, or with train.optimizer=muon Muon for the layers'
    weight matrices (its Newton-Schulz iterations in bf16 when training in bf16, else fp32); the rate is set
    at every step. On CUDA AdamW's fused implementation: one kernel for all parameters instead of several."""
    if cfg.optimizer == "muon":
        return MuonAdamW(model, lr=lr_at(1, cfg), betas=cfg.betas, weight_decay=cfg.weight_decay,
                         momentum=cfg.muon_momentum, ns_steps=cfg.muon_ns_steps,
                         ns_schedule=cfg.muon_ns_schedule, per_head=cfg.muon_per_head,
                         ns_dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    fused = all(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(model.parameters(), lr=lr_at(1, cfg), betas=cfg.betas, weight_decay=cfg.weight_decay,
                             fused=fused or None)


class TrainStep:
    """A model's optimizer and gradient scaler, and the step that updates it.

    `net` is what runs forward and backward: the model itself, or its DistributedDataParallel or
    torch.compile wrapper. Under DDP (`world.enabled`) the batches are this rank's shards,
    `n_tokens` counts the whole global batch, and the gradients are all-reduced once, after the
    last batch (`no_sync` before it); DDP averages over ranks, hence the factor world.size.
    """

    def __init__(self, model: Seq2Seq, cfg: TrainConfig, device: torch.device, precision: str, *,
                 net: nn.Module | None = None, world: World = World()) -> None:
        self.model, self.net, self.cfg = model, (model if net is None else net), cfg
        self.device, self.precision, self.world = device, precision, world
        self.opt = make_optimizer(model, cfg, precision)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.grad_norm: float | None = None  # of the last step, before clipping (when train.clip_norm is set)
        self.ema = WeightEMA(model, cfg.ema_decay) if cfg.ema_decay else None  # evaluated and saved, when on
        self.graphed = self.net is not model and cfg.cuda_graphs and device.type == "cuda"  # training/compiled.py
        self.guard: Guard | None = None  # apply_on_device's, made at its first call
        check = cfg.skip_check  # deferred: no host sync per step (training/deferred.py)
        self.deferred = check == "device" or (check == "auto" and device.type == "cuda")

    def unwrap(self) -> None:
        """Training is over: `net` becomes the bare model, and a DistributedDataParallel wrapper is freed while the
        interpreter is whole. It holds the process group, whose gloo threads, left to the interpreter's exit,
        can abort the process (a rank once exited with SIGABRT after a finished run)."""
        if self.net is not self.model:
            self.net = self.model
            gc.collect()  # the wrapper's reference cycles

    def backward(self, batches: Iterable[Batch], n_tokens: int, weights: list[float] | None = None) -> torch.Tensor:
        """Accumulate the gradient of the mean token loss over `batches`; returns their summed loss."""
        batches = list(batches)
        weights = weights or [1.0] * len(batches)
        total = torch.zeros((), device=self.device)
        for i, (batch, weight) in enumerate(zip(batches, weights, strict=True)):
            batch = batch.to(self.device)
            if self.graphed:
                torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are no longer needed
            last = i == len(batches) - 1
            with contextlib.nullcontext() if last or not self.world.enabled else self.net.no_sync():
                with autocast(self.device, self.precision):
                    loss = loss_sum(self.net, batch, self.cfg.label_smoothing, self.model.pad_id,
                                    self.cfg.z_loss) * weight
                self.scaler.scale(loss * self.world.size / n_tokens).backward()
            total += loss.detach()
        return total

    def evaluated(self) -> contextlib.AbstractContextManager:
        """A block in which the model holds the weights that are evaluated and saved: the moving average
        with train.ema_decay, else the trained weights themselves."""
        return contextlib.nullcontext() if self.ema is None else self.ema.swapped_in()

    def _checks(self, loss: torch.Tensor, lr: float) -> list[torch.Tensor]:
        """Set the rate, unscale and clip; the values that must be finite: the loss and the gradient norm
        before clipping (when clipped, and not fp16: there the scaler itself skips steps with inf gradients)."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.scaler.unscale_(self.opt)
        checks = [loss]
        if self.cfg.clip_norm:
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
            if not self.scaler.is_enabled():
                checks.append(norm)
        return checks

    def apply(self, loss: torch.Tensor, lr: float) -> float | None:
        """Clip and apply the gradients at rate `lr`; returns the summed loss, or None when the loss
        or the gradient norm is not finite and the step was skipped."""
        values = torch.stack(self._checks(loss, lr)).tolist()  # the one host sync of a step
        self.grad_norm = values[1] if len(values) > 1 else None
        finite = all(math.isfinite(v) for v in values)
        if finite:
            self.scaler.step(self.opt)
            if self.ema is not None:
                self.ema.update()
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        return values[0] if finite else None

    def update(self, loss: torch.Tensor, lr: float) -> None:
        """The update as `train` makes it (for bench, profile and autosize's timings): `apply`, or
        `apply_on_device` with deferred checks."""
        if self.deferred:
            self.apply_on_device(loss, lr)
        else:
            self.apply(loss, lr)

    def apply_on_device(self, loss: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`apply` without reading the device: the update is made and then undone on the device
        (training/deferred.py's Guard) when the loss or gradient norm is not finite. Returns (finite: 0-dim
        bool, the gradient norm or None when it is not checked). With fp16 the scaler's step still reads
        its own inf check."""
        checks = self._checks(loss, lr)
        finite = torch.stack(checks).isfinite().all()
        self.guard = self.guard or Guard(self.opt, self.ema, self.device, self.scaler.is_enabled())
        self.guard.save(finite)
        self.scaler.step(self.opt)
        if self.ema is not None:
            self.ema.update()
        self.guard.restore(finite)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        return finite, checks[1] if len(checks) > 1 else None


@dataclass
class TrainState:
    """Where a run stands; with model, optimizer and RNG state, all that a resumed run needs."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already used
    best_bleu: float = -1.0
    bad_evals: int = 0  # evaluations since BLEU last improved
    bad_steps: int = 0  # non-finite losses in a row
    skipped_steps: int = 0  # steps skipped for a non-finite loss, in all
    window_loss: float = 0.0  # summed loss and target tokens since the last progress update
    window_tokens: int = 0
    train_loss: float = math.nan  # mean loss per token over the last full window
    elapsed_s: float = 0.0  # training seconds, over all processes of the run
    tokens: int = 0  # target tokens trained on, in all
    stopped: str = ""  # why the run ended itself at this point (a limit, early stopping); "" while it goes on


@dataclass(frozen=True)
class Step:
    """What one `Trainer.step` did: its summed loss (None: skipped, or with deferred checks not read),
    global target tokens and rate, and the clock and Ctrl-C flag as every rank agreed on them."""

    loss: float | None
    n_tokens: int
    lr: float
    elapsed: float
    interrupted: bool


class Trainer(TrainStep):
    """A TrainStep that walks through a corpus's token batches, epoch by epoch, in the order
    (seed, epoch) fixes, keeping the counters of the run in `state`.

    With deferred checks (train.skip_check, `deferred`) a step reads nothing from the device: `state`'s
    step, token, loss and skip counters are those of the last `read()`, the steps since then are
    `pending`, and the schedule counts attempted steps (`schedule_step`)."""

    def __init__(self, model: Seq2Seq, cfg: ExperimentConfig, corpus: Corpus, device: torch.device,
                 precision: str, *, net: nn.Module | None = None, world: World = World()) -> None:
        super().__init__(model, cfg.train, device, precision, net=net, world=world)
        self.corpus, self.split = corpus, cfg.data.splits.train
        self.src_lens, self.tgt_lens = corpus.lengths(self.split)
        self.state = TrainState()
        self._plan: tuple[int, list[list[int]]] = (-1, [])
        self.prefetch: Prefetcher[tuple[int, list[Batch], list[float]]] = Prefetcher(device.type == "cuda")
        self.tally: Tally | None = None  # the device's counters since the last read (deferred)
        self.pending, self.pending_tokens = 0, 0  # steps since the last read, and their target tokens

    @property
    def schedule_step(self) -> int:
        """The steps the learning rate and the log, evaluation and checkpoint cadence count: those taken,
        or with deferred checks those attempted (a skipped step included; the unread ones too)."""
        st = self.state
        return st.step + st.skipped_steps + self.pending if self.deferred else st.step

    @property
    def counted(self) -> tuple[int, int]:
        """(steps, target tokens) for the budget: the unread steps counted as taken."""
        return self.state.step + self.pending, self.state.tokens + self.pending_tokens

    def read(self) -> None:
        """Deferred checks: the device's counters into `state`, in one sync (nothing to do when none is
        unread). Raises TrainError when train.max_bad_steps non-finite steps came in a row."""
        if not self.pending:
            return
        st, tc, got = self.state, self.cfg, self.tally.read()
        first = st.step + st.skipped_steps + 1
        st.step, st.tokens = st.step + got.steps, st.tokens + got.tokens
        st.skipped_steps += got.skipped
        st.window_loss, st.window_tokens, st.bad_steps = got.window_loss, got.window_tokens, got.bad
        self.grad_norm = got.grad_norm if tc.clip_norm and not self.scaler.is_enabled() else None
        self.guard.uncount(got.skipped)
        if self.ema is not None:
            self.ema.updates = st.step  # it counted the attempts
        self.tally, self.pending, self.pending_tokens = None, 0, 0
        if got.skipped:
            log.warning("steps %d-%d: %d had a non-finite loss and were skipped", first, first + got.steps +
                        got.skipped - 1, got.skipped)
        if got.longest_bad >= tc.max_bad_steps:
            raise too_many_bad(st.step, got.longest_bad)

    def epoch_batches(self) -> list[list[int]]:
        """The index batches of the current epoch (computed once per epoch)."""
        if self._plan[0] != self.state.epoch:
            tc = self.cfg
            self._plan = (self.state.epoch, token_batches(self.src_lens, self.tgt_lens, tc.batch_tokens, tc.seed,
                                                          self.state.epoch, buckets=tc.length_buckets))
        return self._plan[1]

    def group(self, batches: Sequence[list[int]], epoch: int, start: int) -> tuple[int, list[Batch], list[float]]:
        """The batches of the optimizer step that begins at batch `start` of `epoch`'s plan `batches`: (global
        target tokens, this rank's collated batches, their weights); a function of its arguments alone."""
        tc, tgt_lens = self.cfg, np.asarray(self.tgt_lens)
        group = batches[start : start + tc.accum_steps]
        n_tokens = sum(int(tgt_lens[b].sum()) + len(b) for b in group)  # the global batch, eos included
        shards = [distributed.shard(b, self.world) for b in group]
        draws = (tc.seed, epoch, start)  # subword samples: a resumed run draws the same
        pin, tok = self.device.type == "cuda", self.corpus.tok
        made = list(self.corpus.batches(self.split, [s for s, _ in shards], tc.subword_sampling, draws, pin=pin))
        if tc.length_buckets:
            made = [to_bucket(b, tc.length_buckets, tok.pad_id, tok.bos_id, tok.eos_id, pin, tc.batch_tokens,
                              self.world.size) for b in made]
        return n_tokens, made, [w for _, w in shards]

    @property
    def epoch_done(self) -> bool:
        return self.state.batch_in_epoch >= len(self.epoch_batches())

    def next_epoch(self) -> None:
        self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0

    def step(self, clock: Callable[[], float], stop_requested: Callable[[], bool] = lambda: False,
             spent: float | None = None) -> Step:
        """One optimizer step on the next `accum_steps` batches of the epoch.

        After the backward pass, `clock()` (training seconds) and `spent` (the budget fraction,
        default from the config's limits) set the learning rate; under DDP rank 0's clock and any
        rank's `stop_requested()` (Ctrl-C) are shared.
        """
        st, tc, batches = self.state, self.cfg, self.epoch_batches()
        epoch, start = st.epoch, st.batch_in_epoch
        n_tokens, made, weights = self.prefetch.take((epoch, start), lambda: self.group(batches, epoch, start))
        if (after := start + tc.accum_steps) < len(batches):  # the next step's batches, built during this one
            self.prefetch.ahead((epoch, after), lambda: self.group(batches, epoch, after))
        loss = self.backward(made, n_tokens, weights)
        elapsed, interrupted = clock(), stop_requested()
        if self.world.enabled:  # one small all-reduce: global loss, any rank's Ctrl-C, rank 0's clock
            flags = torch.tensor([float(interrupted), elapsed if self.world.main else 0.0], device=self.device)
            sync = distributed.all_sum(torch.cat([loss.float().view(1), flags]), self.world)
            loss, interrupted, elapsed = sync[0], bool(sync[1] > 0), float(sync[2])
        if spent is None:
            steps, tokens = self.counted
            spent = budget_spent(tc, steps, elapsed, st.epoch + st.batch_in_epoch / len(batches), tokens)
        lr = lr_at(self.schedule_step + 1, tc, spent)
        st.batch_in_epoch += len(weights)
        if self.deferred:
            finite, norm = self.apply_on_device(loss, lr)
            if self.tally is None:
                self.tally = Tally(self.device, st.window_loss, st.window_tokens, st.bad_steps)
            self.tally.add(loss, finite, n_tokens, norm)
            self.pending, self.pending_tokens = self.pending + 1, self.pending_tokens + n_tokens
            return Step(None, n_tokens, lr, elapsed, interrupted)
        value = self.apply(loss, lr)
        if value is None:
            st.bad_steps, st.skipped_steps = st.bad_steps + 1, st.skipped_steps + 1
            log.warning("step %d: non-finite loss, step skipped (%d in a row)", st.step + 1, st.bad_steps)
            if st.bad_steps >= tc.max_bad_steps:
                raise too_many_bad(st.step, st.bad_steps)
        else:
            st.step, st.bad_steps, st.tokens = st.step + 1, 0, st.tokens + n_tokens
            st.window_loss, st.window_tokens = st.window_loss + value, st.window_tokens + n_tokens
        return Step(value, n_tokens, lr, elapsed, interrupted)
