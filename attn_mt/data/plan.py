"""An epoch's plan held compactly (`Batches`), and the widths static buckets pad a batch to
(`bucket_widths`): what batching.token_batches returns and counts with.

Tested in tests/data/test_batching.py and tests/training/test_compiled.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Batches(Sequence[list[int]]):
    """Index batches held as one array: batch k is `order[starts[k]:ends[k]]`, read as a list of
    ints.

    A whole epoch's plan costs 4 bytes per sentence, not a Python int (about 36 bytes) per index.
    """

    def __init__(self, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.order, self.starts, self.ends = order, starts, ends  # (N,) pairs; (n_batches,) bounds

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        return self.order[self.starts[k] : self.ends[k]].tolist()

    def __eq__(self, other) -> bool:
        return list(self) == list(other)


def bucket_widths(widths: np.ndarray, buckets: Sequence[int]) -> np.ndarray:
    """Each width as `to_bucket` pads it: the first of `buckets` that holds it (wider ones as they
    are). Rising widths stay rising."""
    if not len(buckets):
        return widths
    edges = np.asarray(buckets)
    at = np.searchsorted(edges, widths)
    return np.where(at < len(edges), edges[np.minimum(at, len(edges) - 1)], widths)
