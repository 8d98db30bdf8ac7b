"""Batches: padded token ids for a step (`Batch`; `collate` from lists, `collate_ragged` from flat id arrays in
a few array operations), the plan of an epoch, by token count from length-sorted buckets so padding stays
small (`token_batches`), and static shapes for a compiled step (`to_bucket`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class Batch:
    """Padded token ids; the decoder reads `tgt_in` (bos + y) and predicts `tgt_out` (y + eos)."""

    src: Tensor  # (B, S)
    tgt_in: Tensor  # (B, T)
    tgt_out: Tensor  # (B, T)
    n_tokens: int  # non-pad target tokens

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(self.src.to(device, non_blocking=nb), self.tgt_in.to(device, non_blocking=nb),
                     self.tgt_out.to(device, non_blocking=nb), self.n_tokens)


def pad(seqs: list[list[int]], pad_id: int) -> Tensor:
    """(B, L) int64 tensor, right-padded."""
    out = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(src: list[list[int]], tgt: list[list[int]], pad_id: int, bos_id: int, eos_id: int) -> Batch:
    """Source ids get eos appended; targets are shifted into decoder input and output."""
    src_t = pad([s + [eos_id] for s in src], pad_id)
    tgt_in = pad([[bos_id] + t for t in tgt], pad_id)
    tgt_out = pad([t + [eos_id] for t in tgt], pad_id)
    return Batch(src_t, tgt_in, tgt_out, sum(len(t) + 1 for t in tgt))


def gather(ids: np.ndarray, starts: np.ndarray, lens: np.ndarray, out: np.ndarray, shift: int = 0) -> None:
    """Copy sequence i (`ids[starts[i]:starts[i] + lens[i]]`) into `out[i, shift:shift + lens[i]]`, all rows
    in one fancy-indexed read and one scatter, no Python loop over sentences."""
    total = int(lens.sum())
    row = np.repeat(np.arange(len(lens)), lens)  # (total,) the row each token goes to
    first = np.cumsum(lens) - lens  # (B,) where each row's tokens begin in the flat order
    col = np.arange(total) - np.repeat(first, lens)  # (total,) its place in the row
    out[row, col + shift] = ids[np.repeat(starts, lens) + col]


def collate_ragged(src: tuple[np.ndarray, np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray, np.ndarray],
                   pad_id: int, bos_id: int, eos_id: int, pin: bool = False) -> Batch:
    """`collate` for sequences given as (ids, starts, lengths) of a flat id array: equal to `collate` on the
    same lists, element for element, built with a few array operations into one buffer (pinned with `pin`,
    for asynchronous copies to a GPU)."""
    (s_ids, s_start, s_len), (t_ids, t_start, t_len) = src, tgt
    b = len(s_len)
    s_len, t_len = s_len.astype(np.int64), t_len.astype(np.int64)
    width_s, width_t = int(s_len.max()) + 1, int(t_len.max()) + 1
    buf = torch.full((b * (width_s + 2 * width_t),), pad_id, dtype=torch.long, pin_memory=pin)
    flat = buf.numpy()
    src_a = flat[: b * width_s].reshape(b, width_s)  # (B, S)
    tin_a = flat[b * width_s : b * (width_s + width_t)].reshape(b, width_t)  # (B, T)
    tout_a = flat[b * (width_s + width_t) :].reshape(b, width_t)  # (B, T)
    rows = np.arange(b)
    gather(s_ids, s_start, s_len, src_a)
    src_a[rows, s_len] = eos_id
    gather(t_ids, t_start, t_len, tout_a)
    tin_a[:, 1:] = tout_a[:, :-1]  # the last column of tout_a is still padding here
    tin_a[:, 0] = bos_id
    tout_a[rows, t_len] = eos_id
    parts = buf.split([b * width_s, b * width_t, b * width_t])
    return Batch(parts[0].view(b, width_s), parts[1].view(b, width_t), parts[2].view(b, width_t),
                 int(t_len.sum()) + b)


class Batches(Sequence[list[int]]):
    """Index batches held as one array: batch k is `order[starts[k]:ends[k]]`, read as a list of ints.

    A whole epoch's plan costs 4 bytes per sentence, not a Python int (about 36 bytes) per index.
    """

    def __init__(self, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.order, self.starts, self.ends = order, starts, ends  # (N,) pair indices; (n_batches,) bounds

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        return self.order[self.starts[k] : self.ends[k]].tolist()

    def __eq__(self, other) -> bool:
        return list(self) == list(other)


def token_batches(src_lens: Sequence[int], tgt_lens: Sequence[int], batch_tokens: int,
                  seed: int, epoch: int, shuffle: bool = True, buckets: Sequence[int] = ()) -> Batches:
    """Index batches of at most `batch_tokens` padded tokens (longest side x sentences).

    Sentences are sorted by length (ties broken randomly), cut into batches, and the batch
    order is shuffled; the result depends only on (seed, epoch), so a resumed run can skip
    to the batch it stopped at. With `buckets` (train.length_buckets) a batch is counted at the
    width `to_bucket` pads it to, so the padded batch too stays within `batch_tokens`.
    """
    rng = np.random.default_rng([seed, epoch])
    n = len(src_lens)
    order = rng.permutation(n) if shuffle else np.arange(n)
    lens = np.maximum(np.asarray(src_lens), np.asarray(tgt_lens)) + 1  # (N,) + bos/eos
    key = lens[order].astype(np.uint16) if n and lens.max() < 2**16 else lens[order]  # radix sort, same order
    order = order[np.argsort(key, kind="stable")].astype(np.int32 if n < 2**31 else np.int64)  # kept all epoch
    # In length order, a batch starting at position s takes position k while (k - s + 1) * lens[k] <= batch_tokens,
    # i.e. while first_start[k] <= s below; first_start rises with k, so each batch end is one binary search.
    width = lens[order]  # (N,) in length order; with buckets, the first bucket that holds each pair
    if len(buckets):
        edges = np.asarray(buckets)
        at = np.searchsorted(edges, width)  # rises with width, so the widths still rise
        width = np.where(at < len(edges), edges[np.minimum(at, len(edges) - 1)], width)
    first_start = np.arange(n) - batch_tokens // width + 1  # (N,)
    starts, s = [], 0
    while s < n:
        starts.append(s)
        s = max(s + 1, int(np.searchsorted(first_start, s, side="right")))  # a too-long pair goes alone
    starts = np.array(starts, dtype=np.int64)
    ends = np.append(starts[1:], n)
    if shuffle:
        perm = rng.permutation(len(starts))
        starts, ends = starts[perm], ends[perm]
    return Batches(order, starts, ends)


def bucket_rows(rows: int) -> int:
    """The next of 1, 2, 3, 4, 6, 8, 12, 16, ... (2^k and 1.5 * 2^k) at or above `rows`: fewer than 1.5x."""
    k = 1 << max(rows - 1, 0).bit_length()  # the next power of two
    return 3 * k // 4 if 3 * k // 4 >= rows and k >= 4 else k


def to_bucket(batch: Batch, buckets: tuple[int, ...], pad_id: int, bos_id: int, eos_id: int, pin: bool = False,
              batch_tokens: int = 0, ranks: int = 1) -> Batch:
    """`batch` padded to a static shape (rows, L): L the first of `buckets` (increasing widths) that holds both
    sides (a batch wider than all is left as it is). Rows: as many as `batch_tokens` hold at that width
    (batch_tokens // L, shared by `ranks`), so each bucket has one shape and the padded batch stays within
    batch_tokens (ranks - 1 rows aside); the plan (`token_batches` with the same buckets) cuts batches that fit.
    A batch with more rows than that (a plan cut without the buckets) is left as it is: padded, it would
    exceed batch_tokens. No batch_tokens: `bucket_rows`. The added rows are a one-token source (eos) and a
    one-token decoder input (bos) with nothing to predict (tgt_out all padding): the loss and its gradient are
    those of the batch itself (up to rounding; dropout draws differ), and no attention row is fully masked. So
    a compiled or graphed step is captured once per bucket."""
    (b, s), t = batch.src.shape, batch.tgt_in.size(1)
    width = next((w for w in buckets if w >= max(s, t)), None)
    if width is None:  # wider than every bucket: the batch as it is
        return batch
    rows = -(-(batch_tokens // width) // ranks) if batch_tokens else bucket_rows(b)
    if rows < b:  # padded to this width, it would hold more than batch_tokens
        return batch
    if (rows, width) == (b, s) == (b, t):
        return batch
    out = torch.full((3, rows, width), pad_id, dtype=torch.long, pin_memory=pin)
    out[0, :b, :s], out[1, :b, :t], out[2, :b, :t] = batch.src, batch.tgt_in, batch.tgt_out
    out[0, b:, 0], out[1, b:, 0] = eos_id, bos_id
    return Batch(out[0], out[1], out[2], batch.n_tokens)
