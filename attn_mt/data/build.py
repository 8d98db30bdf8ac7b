"""Filling a new data cache entry: source files -> text.arrow -> tokenizer -> token ids as flat
files.

The training split is streamed into an Arrow file, SentencePiece trains on a bounded sample of it
(or a resumed run's tokenizer is kept), batched `datasets.map` tokenizes it (a big split on all
cores: workers.py), and the ids are written as flat arrays. cache.py decides when and where (under
its lock, in a temporary directory).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attn_mt.config import ExperimentConfig, TokenizerConfig
from attn_mt.data.sources import write_pairs
from attn_mt.data.tokenizer import Tokenizer, train_tokenizer
from attn_mt.files import write_atomic

log = logging.getLogger(__name__)

BIG = 100_000  # pairs from which progress bars show and tokenizing runs in several processes
SIDES, KINDS = ("src", "tgt"), ("ids", "offsets", "lengths")


def build(cfg: ExperimentConfig, tmp: Path, key: str,
          tok: Tokenizer | None = None) -> tuple[dict, Tokenizer]:
    """Write the tokenizer and the flat files of the training split into `tmp`; returns what they
    hold (pairs, tokens per side, dtype of the ids, tokenizer file names) and the tokenizer (`tok`
    if given)."""
    import datasets

    t0 = time.perf_counter()
    n = write_pairs(cfg.data, cfg.data.splits.train, tmp / "text.arrow")
    text = datasets.Dataset.from_file(str(tmp / "text.arrow"))
    t1 = time.perf_counter()
    log.info("read %d training pairs in %.1f s", n, t1 - t0)
    if tok is None:
        tok = train_tokenizer(cfg.tokenizer, *_sample(text, cfg.tokenizer))
        log.info("tokenizer ready in %.1f s", time.perf_counter() - t1)
    else:
        log.info("tokenizer: the one the run was given (a resumed run's, or the model it "
                 "fine-tunes)")
    for name, proto in tok.files().items():
        write_atomic(tmp / name, proto)
    t2 = time.perf_counter()
    dtype = np.uint16 if max(tok.src_vocab_size, tok.tgt_vocab_size) <= 2**16 else np.int32
    procs = (cfg.data.num_proc or len(os.sched_getaffinity(0))) if n >= BIG else 1
    encode = _Encode(tok.state(), dtype)
    mapping = {"batched": True, "batch_size": 2000, "remove_columns": ["src", "tgt"],
               "cache_file_name": str(tmp / "encoded.arrow"), "new_fingerprint": key,
               "desc": "tokenizing"}
    with _progress(n >= BIG and log.isEnabledFor(logging.INFO)):
        if procs > 1:  # a big split: worker processes that die with this one
            from attn_mt.data.workers import map_in_processes

            encoded = map_in_processes(text.with_format("arrow"), encode, procs, **mapping)
        else:
            encoded = text.with_format("arrow").map(encode, **mapping)
    tokens = _write_flat(encoded, tmp, dtype)
    log.info("tokenized %d sentences in %.1f s (%d processes)", 2 * n, time.perf_counter() - t2,
             procs)
    del text, encoded
    for f in tmp.glob("*.arrow"):
        f.unlink()
    return {"pairs": n, "tokens": tokens, "dtype": np.dtype(dtype).name,
            "tokenizer": list(tok.files())}, tok


def _sample(text, cfg: TokenizerConfig):
    """(src, tgt) sentence streams for SentencePiece: every pair, or a fixed random
    `sample_sentences` of them.

    Read from the memory-mapped Arrow file a batch at a time, so the corpus is never in memory
    twice.
    """
    from tqdm import tqdm

    k = cfg.sample_sentences // 2 if cfg.joint else cfg.sample_sentences  # pairs per model
    if len(text) > k:
        text = text.select(np.sort(np.random.default_rng(0).choice(len(text), k, replace=False)))
    total = len(text) * 2
    bar = tqdm(total=total, desc="tokenizer: reading sample", unit=" sentences", disable=None
               if total >= BIG else True, leave=False)
    log.info("training the tokenizer on %d sentences", total)

    def column(name: str) -> Iterator[str]:
        for batch in text.with_format("arrow").iter(batch_size=10_000):
            bar.update(len(batch))
            yield from batch[name].to_pylist()
        if name == "tgt":
            bar.close()

    return column("src"), column("tgt")


class _Encode:
    """The batched `map` function: an Arrow batch of texts -> Arrow list arrays of token ids.
    Picklable for the worker processes (workers.py), which each rebuild the SentencePiece models
    once."""

    def __init__(self, state: dict, dtype: type) -> None:
        self.state, self.dtype, self.tok = state, dtype, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "tok": None}

    def __call__(self, batch):
        import pyarrow as pa

        self.tok = self.tok or Tokenizer.from_state(self.state)
        # the processes share the cores
        src = self.tok.src.encode(batch["src"].to_pylist(), num_threads=1)
        tgt = self.tok.tgt.encode(batch["tgt"].to_pylist(), num_threads=1)
        return pa.table({"src_ids": self._lists(src), "tgt_ids": self._lists(tgt)})

    def _lists(self, seqs: list[list[int]]):
        import pyarrow as pa

        offsets = np.zeros(len(seqs) + 1, dtype=np.int32)  # (n + 1,)
        np.cumsum(np.fromiter(map(len, seqs), np.int32, len(seqs)), out=offsets[1:])
        values = np.fromiter(itertools.chain.from_iterable(seqs), self.dtype, int(offsets[-1]))
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _write_flat(encoded, tmp: Path, dtype: type) -> dict[str, int]:
    """The encoded Arrow table as the flat ids/offsets/lengths files, a record batch at a time;
    tokens per side."""
    import pyarrow.compute as pc

    out = {f"{s}.{k}": (tmp / f"{s}.{k}").open("wb") for s in SIDES for k in KINDS}
    total = dict.fromkeys(SIDES, 0)
    for side in SIDES:
        np.zeros(1, np.int64).tofile(out[f"{side}.offsets"])
    for batch in encoded.data.to_batches():
        for side in SIDES:
            col = batch.column(f"{side}_ids")
            lengths = pc.list_value_length(col).to_numpy().astype(np.int32)  # (b,)
            col.flatten().to_numpy().astype(dtype, copy=False).tofile(out[f"{side}.ids"])
            (total[side] + np.cumsum(lengths, dtype=np.int64)).tofile(out[f"{side}.offsets"])
            lengths.tofile(out[f"{side}.lengths"])
            total[side] += int(lengths.sum())
    for f in out.values():
        f.flush()
        os.fsync(f.fileno())
        f.close()
    return total


@contextlib.contextmanager
def _progress(show: bool):
    """datasets' own progress bars on or off for the block; their previous state after it."""
    import datasets

    was_off = datasets.utils.logging.is_progress_bar_enabled() is False
    (datasets.enable_progress_bars if show else datasets.disable_progress_bars)()
    try:
        yield
    finally:
        (datasets.disable_progress_bars if was_off else datasets.enable_progress_bars)()
