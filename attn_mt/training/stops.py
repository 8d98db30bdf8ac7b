"""Why a run stops, worded once: the limits and early stopping (`Stop`), logged and kept in
checkpoints as `TrainState.stopped`, and the error after too many non-finite steps (`too_many_bad`).

Tested in tests/training/test_schedule.py.
"""

from __future__ import annotations

from attn_mt.config import TrainConfig
from attn_mt.errors import TrainError


class Stop:
    """Why a run stops, worded once: logged, and kept in checkpoints as `TrainState.stopped`."""

    @staticmethod
    def max_epochs(cfg: TrainConfig) -> str:
        return f"reached train.max_epochs={cfg.max_epochs}"

    @staticmethod
    def max_steps(cfg: TrainConfig) -> str:
        return f"reached train.max_steps={cfg.max_steps}"

    @staticmethod
    def max_tokens(cfg: TrainConfig) -> str:
        return f"reached train.max_tokens={cfg.max_tokens}"

    @staticmethod
    def max_minutes(cfg: TrainConfig) -> str:
        return f"reached train.max_minutes={cfg.max_minutes}"

    @staticmethod
    def patience(cfg: TrainConfig) -> str:
        return f"no BLEU improvement in {cfg.patience} evaluations"


def too_many_bad(step: int, in_a_row: int) -> TrainError:
    """The error that stops a run after train.max_bad_steps non-finite steps in a row."""
    return TrainError(f"stopped at step {step}: {in_a_row} non-finite losses in a row "
                      "(train.max_bad_steps); try a lower train.lr or train.clip_norm")
