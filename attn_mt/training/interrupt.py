"""Ctrl-C while training: the loop saves after the current step and stops (`StopOnInterrupt`),
raising `TrainInterrupted`; `train(..., resume=True)` continues the run.

Tested in tests/training/test_resume.py.
"""

from __future__ import annotations

import logging
import signal
import threading

from attn_mt.errors import Interrupted, TrainError

log = logging.getLogger(__name__)


class TrainInterrupted(TrainError, Interrupted):
    """Ctrl-C: the run saved checkpoint_last.pt and stopped; `resume=True` continues it."""


class StopOnInterrupt:
    """While training, Ctrl-C sets `requested`: the loop saves after the current step and stops.

    A second Ctrl-C interrupts at once (the last saved checkpoint stays as it was).
    """

    def __enter__(self) -> StopOnInterrupt:
        self.requested, self.previous = False, None
        main = threading.current_thread() is threading.main_thread()  # only it receives signals
        if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self.previous = signal.signal(signal.SIGINT, self._handle) or signal.default_int_handler
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)
        log.warning("interrupted: saving after this step (Ctrl-C again to stop without saving)")

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
