"""The training step, in one place: forward, loss, backward with accumulation, unscale, clip,
non-finite check, optimizer and learning-rate step.

`TrainStep` is that step for any model and any batches (`attn-mt bench` times it on fixed
batches). `Trainer` adds a place in a corpus's batch stream and the counters of a run
(`TrainState`); `train` drives one Trainer, `compare-rnn` two of them on one clock.

How a step checks its loss and gradient norm is chosen once, at set-up (`make_checks`): `HostChecks` reads
them after every step; on CUDA `DeviceChecks` (train.skip_check, training/deferred.py) reads nothing and
counts on the device until `Trainer.read`.

One job: the optimizer step and the run's place and counters around it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from torch import nn

from attn_mt.config import ExperimentConfig, TrainConfig
from attn_mt.data.batching import Batch, to_bucket, token_batches
from attn_mt.data.corpus import Corpus
from attn_mt.device import autocast
from attn_mt.errors import Interrupted, TrainError
from attn_mt.models import Seq2Seq, token_loss
from attn_mt.training.schedule import TrainState, budget_spent, lr_at, too_many_bad

if TYPE_CHECKING:
    from attn_mt.data.prefetch import Prefetcher
    from attn_mt.training.deferred import DeviceChecks
    from attn_mt.training.ema import WeightEMA

T = TypeVar("T")

log = logging.getLogger(__name__)


class TrainInterrupted(TrainError, Interrupted):
    """Ctrl-C: the run saved checkpoint_last.pt and stopped; `resume=True` continues it."""


def make_optimizer(model: nn.Module, cfg: TrainConfig, precision: str = "fp32") -> torch.optim.Optimizer:
    """AdamW with the configured betas and weight decay, or with train.optimizer=muon Muon for the layers'
    weight matrices (its Newton-Schulz iterations in bf16 when training in bf16, else fp32); the rate is set
    at every step. On CUDA AdamW's fused implementation: one kernel for all parameters instead of several."""
    if cfg.optimizer == "muon":
        from attn_mt.training.muon import MuonAdamW

        return MuonAdamW(model, lr=lr_at(1, cfg), betas=cfg.betas, weight_decay=cfg.weight_decay,
                         momentum=cfg.muon_momentum, ns_steps=cfg.muon_ns_steps,
                         ns_schedule=cfg.muon_ns_schedule, per_head=cfg.muon_per_head,
                         ns_dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    fused = all(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(model.parameters(), lr=lr_at(1, cfg), betas=cfg.betas, weight_decay=cfg.weight_decay,
                             fused=fused or None)


@dataclass(frozen=True)
class World:
    """The processes that train together: this one alone (under torchrun several: training/distributed.py's
    `Ranks`, whose methods talk to the others). For one process every collective below is the identity."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: it evaluates, writes the files and reports."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def shard(self, batch: list[int]) -> tuple[list[int], float]:
        """This process's sentences of a global batch, and the weight of its loss."""
        return batch, 1.0

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """A tensor summed over the processes."""
        return x

    def broadcast(self, obj: T) -> T:
        """Rank 0's value of a picklable object."""
        return obj

    def gather(self, obj: T) -> list[T]:
        """Every process's value of a picklable object, in rank order."""
        return [obj]

    def barrier(self) -> None:
        """Wait until every process is here."""

    def close(self) -> None:
        """Leave the process group, past the last collective."""


class TrainStep:
    """A model's optimizer and gradient scaler, and the step that updates it.

    `net` is what runs forward and backward: the model itself, or its DistributedDataParallel or
    torch.compile wrapper. Under DDP (`world.enabled`) the batches are this rank's shards,
    `n_tokens` counts the whole global batch, and the gradients are all-reduced once, after the
    last batch (`no_sync` before it); DDP averages over ranks, hence the factor world.size.
    `checks` decides, once, how a step finds out that its loss and gradient norm are finite.
    """

    def __init__(self, model: Seq2Seq, cfg: TrainConfig, device: torch.device, precision: str, *,
                 net: nn.Module | None = None, world: World = World()) -> None:
        self.model, self.net, self.cfg = model, (model if net is None else net), cfg
        self.device, self.precision, self.world = device, precision, world
        self.opt = make_optimizer(model, cfg, precision)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.ema: WeightEMA | None = None  # the moving average evaluated and saved, with train.ema_decay
        if cfg.ema_decay:
            from attn_mt.training.ema import WeightEMA

            self.ema = WeightEMA(model, cfg.ema_decay)
        self.graphed = self.net is not model and cfg.cuda_graphs and device.type == "cuda"  # training/compiled.py
        self.checks = make_checks(cfg, device, self.ema, self.scaler.is_enabled())

    @property
    def grad_norm(self) -> float | None:
        """The gradient norm before clipping, of the last step read (not with fp16)."""
        return self.checks.grad_norm

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
                    logits = self.net(batch.src, batch.tgt_in)  # (B, T, V)
                    loss = token_loss(logits, batch.tgt_out, self.cfg.label_smoothing, self.model.pad_id,
                                      self.cfg.z_loss) * weight
                self.scaler.scale(loss * self.world.size / n_tokens).backward()
            total += loss.detach()
        return total

    def evaluated(self) -> contextlib.AbstractContextManager:
        """A block in which the model holds the weights that are evaluated and saved: the moving average
        with train.ema_decay, else the trained weights themselves."""
        return contextlib.nullcontext() if self.ema is None else self.ema.swapped_in()

    def update(self, loss: torch.Tensor, lr: float) -> float | None:
        """Set the rate `lr`, unscale and clip, then the optimizer step (and the average's update) unless
        `checks` finds the summed `loss` or the gradient norm not finite. Returns the loss as read (None:
        skipped, or not read with deferred checks)."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.scaler.unscale_(self.opt)
        norm = None  # checked, clipped or not, but not with fp16: there the scaler skips inf gradients itself
        if self.cfg.clip_norm:
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        elif not self.scaler.is_enabled():
            norm = nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
        if self.checks.before(self.opt, loss, None if self.scaler.is_enabled() else norm):
            self.scaler.step(self.opt)
            if self.ema is not None:
                self.ema.update()
        self.checks.after()
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        return self.checks.loss


class HostChecks:
    """train.skip_check=host, the default off CUDA: each step reads its loss and gradient norm (its one host
    sync) and skips a non-finite update; a skipped step takes no place in the schedule, and the counters in
    `TrainState` are always exact."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.max_bad = cfg.max_bad_steps
        self.loss: float | None = None  # the last step's summed loss; None: not finite, skipped
        self.grad_norm: float | None = None

    def before(self, opt: torch.optim.Optimizer, loss: torch.Tensor, norm: torch.Tensor | None) -> bool:
        """Whether the step's update is made: its loss and norm are finite."""
        values = torch.stack([loss] if norm is None else [loss, norm]).tolist()  # the one host sync of a step
        self.grad_norm = values[1] if norm is not None else None
        finite = all(math.isfinite(v) for v in values)
        self.loss = values[0] if finite else None
        return finite

    def after(self) -> None:
        pass

    def next_step(self, st: TrainState) -> int:
        """The coming step's place in the schedule (learning rate; log, evaluation and checkpoint cadence)."""
        return st.step + 1

    def counted(self, st: TrainState) -> tuple[int, int]:
        """(steps, target tokens) for the budget."""
        return st.step, st.tokens

    def count(self, st: TrainState, n_tokens: int) -> bool:
        """The step just made into `st`; whether it took its place in the schedule (False: skipped)."""
        if self.loss is None:
            st.bad_steps += 1
            st.skipped_steps += 1
            log.warning("step %d: non-finite loss, step skipped (%d in a row)", st.step + 1, st.bad_steps)
            if st.bad_steps >= self.max_bad:
                raise too_many_bad(st.step, st.bad_steps)
            return False
        st.step += 1
        st.bad_steps = 0
        st.tokens += n_tokens
        st.window_loss += self.loss
        st.window_tokens += n_tokens
        return True

    def read(self, st: TrainState) -> None:
        """Nothing is left unread."""


def make_checks(cfg: TrainConfig, device: torch.device, ema: WeightEMA | None,
                scaled: bool) -> HostChecks | DeviceChecks:
    """A step's checks, chosen once by train.skip_check: deferred to the device (training/deferred.py) with
    `device`, or with `auto` on CUDA; else read on the host. `scaled`: fp16's gradient scaler is on."""
    if cfg.skip_check == "device" or (cfg.skip_check == "auto" and device.type == "cuda"):
        from attn_mt.training.deferred import DeviceChecks

        return DeviceChecks(cfg, device, ema, scaled)
    return HostChecks(cfg)


@dataclass(frozen=True)
class Step:
    """What one `Trainer.step` did: its summed loss (None: skipped, or with deferred checks not read),
    global target tokens and rate, the clock and Ctrl-C flag as every rank agreed on them, and its place in
    the schedule (None: a skipped step with host checks, which takes none)."""

    loss: float | None
    n_tokens: int
    lr: float
    elapsed: float
    interrupted: bool
    number: int | None


class InPlace:
    """Each step's batches built when the step asks (data/prefetch.py's Prefetcher builds them ahead on a GPU)."""

    def take(self, key: Hashable, make: Callable[[], T]) -> T:
        return make()

    def ahead(self, key: Hashable, make: Callable[[], object]) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> InPlace:
        return self

    def __exit__(self, *exc) -> None:
        pass


class Trainer(TrainStep):
    """A TrainStep that walks through a corpus's token batches, epoch by epoch, in the order
    (seed, epoch) fixes, keeping the counters of the run in `state` (exact after `read`)."""

    def __init__(self, model: Seq2Seq, cfg: ExperimentConfig, corpus: Corpus, device: torch.device,
                 precision: str, *, net: nn.Module | None = None, world: World = World()) -> None:
        super().__init__(model, cfg.train, device, precision, net=net, world=world)
        self.corpus, self.split = corpus, cfg.data.splits.train
        self.src_lens, self.tgt_lens = corpus.lengths(self.split)
        self.state = TrainState()
        self._plan: tuple[int, list[list[int]]] = (-1, [])
        self.prefetch: InPlace | Prefetcher = InPlace()
        if device.type == "cuda":  # the next step's batches built in a thread while the GPU runs this one
            from attn_mt.data.prefetch import Prefetcher  # an extra: loaded where it is used

            self.prefetch = Prefetcher()

    def read(self) -> None:
        """The counters into `state`, exact (with deferred checks one host sync; nothing to do with host
        checks). Raises TrainError when train.max_bad_steps non-finite steps came in a row."""
        self.checks.read(self.state)

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
        shards = [self.world.shard(b) for b in group]
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
            sync = self.world.all_sum(torch.cat([loss.float().view(1), flags]))
            loss, interrupted, elapsed = sync[0], bool(sync[1] > 0), float(sync[2])
        if spent is None:
            steps, tokens = self.checks.counted(st)
            spent = budget_spent(tc, steps, elapsed, st.epoch + st.batch_in_epoch / len(batches), tokens)
        number = self.checks.next_step(st)
        lr = lr_at(number, tc, spent)
        st.batch_in_epoch += len(weights)
        value = self.update(loss, lr)
        counts = self.checks.count(st, n_tokens)
        return Step(value, n_tokens, lr, elapsed, interrupted, number if counts else None)
