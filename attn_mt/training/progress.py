"""What a training run tells the person waiting for it: progress within each epoch, and one summary
at the end.

On a terminal each epoch gets a tqdm bar (steps, tokens/s, loss, learning rate, and the time left in
the whole run's budget), and in a Jupyter notebook tqdm's notebook bar (`tqdm.auto`); when stderr is
neither (a log file, CI, `make demo | tee`) the same figures go out as a plain log line every
`every_s` seconds instead, so long work is never silent.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm

from attn_mt.rundir import RunDir
from attn_mt.training.schedule import budget_spent

if TYPE_CHECKING:
    from attn_mt.training.start import Training

log = logging.getLogger(__name__)

PLAIN_EVERY_S = 30.0  # seconds between progress lines when stderr is not a terminal


def duration(seconds: float) -> str:
    """'45 s', '3 min 05 s', '1 h 02 min'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def time_left(elapsed_s: float, spent: float) -> float | None:
    """Seconds left when `spent` (0..1) of the budget took `elapsed_s`; None before there is a
    rate."""
    if spent <= 0.01 or spent >= 1.0:
        return None if spent < 1.0 else 0.0
    return elapsed_s * (1.0 - spent) / spent


class Progress:
    """Progress of one epoch: `update()` after each optimizer step, `report(...)` when new figures
    exist (every train.log_every steps); without a terminal, a line of the latest figures every
    `every_s` seconds."""

    def __init__(self, epoch: int, total: int, initial: int = 0, enabled: bool = True,
                 terminal: bool | None = None, every_s: float = PLAIN_EVERY_S) -> None:
        self.epoch, self.total, self.done, self.enabled = epoch, total, initial, enabled
        notebook = terminal is None and in_notebook()
        self.terminal = (sys.stderr.isatty() or notebook) if terminal is None else terminal
        self.every_s, self.last_line = every_s, time.perf_counter()
        # (step, loss, lr, tokens/s, seconds left) of the last report
        self.figures: tuple | None = None
        bar = auto_tqdm if notebook else tqdm
        self.bar = bar(total=total, initial=initial, desc=f"epoch {epoch}", unit="step",
                       dynamic_ncols=True, leave=False, disable=not (enabled and self.terminal))

    def update(self) -> None:
        self.done += 1
        self.bar.update(1)
        if self.figures and not self.terminal:
            self._line()

    def report(self, step: int, loss: float, lr: float, tokens_per_s: float,
               left_s: float | None) -> None:
        """New figures: on the bar at once; as a line when `every_s` passed since the last line."""
        if not self.enabled:
            return
        self.figures = (step, loss, lr, tokens_per_s, left_s)
        if not self.terminal:
            self._line()
            return
        left = {"run": f"{duration(left_s)} left"} if left_s is not None else {}
        self.bar.set_postfix({"loss": f"{loss:.3f}", "tok/s": f"{tokens_per_s:,.0f}",
                              "lr": f"{lr:.1e}", **left},
                             refresh=False)

    def _line(self) -> None:
        """The latest figures as a log line, at most one every `every_s` seconds."""
        now = time.perf_counter()
        if now - self.last_line < self.every_s:
            return
        self.last_line = now
        step, loss, lr, tokens_per_s, left_s = self.figures
        left = f", about {duration(left_s)} left" if left_s is not None else ""
        log.info("epoch %d, batch %d/%d (step %d): loss %.3f, %s tokens/s, lr %.1e%s", self.epoch,
                 self.done, self.total, step, loss, f"{tokens_per_s:,.0f}", lr, left)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Epochs:
    """A run's epochs' bars in turn (rank 0 shows them): `bar`, the current epoch's, in optimizer
    steps, opened before its first step; `close` at its end; the last one closed at the block's
    end."""

    def __init__(self, run: Training) -> None:
        self.run, self.open = run, None

    @property
    def bar(self) -> Progress:
        if self.open is None:
            st, tc = self.run.state, self.run.cfg.train
            steps = -(-len(self.run.trainer.epoch_batches()) // tc.accum_steps)
            self.open = Progress(st.epoch + 1, steps, st.batch_in_epoch // tc.accum_steps,
                                 self.run.world.main)
        return self.open

    def close(self) -> None:
        if self.open is not None:
            self.open.close()
            self.open = None

    def __enter__(self) -> Epochs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def report_progress(run: Training, bar: Progress, lr: float) -> None:
    """Mean loss and tokens/s over the steps since the last report, on the progress bar and
    TensorBoard."""
    run.trainer.read()
    st, now = run.state, time.perf_counter()
    if not st.window_tokens:  # deferred checks: every step since the last report was skipped
        return
    st.train_loss = st.window_loss / st.window_tokens
    run.tokens_per_s = st.window_tokens / max(now - run.window_t0, 1e-9)
    epochs = st.epoch + bar.done / max(bar.total, 1)
    spent = budget_spent(run.cfg.train, st.step, run.elapsed(), epochs, st.tokens)
    bar.report(st.step, st.train_loss, lr, run.tokens_per_s, time_left(run.elapsed(), spent))
    if run.board is not None:
        run.board.scalars(st.step, "train", {"loss": st.train_loss, "lr": lr,
                                             "tokens_per_s": run.tokens_per_s,
                                             "grad_norm": run.trainer.grad_norm})
    st.window_loss, st.window_tokens, run.window_t0 = 0.0, 0, now


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, VS Code, nbclient), where stderr is no terminal but
    shows bars."""
    ipython = sys.modules.get("IPython")
    shell = (ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython")
             else None)
    return type(shell).__name__ == "ZMQInteractiveShell"


def write(message: str) -> None:
    """A log line on stderr that does not break a progress bar on the terminal (none when logging is
    quiet)."""
    if log.isEnabledFor(logging.INFO):
        tqdm.write(message, file=sys.stderr)


def summary(run_dir: Path) -> str:
    """A finished run's result from its results.json, in two lines: the test scores, then the
    checkpoint."""
    files = RunDir(run_dir)
    # a missing one: FileNotFoundError, as before
    r = json.loads(files.results.read_text(encoding="utf-8"))
    return (f"test BLEU {r['test_bleu']:.2f}  chrF {r['test_chrf']:.2f}  ({r['test_split']}, "
            f"{r['sacrebleu_signature']})\n"
            f"{'averaged' if 'avg' in r.get('tested', '') else 'best'} checkpoint: "
            f"{files.tested(r)} "
            f"({r['steps']} steps, {duration(r['train_seconds'])} of training)")
