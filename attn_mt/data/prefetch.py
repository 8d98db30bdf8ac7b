"""One batch group ahead: a background thread builds the next step's batches while the GPU runs this
one.

The trainer asks for the batches of a place in the epoch (a key); `Prefetcher.take(key, make)`
returns the group built ahead for that key, or builds it now when none was (the first step, a new
epoch, a resumed run), and `ahead(key, make)` starts building the next one. What a key yields does
not depend on when it is built (the plan and the subword draws are functions of the key), so the
batches are the same with or without the thread; on a GPU they are gathered into pinned memory,
which lets their copies to the device run asynchronously (`Batch.to` copies with `non_blocking` on
CUDA).

Tested in tests/training/test_trainer.py (the trainer with and without the thread, bit for bit).

One job: overlapping batch building with the step; building is batching.py's and corpus.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """At most one result built ahead, in one worker thread (on a CPU the trainer builds in place
    instead: training/variants.py's InPlace). As a context manager it stops the thread at the end
    of the block (the training loop's)."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            1, thread_name_prefix="attn-mt-batches")
        self.pending: tuple[Hashable, Future[T]] | None = None

    def take(self, key: Hashable, make: Callable[[], T]) -> T:
        """What `make()` gives, from the thread if it was built ahead for `key`."""
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] == key:
            return pending[1].result()
        if pending is not None:
            pending[1].cancel()
        return make()

    def ahead(self, key: Hashable, make: Callable[[], T]) -> None:
        """Start building `make()` for `key` in the thread (nothing without one)."""
        if self.pool is not None:
            self.pending = (key, self.pool.submit(make))

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread (a group built ahead and not taken is dropped); `take` then builds in
        place."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool, self.pending = None, None
