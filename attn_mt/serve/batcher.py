"""Dynamic batching: one worker thread owns the model; requests from many clients share its batches.

Each request becomes a `Job` with a `concurrent.futures.Future`. The worker takes the first job
waiting, then keeps collecting for at most `max_wait_s` (or until `max_batch` sentences), and
decodes all translation jobs with the same decoding settings in one `translate_nbest` call. While a
batch runs, new requests queue up and form the next one, so under load the wait costs nothing and
batches grow with the number of clients. A job whose client went away before the worker reached it
is cancelled and never decoded.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Job:
    """Work for the model. Jobs with equal `key` (not None) are batched: `run_batch` gets their `items`."""

    key: Hashable | None  # decoding settings; None: run alone with `run_one`
    items: list[Any]
    future: Future = field(default_factory=Future)


class Batcher:
    """A queue of jobs in front of one worker thread that calls the model.

    Args:
        run_batch: (key, items) -> one result per item, for jobs with a key (translation).
        run_one: (item) -> result, for jobs without a key (attention maps).
        max_batch: sentences per batch; more waiting jobs go into the next batch.
        max_wait_s: how long the first job of a batch waits for company.
    """

    def __init__(self, run_batch: Callable[[Hashable, list], list], run_one: Callable[[Any], Any], *,
                 max_batch: int = 64, max_wait_s: float = 0.005) -> None:
        self.run_batch, self.run_one = run_batch, run_one
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.batches = self.items = 0  # model calls and the items they took, for /api/info
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, key: Hashable | None, items: list) -> Future:
        """Queue a job; its future gets the list of results (or the single result when key is None)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="attn-mt-model", daemon=True)
                self._thread.start()
        job = Job(key, items)
        self.jobs.put(job)
        return job.future

    def close(self) -> None:
        """Let the worker finish the jobs queued so far and stop."""
        with self._lock:
            if self._thread is not None:
                self.jobs.put(None)
                self._thread.join()
                self._thread = None

    def _work(self) -> None:
        while True:
            batch, stop = self._collect()
            self._run(batch)
            if stop:
                return

    def _collect(self) -> tuple[list[Job], bool]:
        """The first waiting job and those that arrive within max_wait_s, up to max_batch sentences."""
        first = self.jobs.get()
        if first is None:
            return [], True
        batch, size = [first], len(first.items)
        deadline = time.monotonic() + self.max_wait_s
        while size < self.max_batch:
            try:  # take what is already queued without waiting, then wait out the deadline
                job = self.jobs.get(timeout=max(0.0, deadline - time.monotonic())) \
                    if self.jobs.empty() else self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return batch, True
            batch.append(job)
            size += len(job.items)
        return batch, False

    def _run(self, batch: list[Job]) -> None:
        groups: dict[Hashable, list[Job]] = {}
        for i, job in enumerate(batch):  # jobs without a key run alone
            groups.setdefault(("alone", i) if job.key is None else job.key, []).append(job)
        for key, jobs in groups.items():
            # a cancelled future: its client left while the job waited; it is never decoded
            jobs = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if not jobs:
                continue
            if jobs[0].key is None:
                self._settle(jobs, self._one, jobs[0].items[0])
            else:
                self._settle(jobs, self.run_batch, key, [item for job in jobs for item in job.items])

    def _one(self, item: Any) -> list:
        return [self.run_one(item)]

    def _settle(self, jobs: list[Job], compute: Callable[..., list], *args: Any) -> None:
        """Run `compute(*args)`; hand each job its slice of the results, or the exception to all of them."""
        self.batches += 1
        self.items += sum(len(job.items) for job in jobs)
        try:
            results = compute(*args)
        except Exception as e:  # noqa: BLE001 - the worker must outlive any request
            log.exception("model call failed")
            for job in jobs:
                job.future.set_exception(e)
            return
        start = 0
        for job in jobs:
            if job.key is None:
                job.future.set_result(results[0])
            else:
                job.future.set_result(results[start : start + len(job.items)])
                start += len(job.items)
