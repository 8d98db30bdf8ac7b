"""Batches: sentence pairs as padded token ids for a training step (`Batch`, `collate`), and the
plan of an epoch (`token_batches`): pairs grouped by length so that padding stays small and a
batch holds about `batch_tokens` tokens. data/arrays.py builds the same batches from flat arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attn_mt.data.plan import Batches, bucket_widths


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


def collate(src: list[list[int]], tgt: list[list[int]], pad_id: int, bos_id: int,
            eos_id: int) -> Batch:
    """Sources get eos appended; each target y is shifted by one for teacher forcing: the decoder
    reads bos + y (`tgt_in`) and predicts y + eos (`tgt_out`), one token ahead."""
    src_t = pad([s + [eos_id] for s in src], pad_id)
    tgt_in = pad([[bos_id] + t for t in tgt], pad_id)
    tgt_out = pad([t + [eos_id] for t in tgt], pad_id)
    return Batch(src_t, tgt_in, tgt_out, sum(len(t) + 1 for t in tgt))


def token_batches(src_lens: Sequence[int], tgt_lens: Sequence[int], batch_tokens: int, seed: int,
                  epoch: int, shuffle: bool = True, buckets: Sequence[int] = ()) -> Batches:
    """Index batches of at most `batch_tokens` padded tokens (longest side x sentences).

    Sentences are sorted by length (ties broken randomly), cut into batches, and the batch
    order is shuffled; the result depends only on (seed, epoch), so a resumed run can skip
    to the batch it stopped at. With `buckets` (train.length_buckets) a batch is counted at the
    width its bucket pads it to, so the padded batch too stays within `batch_tokens`.
    """
    rng = np.random.default_rng([seed, epoch])
    n = len(src_lens)
    order = rng.permutation(n) if shuffle else np.arange(n)
    lens = np.maximum(np.asarray(src_lens), np.asarray(tgt_lens)) + 1  # (N,) + bos/eos
    key = lens[order].astype(np.uint16) if n and lens.max() < 2**16 else lens[order]  # radix sort
    order = order[np.argsort(key, kind="stable")].astype(np.int32 if n < 2**31 else np.int64)
    # In length order, a batch starting at s takes position k while (k - s + 1) * width[k] <=
    # batch_tokens, i.e. while first_start[k] <= s; first_start rises with k, so each batch's end
    # is one binary search.
    width = bucket_widths(lens[order], buckets)  # (N,) in length order
    first_start = np.arange(n) - batch_tokens // width + 1  # (N,)
    starts, s = [], 0
    while s < n:
        starts.append(s)
        s = max(s + 1, int(np.searchsorted(first_start, s, side="right")))  # a too-long pair: alone
    starts = np.array(starts, dtype=np.int64)
    ends = np.append(starts[1:], n)
    if shuffle:
        perm = rng.permutation(len(starts))
        starts, ends = starts[perm], ends[perm]
    return Batches(order, starts, ends)
