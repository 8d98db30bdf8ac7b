"""Iteration-level scheduling: requests join and leave the running batch at every decoder step.

One worker thread owns the model. It keeps one running batch per decoding setting (`key`: for the
engine, the beam size and length limits; alpha and n-best are each sentence's own in
decoding/continuous.py's `RunningBatch`, so they share a batch) and loops:

1. Jobs whose client left (future cancelled) are dropped: from the queue, and their sentences from
   the running batches, whose rows are free from this step on.
2. Newcomers are taken from the queue (at once when nothing decodes, else every `join_every` steps,
   so that several are encoded together), one sentence of each waiting job in turn (a huge request
   gets one sentence in, then everyone else's), while the running batches together hold fewer than
   `max_batch` sentences and `max_batch_work` units of work (source tokens x beam; a single larger
   sentence joins an empty batch alone). The first sentence that does not fit waits at the head of
   the queue, so nobody is overtaken. Their encoder runs for them alone, once. An attention or
   explain job (key None) at the head runs alone here, between two steps.
3. Every running batch takes one decoder step, groups of other settings in turn.
4. Every sentence that ended is answered at once (its job when it was the job's last); progress
   (each new token of a greedy sentence, each finished beam hypothesis) goes to the job's `watch`.

So a request waits for at most `join_every` decoder steps (and at most one attention job) before its
first sentence is decoded, when there is room, and a sentence that ends early is answered then, not
when its batch ends.
`stop()` (a flag, safe in a signal handler) ends the loop after the current step: every waiting and
running job fails with `Stopping`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from .batcher import Job, JobQueue, Stopping

log = logging.getLogger(__name__)


class Running(Protocol):
    """A running batch of one key's sentences (the engine's, around decoding/continuous.py)."""

    def __len__(self) -> int: ...  # sentences in it

    # (tag, item) join from the next step
    def add(self, items: list[tuple[Hashable, Any]]) -> None: ...

    # one decoder step: events with .tag, .kind ("done": .value the result)
    def step(self) -> list: ...

    def drop(self, tags: set[Hashable]) -> None: ...  # these leave now


class Scheduler(JobQueue):
    """The queue and worker of continuous batching.

    Args:
        open_batch: key -> an empty running batch for that key's decoding settings. run_one: (item)
        -> result, for jobs without a key (attention maps, explain). max_batch: sentences in the
        running batches at once. max_batch_work: their work units at once (a single larger sentence
        still runs, alone). max_queue: requests waiting or decoding; `submit` raises QueueFull
        beyond. join_every: while sentences decode, newcomers join every this many steps (an empty
        batch: at once).
    """

    def __init__(self, open_batch: Callable[[Hashable], Running], run_one: Callable[[Any], Any], *,
                 max_batch: int = 64, max_batch_work: int = 1 << 62, max_queue: int = 64,
                 join_every: int = 2,
                 ) -> None:
        super().__init__(run_one, max_queue)
        self.open_batch, self.max_batch, self.max_batch_work = open_batch, max_batch, max_batch_work
        self.join_every, self._joined = join_every, -join_every  # the step of the last join
        self.steps = self.rows = 0  # decoder steps; the sentences of every call, summed
        self._batches: dict[Hashable, Running] = {}
        self._live: dict[Job, set[int]] = {}  # job -> its items in a running batch
        self._work_units = 0

    @property
    def mean_batch(self) -> float:
        """Sentences per model call (decoder step, or attention job) so far."""
        return self.rows / self.batches if self.batches else 0.0

    def _work(self) -> None:
        while not self._stopping:
            solo, joining = self._take()
            if solo is not None:
                self._run_one(solo)
            for key, items in joining.items():
                self._join(key, items)
            for key in list(self._batches):
                if self._stopping:
                    break
                self._step(key)
        self._fail(lambda job: True, Stopping("the server is shutting down"))
        self._fail_waiting()

    def _take(self) -> tuple[Job | None, dict[Hashable, list]]:
        """Drop the jobs that were cancelled; then newcomers: an attention job to run now, or the
        sentences that join ({key: [((job, i), item)]}). Waits while there is nothing to do."""
        with self._cond:
            while True:
                for job in [j for j in self.waiting if j.future.done()]:
                    self.waiting.remove(job)
                for job in [j for j in self._live if j.future.done()]:
                    self._leave(job, self._live[job])
                    self._batches[job.key].drop({(job, i) for i in self._live.pop(job)})
                if self._stopping or self.waiting or self._live:
                    break
                self._cond.wait(0.1)
            joining: dict[Hashable, list] = {}
            # newcomers join an empty batch at once, a running one every `join_every` steps:
            # encoding them together costs much less than one at a time (the encoder's weights are
            # read once a call)
            admit = not self._live or self.steps - self._joined >= self.join_every
            while self.waiting and not self._stopping:
                job = self.waiting[0]
                if job.key is None:
                    if joining:
                        break
                    self.waiting.popleft()
                    return job, {}
                if not admit:
                    break
                cost, live = job.costs[job.next], sum(map(len, self._live.values()))
                if live >= self.max_batch or (live
                                              and self._work_units + cost > self.max_batch_work):
                    break  # it waits at the head until rows are free
                self.waiting.popleft()
                i, job.next = job.next, job.next + 1
                if job.next < len(job.items):
                    self.waiting.append(job)  # one sentence of each job in turn
                joining.setdefault(job.key, []).append(((job, i), job.items[i]))
                self._live.setdefault(job, set()).add(i)
                self._work_units += cost
                self.items += 1
            if joining:
                self._joined = self.steps
            return None, joining

    def _leave(self, job: Job, items: set[int]) -> None:
        self._work_units -= sum(job.costs[i] for i in items)

    def _run_one(self, job: Job) -> None:
        self.batches += 1
        self.rows += 1
        try:
            job.settle(self.run_one(job.items[0]))
        except Exception as e:  # noqa: BLE001 - the worker must outlive any request
            log.exception("model call failed")
            job.settle(error=e)

    def _step(self, key: Hashable) -> None:
        batch = self._batches[key]
        if not len(batch):
            del self._batches[key]
            return
        self.batches += 1
        self.steps += 1
        self.rows += len(batch)
        try:
            events = batch.step()
        except Exception as e:  # noqa: BLE001 - the worker must outlive any request: fail this batch's jobs
            log.exception("decoder step failed")
            del self._batches[key]
            self._fail(lambda job: job.key == key, e)
            return
        for event in events:
            job, i = event.tag
            if job.watch is not None:
                job.tell(i, event.kind, event.value)
            if event.kind != "done":
                continue
            job.results[i] = event.value
            with self._cond:
                live = self._live.get(job)
                if live is not None:
                    live.discard(i)
                    self._leave(job, {i})
                    if not live:
                        del self._live[job]
            if len(job.results) == len(job.items):
                job.settle([job.results[k] for k in range(len(job.items))])

    def _join(self, key: Hashable, items: list) -> None:
        try:
            self._batches.setdefault(key, self.open_batch(key)).add(items)
        except Exception as e:  # noqa: BLE001 - fail the jobs that were joining (their encoder failed)
            log.exception("encoding failed")
            jobs = {job for (job, _), _ in items}
            self._batches.pop(key, None)
            self._fail(lambda job: job in jobs or job.key == key, e)

    def _fail(self, which: Callable[[Job], bool], error: BaseException) -> None:
        """Fail the running jobs `which` picks (and take them out of the queue)."""
        with self._cond:
            for job in [j for j in self._live if which(j)]:
                self._leave(job, self._live.pop(job))
                job.settle(error=error)
                if job in self.waiting:
                    self.waiting.remove(job)
