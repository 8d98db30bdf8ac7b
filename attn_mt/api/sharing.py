"""One `Model` shared by threads: translations run side by side, while what changes the module (an
`explain`'s recording hook, `Model.to`) runs alone.

    >>> lock = Shared()
    >>> with lock.reading(): ...   # translate, score, attention: any number at once
    >>> with lock.writing(): ...   # explain, to: alone, after the readers in progress

Threads are served in the order they came (a writer waiting holds later readers back, and readers
waiting hold later writers back); a thread holding the writer may read (an analysis that
translates). `heads` and `prune` measure a copy of the module, taken while reading.

One job: the readers-writer lock. Tested in tests/api/test_threads.py.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager


class Shared:
    """Many readers or one writer, served in the order they came: readers that queue together enter
    together, and neither kind starves the other."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer: int | None = None  # the writing thread's id
        # (ticket, is a writer) of those waiting, in order
        self._queue: deque[tuple[int, bool]] = deque()
        self._tickets = itertools.count()

    def _first(self, ticket: int, writer: bool) -> bool:
        """Whether nothing that came before `ticket` blocks it: no writer before a reader, nobody
        before a writer."""
        for other, other_writes in self._queue:
            if other == ticket:
                return True
            if writer or other_writes:
                return False
        return True

    @contextmanager
    def _enter(self, writer: bool) -> Iterator[None]:
        me = threading.get_ident()
        if self._writer == me:  # the writer reads (or writes) its own state
            yield
            return
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append((ticket, writer))
            self._cond.wait_for(lambda: self._writer is None and (not writer or not self._readers)
                                and self._first(ticket, writer))
            self._queue.remove((ticket, writer))
            if writer:
                self._writer = me
            else:
                self._readers += 1
            self._cond.notify_all()  # readers queued behind this one may enter too
        try:
            yield
        finally:
            with self._cond:
                if writer:
                    self._writer = None
                else:
                    self._readers -= 1
                self._cond.notify_all()

    def reading(self) -> AbstractContextManager[None]:
        return self._enter(writer=False)

    def writing(self) -> AbstractContextManager[None]:
        return self._enter(writer=True)
