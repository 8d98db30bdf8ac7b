"""Batches built for speed: `collate` from flat id arrays in a few numpy operations
(`collate_ragged`), and padded to static shapes for a compiled step (`to_bucket`).

Tested in tests/data/test_batching.py (equal to `collate`) and tests/training/test_compiled.py
(the buckets).
"""

from __future__ import annotations

import numpy as np
import torch

from attn_mt.data.batching import Batch


def gather(ids: np.ndarray, starts: np.ndarray, lens: np.ndarray, out: np.ndarray,
           shift: int = 0) -> None:
    """Copy sequence i (`ids[starts[i]:starts[i] + lens[i]]`) into `out[i, shift:shift + lens[i]]`,
    all rows in one fancy-indexed read and one scatter, no Python loop over sentences."""
    total = int(lens.sum())
    row = np.repeat(np.arange(len(lens)), lens)  # (total,) the row each token goes to
    first = np.cumsum(lens) - lens  # (B,) where each row's tokens begin in the flat order
    col = np.arange(total) - np.repeat(first, lens)  # (total,) its place in the row
    out[row, col + shift] = ids[np.repeat(starts, lens) + col]


def collate_ragged(src: tuple[np.ndarray, np.ndarray, np.ndarray],
                   tgt: tuple[np.ndarray, np.ndarray, np.ndarray],
                   pad_id: int, bos_id: int, eos_id: int, pin: bool = False) -> Batch:
    """`collate` for sequences given as (ids, starts, lengths) of a flat id array: equal to
    `collate` on the same lists, element for element, built with a few array operations into one
    buffer (pinned with `pin`, for asynchronous copies to a GPU)."""
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


def bucket_rows(rows: int) -> int:
    """The next of 1, 2, 3, 4, 6, 8, 12, 16, ... (2^k and 1.5 * 2^k) at or above `rows`: fewer than
    1.5x."""
    k = 1 << max(rows - 1, 0).bit_length()  # the next power of two
    return 3 * k // 4 if 3 * k // 4 >= rows and k >= 4 else k


def to_bucket(batch: Batch, buckets: tuple[int, ...], pad_id: int, bos_id: int, eos_id: int,
              pin: bool = False, batch_tokens: int = 0, ranks: int = 1) -> Batch:
    """`batch` padded to a static shape (rows, L), so that a compiled or graphed step is captured
    once per bucket.

    L is the first of `buckets` (increasing widths) that holds both sides (a batch wider than all
    is left as it is). Rows: as many as `batch_tokens` hold at that width (batch_tokens // L,
    shared by `ranks`), so each bucket has one shape and the padded batch stays within batch_tokens
    (ranks - 1 rows aside); the plan (`token_batches` with the same buckets) cuts batches that fit.
    A batch with more rows than that (a plan cut without the buckets) is left as it is. No
    batch_tokens: `bucket_rows`. The added rows are a one-token source (eos) and a one-token
    decoder input (bos) with nothing to predict (tgt_out all padding): the loss and its gradient
    are those of the batch itself (up to rounding; dropout draws differ), and no attention row is
    fully masked.
    """
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
