"""Tokenizing a big training split in several processes (speed machinery: build.py loads this module
only when its corpus is big enough, `BIG` pairs, and more than one core tokenizes it).

The worker processes that `datasets.map` forks never hold the cache's lock and die with the process
that started them, also when it is killed by SIGKILL: a SIGTERM'd `prepare` leaves no worker holding
500 MB. Tested in tests/data/test_build.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable


def map_in_processes(text, fn: Callable, procs: int, **mapping):
    """`text.map(fn, num_proc=procs, **mapping)`, its workers ended with this process."""
    with _children_die_with_this_process():
        return text.map(_Watched(fn), num_proc=procs, **mapping)


class _Watched:
    """`fn` in a worker process: each call first checks that the process that started it is alive,
    and exits if not (where the kernel cannot be asked to end it: see
    `_children_die_with_this_process`). Picklable when `fn` is."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.parent = fn, os.getpid()

    def __call__(self, batch):
        if os.getpid() != self.parent and not _alive(self.parent):
            os._exit(1)
        return self.fn(batch)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


_parent: int | None = None  # inside `_children_die_with_this_process`: this process's pid
_prctl = None


def _after_fork_in_child() -> None:
    """Ask the kernel to SIGKILL this child when its parent dies (Linux), and exit if it already
    has."""
    global _parent
    parent, _parent = _parent, None  # its own children are not covered
    if parent is None:
        return
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request
        os._exit(1)


@contextlib.contextmanager
def _children_die_with_this_process():
    """Processes forked in the block (datasets' map workers and its queue manager) are killed by the
    kernel when this process dies, also by SIGKILL."""
    global _parent, _prctl
    if _prctl is None and sys.platform == "linux":
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _parent = os.getpid()
    try:
        yield
    finally:
        _parent = None
