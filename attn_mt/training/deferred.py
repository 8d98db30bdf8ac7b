"""A training step that never waits for the device (`train.skip_check=device`, the default on CUDA).

With host checks the step reads the loss and gradient norm after every step to skip a non-finite
one: one device sync per step, which keeps a fast GPU idle while the host catches up. Here the
decision stays on the device, as a 0-dim `finite` tensor:

- `Guard` copies what an update changes (the trained parameters, the optimizer's state, the EMA's
  average) before the optimizer step and puts it back where `finite` is false, with `torch.where`.
  While every step is finite the result is the update itself, bit for bit; state that a skipped
  first step created is set to zeros, which is what a fresh AdamW or Muon state holds. Optimizer
  counters kept on another device (AdamW's and Muon's step counts live on the CPU unless fused)
  count every attempt and are set back by the skipped ones at the next read (`uncount`). torch's
  fused AdamW (the CUDA default) skips the update itself when given `found_inf`, as the gradient
  scaler uses it: there only the EMA's average is copied.
- `Tally` sums the loss, steps, tokens and skipped steps on the device, in float64 (exact for
  integers below 2**53, and the loss sum the same additions as the host's float sum), and is read in
  one `.tolist()` when the trainer logs, evaluates, checkpoints or stops (`Trainer.read`), or when
  the steps not read yet, counted as taken, reach train.max_steps or max_tokens (the run checks its
  limits on exact counts).
- `DeviceChecks` is the trainer's `checks` (checks.py's `make_checks` chooses it once) that uses
both.

Counted on the host meanwhile, every attempt as a step: the learning rate's step (a skipped step
keeps its place in the schedule) and the EMA's update count (set to the steps taken at each read).
Under torchrun the step still reads the shared clock and Ctrl-C flag from its one small all-reduce.

Tested in tests/training/test_deferred.py (same weights and losses as host checks, a skipped step
changes nothing, bit-exact resume, max_bad_steps) and tests/test_gpu.py (no sync in a CUDA step).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attn_mt.config import TrainConfig
from attn_mt.training.schedule import TrainState, limit_reached
from attn_mt.training.stops import too_many_bad

if TYPE_CHECKING:
    from attn_mt.training.ema import WeightEMA

log = logging.getLogger(__name__)


class Guard:
    """Undoes, on the device, an optimizer step (and EMA update) whose `finite` flag is false."""

    def __init__(self, opt: torch.optim.Optimizer, ema: WeightEMA | None, device: torch.device,
                 scaled: bool = False) -> None:
        self.opt, self.ema, self.device = opt, ema, device
        # fused AdamW takes the skip as found_inf (unless the fp16 scaler passes its own)
        self.native = (type(opt) is torch.optim.AdamW and bool(opt.defaults.get("fused"))
                       and not scaled)
        self.before: list[Tensor] = []
        # reused from step to step while the guarded tensors stay the same
        self.copies: list[Tensor] = []

    def _state(self) -> list[Tensor]:
        return [v for s in self.opt.state.values() for v in s.values() if isinstance(v, Tensor)]

    def guarded(self) -> list[Tensor]:
        """What a step may change on the step's device: parameters, optimizer state, the EMA's
        weights."""
        params = [p for g in self.opt.param_groups for p in g["params"]] if not self.native else []
        ema = self.ema.weights if self.ema is not None else []
        return [t for t in [*params, *(self._state() if not self.native else []), *ema]
                if t.device == self.device]

    @torch.no_grad()
    def save(self, finite: Tensor) -> None:
        """Before the step: copy the guarded tensors (into the buffers of the last step when they
        fit)."""
        if self.native:
            # read by torch's fused step, as GradScaler sets it
            self.opt.found_inf = (~finite).float()
        before = self.guarded()
        if [id(t) for t in before] != [id(t) for t in self.before]:
            self.copies = [t.clone() for t in before]
        elif before:
            torch._foreach_copy_(self.copies, before)
        self.before = before

    @torch.no_grad()
    def restore(self, finite: Tensor) -> None:
        """After the step: where `finite` (0-dim bool) is false, the copies again; new state becomes
        zeros."""
        if self.native:
            del self.opt.found_inf
        for t, copy in zip(self.before, self.copies, strict=True):
            torch.where(finite, t, copy, out=t)
        known = {id(t) for t in self.before}
        for t in self.guarded():
            if id(t) not in known:  # created by this (first) step
                torch.where(finite, t, torch.zeros((), dtype=t.dtype, device=t.device), out=t)

    @torch.no_grad()
    def uncount(self, skipped: int) -> None:
        """At a read: optimizer counters off the step's device counted `skipped` steps that did not
        happen."""
        if skipped:
            for t in self._state():
                if t.device != self.device:
                    t.sub_(skipped)


@dataclass
class Tally:
    """The run's counters on the device between two reads, each a 0-dim float64 tensor: the window's
    loss sum and target tokens (from the last progress report on), the steps taken, their target
    tokens and the steps skipped since the last read, the non-finite steps in a row now and the
    longest such run since the last read, and the last step's gradient norm (NaN: none)."""

    window_loss: Tensor
    window_tokens: Tensor
    steps: Tensor
    tokens: Tensor
    skipped: Tensor
    bad: Tensor
    longest_bad: Tensor
    grad_norm: Tensor

    @classmethod
    def start(cls, device: torch.device, window_loss: float, window_tokens: int, bad: int) -> Tally:
        """Counters started from a TrainState's (a fill kernel each: no copy from the host, no
        sync)."""
        values = {"window_loss": window_loss, "window_tokens": window_tokens, "bad": bad,
                  "longest_bad": bad, "grad_norm": float("nan")}
        return cls(**{f.name: torch.full((), values.get(f.name, 0.0), dtype=torch.float64,
                                         device=device)
                      for f in fields(cls)})

    @torch.no_grad()
    def add(self, loss: Tensor, finite: Tensor, n_tokens: int, norm: Tensor | None) -> None:
        """One step: its summed loss and `n_tokens` count where `finite`, else a skipped step."""
        taken = finite.double()
        self.window_loss.add_(torch.where(finite, loss.double(), 0.0))
        self.window_tokens.add_(taken, alpha=n_tokens)
        self.steps.add_(taken)
        self.tokens.add_(taken, alpha=n_tokens)
        self.skipped.add_(1.0 - taken)
        self.bad.add_(1.0).mul_(1.0 - taken)
        torch.maximum(self.longest_bad, self.bad, out=self.longest_bad)
        if norm is not None:
            self.grad_norm.copy_(norm)

    def read(self) -> dict[str, float]:
        """The counters by name, in the one host sync of a window."""
        names = [f.name for f in fields(self)]
        return dict(zip(names, torch.stack([getattr(self, n)
                                            for n in names]).tolist(), strict=True))


class DeviceChecks:
    """The step's checks without reading the device: the update is made and then undone on the
    device (`Guard`) when the loss or gradient norm is not finite, and counted in a `Tally` until
    `read`. Every attempted step, skipped or not, takes its place in the schedule. With fp16 the
    scaler's step still reads its own inf check."""

    loss = None  # a step's loss is not read

    def __init__(self, cfg: TrainConfig, device: torch.device, ema: WeightEMA | None,
                 scaled: bool) -> None:
        self.cfg, self.device, self.ema, self.scaled = cfg, device, ema, scaled
        self.guard: Guard | None = None  # made at the first step, from the optimizer it then has
        self.tally: Tally | None = None  # the device's counters since the last read
        # steps since the last read, and their target tokens
        self.pending, self.pending_tokens = 0, 0
        self.grad_norm: float | None = None  # as of the last read
        # the last step's: 0-dim bool, its summed loss, its gradient norm or None
        self.finite: Tensor | None = None
        self.losses: Tensor | None = None
        self.norm: Tensor | None = None

    def before(self, opt: torch.optim.Optimizer, loss: Tensor, norm: Tensor | None) -> bool:
        """Copy what the update changes; always True: the update is made (and undone in `after`)."""
        self.losses, self.norm = loss, norm
        self.finite = torch.stack([loss] if norm is None else [loss, norm]).isfinite().all()
        self.guard = self.guard or Guard(opt, self.ema, self.device, self.scaled)
        self.guard.save(self.finite)
        return True

    def after(self) -> None:
        self.guard.restore(self.finite)

    def next_step(self, st: TrainState) -> int:
        """The coming step's place in the schedule: every attempt counts, the unread ones too."""
        return st.step + st.skipped_steps + self.pending + 1

    def counted(self, st: TrainState) -> tuple[int, int]:
        """(steps, target tokens) for the budget: the unread steps counted as taken."""
        return st.step + self.pending, st.tokens + self.pending_tokens

    def count(self, st: TrainState, n_tokens: int) -> bool:
        """The step just made, counted on the device; read when the unread steps, counted as taken,
        reach a step or token limit, so that the run checks its limits on exact counts. Always True
        (see `next_step`)."""
        if self.tally is None:
            self.tally = Tally.start(self.device, st.window_loss, st.window_tokens, st.bad_steps)
        self.tally.add(self.losses, self.finite, n_tokens, self.norm)
        self.pending, self.pending_tokens = self.pending + 1, self.pending_tokens + n_tokens
        steps, tokens = self.counted(st)
        if limit_reached(self.cfg, steps, 0.0, tokens):
            self.read(st)
        return True

    def read(self, st: TrainState) -> None:
        """The device's counters into `st`, in one sync (nothing to do when none is unread). Raises
        TrainError when train.max_bad_steps non-finite steps came in a row."""
        if not self.pending:
            return
        got = self.tally.read()
        steps, skipped = int(got["steps"]), int(got["skipped"])
        first = st.step + st.skipped_steps + 1
        st.step, st.tokens = st.step + steps, st.tokens + int(got["tokens"])
        st.skipped_steps += skipped
        st.window_loss, st.window_tokens = got["window_loss"], int(got["window_tokens"])
        st.bad_steps = int(got["bad"])
        self.grad_norm = got["grad_norm"] if not self.scaled else None
        self.guard.uncount(skipped)
        if self.ema is not None:
            self.ema.updates = st.step  # it counted the attempts
        self.tally, self.pending, self.pending_tokens = None, 0, 0
        if skipped:
            log.warning("steps %d-%d: %d had a non-finite loss and were skipped", first,
                        first + steps + skipped - 1, skipped)
        if got["longest_bad"] >= self.cfg.max_bad_steps:
            raise too_many_bad(st.step, int(got["longest_bad"]))
