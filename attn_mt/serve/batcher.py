"""The job queue in front of the one thread that owns the model, and batching in whole model calls.

`JobQueue` is what both ways of batching share: a bounded queue of jobs, held answers, stop.
`Batcher` (export folders, RNN checkpoints) decodes in whole calls, as below; serve/scheduler.py's
`Scheduler` (Transformer checkpoints) lets sentences join and leave at every decoder step.

Each request becomes a `Job` with a `concurrent.futures.Future`. Jobs with the same decoding
settings (`key`) form a group; all attention jobs (key None) form one. The worker serves the groups
in turn: a call takes one item (sentence) from every job of the first group in the queue in turn (an
attention call: one job), until it holds `max_batch` items or `max_batch_work` units of work (source
tokens x beam; a single larger item runs alone), and then the group's jobs go to the back of the
queue. So a request waits, before its first item is decoded, for the call running when it came and
at most one call of each group ahead of it, however many sentences or attention jobs the others
sent: a huge request is decoded in several calls with everyone else's in between. (Splitting
max_batch_work among the groups would shorten that wait but multiply the calls, each with its fixed
cost per decoder step.) The first job of a call waits up to `max_wait_s` for company; under load the
queue is never empty.

At most `max_queue` requests wait or decode at once (`QueueFull` beyond); one submitted with `hold`
keeps its place after its answer until `release` (the app: until the client has taken the answer). A
job whose client went away (its future cancelled) is dropped when the worker next looks at it, and a
model call whose jobs are all gone stops at its next decoder step: the model calls `check()` at each
step, which raises `Abandoned`. `stop()` (safe in a signal handler: it only sets a flag) makes the
worker stop the running call at its next step and fail every waiting job with `Stopping`.

One job: queuing model work for the one worker thread.

Tested in tests/serve/test_serve.py (the batcher) and tests/serve/test_scheduler.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue already holds `max_queue` requests."""


class Stopping(Exception):
    """The server is shutting down."""


class Abandoned(Exception):
    """Raised inside a model call whose clients have all gone, or when the server stops."""


@dataclass(eq=False)
class Job:
    """Work for the model. Jobs with equal `key` (not None) share calls: `run_batch` gets items of
    several."""

    key: Hashable | None  # decoding settings; None: run alone with `run_one`
    items: list[Any]
    costs: list[int]  # work units of each item
    hold: bool = False  # keep its place in the queue after its answer, until Batcher.release
    # (item, kind, value): progress, in the worker
    watch: Callable[[int, str, Any], None] | None = None
    future: Future = field(default_factory=Future)
    results: dict[int, Any] = field(default_factory=dict)
    next: int = 0  # the first item not yet handed to the model

    def tell(self, i: int, kind: str, value: Any) -> None:
        """Progress to the watcher; one that fails (its event loop closed) is told nothing more."""
        try:
            self.watch(i, kind, value)
        except Exception:  # noqa: BLE001 - the worker must outlive any watcher
            log.exception("a job's watcher failed")
            self.watch = None

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.future.done():
            return
        try:  # the client may cancel between the check and here
            self.future.set_exception(error) if error else self.future.set_result(result)
        except InvalidStateError:
            pass


class JobQueue:
    """A bounded queue of jobs in front of one worker thread, the only one that calls the model;
    subclasses say how the worker takes jobs (`_work`): `Batcher` in whole model calls,
    serve/scheduler.py's `Scheduler` at every decoder step.

    At most `max_queue` requests wait or decode at once (`submit` raises QueueFull beyond).
    """

    def __init__(self, run_one: Callable[[Any], Any], max_queue: int) -> None:
        self.run_one, self.max_queue = run_one, max_queue
        self.waiting: deque[Job] = deque()  # jobs with items not yet handed to the model
        # jobs not answered, or held until released: what max_queue bounds
        self.pending: dict[Future, Job] = {}
        self.batches = self.items = 0  # model calls and the items they took, for /api/info
        self._stopping = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, key: Hashable | None, items: list, costs: list[int] | None = None,
               hold: bool = False, watch: Callable[[int, str, Any], None] | None = None) -> Future:
        """Queue a job; its future gets the list of results (or the single result when key is None).
        With `hold`, an answered job counts against max_queue until `release(future)`; `watch(i,
        kind, value)` gets item i's progress, where the worker has any ("token", "hypothesis"), then
        ("done", its result)."""
        job = Job(key, items, costs or [1] * len(items), hold=hold, watch=watch)
        with self._cond:
            if self._stopping:
                raise Stopping("the server is shutting down")
            if len(self.pending) >= self.max_queue:
                raise QueueFull(f"{len(self.pending)} requests are waiting; at most "
                                f"{self.max_queue}")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="attn-mt-model",
                                                daemon=True)
                self._thread.start()
            self.waiting.append(job)
            self.pending[job.future] = job
            job.future.add_done_callback(self._done)
            self._cond.notify()
        return job.future

    def _done(self, future: Future) -> None:  # answered, failed or cancelled
        job = self.pending.get(future)
        if job is None or not job.hold or future.cancelled() or future.exception() is not None:
            self.release(future)

    def release(self, future: Future) -> None:
        """A held job's answer has been delivered (or never will be): its place in the queue is
        free."""
        self.pending.pop(future, None)

    def stop(self) -> None:
        """Stop the running call at its next step and fail the waiting jobs; only sets a flag."""
        self._stopping = True

    def close(self, timeout: float = 5.0) -> None:
        """stop(), then wait (at most `timeout` seconds) for the worker to end."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def _work(self) -> None:
        raise NotImplementedError

    def _fail_waiting(self) -> None:
        with self._cond:
            for job in self.waiting:
                job.settle(error=Stopping("the server is shutting down"))
            self.waiting.clear()


class Batcher(JobQueue):
    """A bounded, fair queue of jobs in front of one worker thread that calls the model in whole
    calls.

    Args:
        run_batch: (key, items) -> one result per item, for jobs with a key (translation).
        run_one: (item) -> result, for jobs without a key (attention maps).
        max_batch: items per model call.
        max_batch_work: work units per model call (a single larger item still runs, alone).
        max_wait_s: how long the first job of a call waits for company.
        max_queue: requests waiting or decoding; `submit` raises QueueFull beyond.
    """

    def __init__(self, run_batch: Callable[[Hashable, list], list], run_one: Callable[[Any], Any],
                 *, max_batch: int = 64, max_batch_work: int = 1 << 62, max_wait_s: float = 0.005,
                 max_queue: int = 64) -> None:
        super().__init__(run_one, max_queue)
        self.run_batch = run_batch
        self.max_batch, self.max_batch_work, self.max_wait_s = max_batch, max_batch_work, max_wait_s
        self._running: list[Job] = []

    @property
    def rows(self) -> int:
        """Sentences decoded, summed over the model calls (each is in one call)."""
        return self.items

    @property
    def mean_batch(self) -> float:
        """Sentences per model call so far."""
        return self.rows / self.batches if self.batches else 0.0

    def check(self) -> None:
        """Called by the model at each decoder step: raise Abandoned if nobody waits for this
        call."""
        if self._stopping or (self._running
                              and all(job.future.cancelled() for job in self._running)):
            raise Abandoned

    def _work(self) -> None:
        while (call := self._next_call()) is not None:
            if call[1]:  # empty when every job of the group left while it waited for company
                self._run(*call)
        self._fail_waiting()

    def _next_call(self) -> tuple[Hashable | None, list[tuple[Job, int]]] | None:
        """(key, [(job, item index)]): items taken from every job of the first job's group in
        turn."""
        with self._cond:
            # wait for work; poll the stop flag, which a signal handler sets without the lock
            while True:
                for job in [j for j in self.waiting if j.future.done()]:  # cancelled by its client
                    self.waiting.remove(job)
                if self._stopping:
                    return None
                if self.waiting:
                    break
                self._cond.wait(0.1)
            first = self.waiting[0]
            if first.key is not None:
                deadline = time.monotonic() + self.max_wait_s
                while (self._open(first.key) < self.max_batch
                       and (left := deadline - time.monotonic()) > 0):
                    self._cond.wait(left)  # company: jobs that arrive within max_wait_s
            group = [j for j in self.waiting if j.key == first.key]
            picks: list[tuple[Job, int]] = []
            work, taking = 0, True
            while taking:  # one item of each job in turn; one attention job (key None) a call
                taking = False
                for job in group:
                    if (job.future.done() or job.next == len(job.items)
                        or len(picks) == self.max_batch):
                        continue
                    cost = job.costs[job.next]
                    if picks and (first.key is None or work + cost > self.max_batch_work):
                        continue
                    picks.append((job, job.next))
                    job.next, work, taking = job.next + 1, work + cost, True
            # the group served goes to the back of the queue; finished jobs leave it
            for job in group:
                self.waiting.remove(job)
                if job.next < len(job.items):
                    self.waiting.append(job)
            return first.key, picks

    def _open(self, key: Hashable) -> int:
        return sum(len(j.items) - j.next for j in self.waiting if j.key == key)

    def _run(self, key: Hashable | None, picks: list[tuple[Job, int]]) -> None:
        jobs = list(dict.fromkeys(job for job, _ in picks))
        self._running = jobs
        self.batches += 1
        self.items += len(picks)
        try:
            if key is None:
                results = [self.run_one(jobs[0].items[0])]
            else:
                results = self.run_batch(key, [job.items[i] for job, i in picks])
        except Abandoned:  # every client of this call left, or the server stops
            for job in jobs:
                job.settle(error=Stopping("the server is shutting down"))
            return
        except Exception as e:  # noqa: BLE001 - the worker must outlive any request
            log.exception("model call failed")
            for job in jobs:
                job.settle(error=e)
            with self._cond:
                for job in jobs:
                    if job in self.waiting:
                        self.waiting.remove(job)
            return
        finally:
            self._running = []
        for (job, i), result in zip(picks, results, strict=True):
            job.results[i] = result
            if job.watch is not None and key is not None:
                job.tell(i, "done", result)
            if key is None:
                job.settle(result)
            elif len(job.results) == len(job.items):
                job.settle([job.results[k] for k in range(len(job.items))])
