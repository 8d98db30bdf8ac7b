"""Training: a run from set-up to test scores (`train`).

`train(cfg, run_dir)` sets the run up (start.py), then takes step after step, epoch after epoch;
after each step what its place in the schedule asks for (a progress report, an evaluation with its
checkpoints, a checkpoint), and at the end the test (finish.py). It writes into `run_dir` the
files rundir.py lists.

checkpoint_last.pt is saved at every evaluation, every `train.checkpoint_every` steps and on
Ctrl-C. `train(..., resume=True)` continues from it, also in the middle of an epoch: the batch
order is a function of (seed, epoch), the learning rate a function of the step, and the RNG,
optimizer and loss-window state travel in the checkpoint, so on CPU a resumed run ends with the
same parameters, bit for bit, as one that was never stopped.
"""

from __future__ import annotations

import logging
from pathlib import Path

from attn_mt.config import ExperimentConfig
from attn_mt.config.yamlconf import OptionError
from attn_mt.errors import TrainError
from attn_mt.rundir import RunDir
from attn_mt.training.evaluation import save_last, validation_round
from attn_mt.training.finish import wind_up
from attn_mt.training.interrupt import StopOnInterrupt, TrainInterrupted
from attn_mt.training.progress import Epochs, Progress, report_progress
from attn_mt.training.schedule import limit_reached
from attn_mt.training.start import Training, setup
from attn_mt.training.stops import Stop
from attn_mt.training.trainer import Step
from attn_mt.training.validation import Observer

__all__ = ["TrainError", "TrainInterrupted", "train"]
log = logging.getLogger(__name__)


def train(cfg: ExperimentConfig, run_dir: Path, resume: bool = False, overwrite: bool = False,
          init: dict | None = None, observers: tuple[Observer, ...] = ()) -> Path:
    """Train the configured model; returns the path of the checkpoint that was tested.

    A fresh run refuses a directory that holds an earlier run unless `overwrite`; `resume`
    continues one, and a run that had already finished is not trained further. `init`: the
    checkpoint state of the model `train.init_from` names (the run fine-tunes it). `observers`
    watch every evaluation (validation.Observer), rewound to where the run starts.
    """
    if resume and overwrite:
        raise OptionError("give one of resume and overwrite, not both", "overwrite")
    run = setup(cfg, RunDir(run_dir), resume, overwrite, init, observers)
    tr, st, tc = run.trainer, run.state, run.cfg.train
    done = run.finished  # why a resumed run had already finished, or None
    tested = bool(done) and run.files.results.exists()  # finished and tested: nothing to do
    if not done:
        tr.model.train()
    with StopOnInterrupt() as interrupt, tr.feed, Epochs(run) as epochs:
        while not done and st.epoch < tc.max_epochs:
            if tr.epoch_done:
                done = end_epoch(run, epochs)
                continue
            bar = epochs.bar  # the epoch's progress, shown from its first step
            out = tr.step(run.elapsed, lambda: interrupt.requested)
            bar.update()
            done = after_step(run, bar, out)
            if out.interrupted:  # Ctrl-C: checkpoint_last.pt, then stop
                save_last(run)
                raise TrainInterrupted(f"stopped at step {st.step}; {run.files.last} saved, "
                                       "continue with `resume`")
    done = done or Stop.max_epochs(tc)
    log.info("the run had already finished (%s): nothing to do" if tested else "stopped: %s", done)
    return wind_up(run, tested)


def after_step(run: Training, bar: Progress, out: Step) -> str | None:
    """What step number `out.number` asks for: a progress report, an evaluation (with a limit
    reached, the last one) or a checkpoint. Returns why the run stops, or None."""
    tc, st, n = run.cfg.train, run.state, out.number
    if n is None:  # a skipped step (host checks) takes no place in the schedule
        return None
    if n % tc.log_every == 0:
        report_progress(run, bar, out.lr)
    reason = limit_reached(tc, st.step, out.elapsed, st.tokens)  # exact counts (deferred.py)
    if reason or (tc.eval_every and n % tc.eval_every == 0):
        return validation_round(run, reason)
    if tc.checkpoint_every and n % tc.checkpoint_every == 0:
        save_last(run)
    return None


def end_epoch(run: Training, epochs: Epochs) -> str | None:
    """The epoch's end: its bar closed, the next epoch begun, and an evaluation with
    train.eval_every 0 or after the last epoch. Returns why the run stops, or None."""
    tc, st = run.cfg.train, run.state
    epochs.close()
    run.trainer.next_epoch()
    last = Stop.max_epochs(tc) if st.epoch == tc.max_epochs else None
    return validation_round(run, last) if not tc.eval_every or last else None
