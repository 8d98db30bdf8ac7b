"""How a step finds out that its loss and gradient norm are finite: `HostChecks` reads them after
every step; on CUDA training/deferred.py's `DeviceChecks` reads nothing and counts on the device
until the trainer's `read` (variants.py's `make_checks` chooses one, once).

Tested in tests/training/test_deferred.py and tests/training/test_trainer.py.
"""

from __future__ import annotations

import logging
import math

import torch

from attn_mt.config import TrainConfig
from attn_mt.training.schedule import TrainState
from attn_mt.training.stops import too_many_bad

log = logging.getLogger(__name__)


class HostChecks:
    """train.skip_check=host, the default off CUDA: each step reads its loss and gradient norm (its
    one host sync) and skips a non-finite update; a skipped step takes no place in the schedule,
    and the counters in `TrainState` are always exact."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.max_bad = cfg.max_bad_steps
        self.loss: float | None = None  # the last step's summed loss; None: not finite, skipped
        self.grad_norm: float | None = None

    def before(self, opt: torch.optim.Optimizer, loss: torch.Tensor,
               norm: torch.Tensor | None) -> bool:
        """Whether the step's update is made: its loss and norm are finite."""
        values = torch.stack([loss] if norm is None else [loss, norm]).tolist()  # the host sync
        self.grad_norm = values[1] if norm is not None else None
        finite = all(math.isfinite(v) for v in values)
        self.loss = values[0] if finite else None
        return finite

    def after(self) -> None:
        pass

    def next_step(self, st: TrainState) -> int:
        """The coming step's place in the schedule (learning rate; log, evaluation and checkpoint
        cadence)."""
        return st.step + 1

    def counted(self, st: TrainState) -> tuple[int, int]:
        """(steps, target tokens) for the budget."""
        return st.step, st.tokens

    def count(self, st: TrainState, n_tokens: int) -> bool:
        """The step just made into `st`; whether it took its place in the schedule (False:
        skipped)."""
        if self.loss is None:
            st.bad_steps += 1
            st.skipped_steps += 1
            log.warning("step %d: non-finite loss, step skipped (%d in a row)", st.step + 1,
                        st.bad_steps)
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
