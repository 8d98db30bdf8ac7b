"""A training step that never waits for the device (`train.skip_check=device`, the default on CUDA).

With host checks the step reads the loss and gradient norm after every step to skip a non-finite one:
one device sync per step, which keeps a fast GPU idle while the host catches up. Here the decision stays
on the device, as a 0-dim `finite` tensor:

- `Guard` copies what an update changes (the trained parameters, the optimizer's state, the EMA's
  average) before the optimizer step and puts it back where `finite` is false, with `torch.where`. While
  every step is finite the result is the update itself, bit for bit; state that a skipped first step
  created is set to zeros, which is what a fresh AdamW or Muon state holds. Optimizer counters kept on
  another device (AdamW's and Muon's step counts live on the CPU unless fused) count every attempt and
  are set back by the skipped ones at the next read (`uncount`). torch's fused AdamW (the CUDA default)
  skips the update itself when given `found_inf`, as the gradient scaler uses it: there only the EMA's
  average is copied.
- `Tally` sums the loss, steps, tokens and skipped steps on the device, in float64 (exact for integers
  below 2**53, and the loss sum the same additions as the host's float sum), and is read in one
  `.tolist()` when the trainer logs, evaluates, checkpoints or stops (`Trainer.read`).

Counted on the host meanwhile, every attempt as a step: the learning rate's step (a skipped step keeps its
place in the schedule) and the EMA's update count (set to the steps taken at each read). Under torchrun the
step still reads the shared clock and Ctrl-C flag from its one small all-reduce.

Tested in tests/training/test_deferred.py (same weights and losses as host checks, a skipped step changes
nothing, bit-exact resume, max_bad_steps) and tests/test_gpu.py (no sync in a CUDA step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attn_mt.training.ema import WeightEMA


class Guard:
    """Undoes, on the device, an optimizer step (and EMA update) whose `finite` flag is false."""

    def __init__(self, opt: torch.optim.Optimizer, ema: WeightEMA | None, device: torch.device,
                 scaled: bool = False) -> None:
        self.opt, self.ema, self.device = opt, ema, device
        # fused AdamW takes the skip as found_inf (unless the fp16 scaler passes its own)
        self.native = type(opt) is torch.optim.AdamW and bool(opt.defaults.get("fused")) and not scaled
        self.before: list[Tensor] = []
        self.copies: list[Tensor] = []  # reused from step to step while the guarded tensors stay the same

    def _state(self) -> list[Tensor]:
        return [v for s in self.opt.state.values() for v in s.values() if isinstance(v, Tensor)]

    def guarded(self) -> list[Tensor]:
        """What a step may change on the step's device: parameters, optimizer state, the EMA's weights."""
        params = [p for g in self.opt.param_groups for p in g["params"]] if not self.native else []
        ema = self.ema.weights if self.ema is not None else []
        return [t for t in [*params, *(self._state() if not self.native else []), *ema] if t.device == self.device]

    @torch.no_grad()
    def save(self, finite: Tensor) -> None:
        """Before the step: copy the guarded tensors (into the buffers of the last step when they fit)."""
        if self.native:
            self.opt.found_inf = (~finite).float()  # read by torch's fused step, as GradScaler sets it
        before = self.guarded()
        if [id(t) for t in before] != [id(t) for t in self.before]:
            self.copies = [t.clone() for t in before]
        elif before:
            torch._foreach_copy_(self.copies, before)
        self.before = before

    @torch.no_grad()
    def restore(self, finite: Tensor) -> None:
        """After the step: where `finite` (0-dim bool) is false, the copies again; new state becomes zeros."""
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
        """At a read: optimizer counters off the step's device counted `skipped` steps that did not happen."""
        if skipped:
            for t in self._state():
                if t.device != self.device:
                    t.sub_(skipped)


@dataclass(frozen=True)
class Counts:
    """The counters as read: the window's loss sum and target tokens (from the last progress report on),
    the steps taken, their target tokens and the steps skipped since the last read, the non-finite steps in
    a row now and the longest such run since the last read, and the last step's gradient norm (NaN: none)."""

    window_loss: float
    window_tokens: int
    steps: int
    tokens: int
    skipped: int
    bad: int
    longest_bad: int
    grad_norm: float


class Tally:
    """The run's counters on the device between two reads, started from a TrainState's."""

    def __init__(self, device: torch.device, window_loss: float, window_tokens: int, bad: int) -> None:
        # (8,) float64: window loss, window tokens, steps, tokens, skipped, bad, longest bad, grad norm
        self.values = torch.zeros(8, dtype=torch.float64, device=device)
        for i, value in ((0, window_loss), (1, window_tokens), (5, bad), (6, bad), (7, float("nan"))):
            self.values[i].fill_(value)  # a kernel argument: no copy from the host, no sync

    @torch.no_grad()
    def add(self, loss: Tensor, finite: Tensor, n_tokens: int, norm: Tensor | None) -> None:
        """One step: its summed loss and `n_tokens` count where `finite`, else a skipped step."""
        v, taken = self.values, finite.double()
        v[0].add_(torch.where(finite, loss.double(), 0.0))
        v[1].add_(taken, alpha=n_tokens)
        v[2].add_(taken)
        v[3].add_(taken, alpha=n_tokens)
        v[4].add_(1.0 - taken)
        v[5].add_(1.0).mul_(1.0 - taken)
        torch.maximum(v[6], v[5], out=v[6])
        if norm is not None:
            v[7].copy_(norm)

    def read(self) -> Counts:
        """The one host sync of a window."""
        loss, window_tokens, steps, tokens, skipped, bad, longest, norm = self.values.tolist()
        return Counts(loss, int(window_tokens), int(steps), int(tokens), int(skipped), int(bad), int(longest), norm)
