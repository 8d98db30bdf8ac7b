"""Parallel data: local files, JSONL or Hugging Face datasets -> (src, tgt) pairs -> `Batch`es.

Every source is read in chunks (`iter_pairs`): a small split into memory (`load_pairs`), the training
split into an Arrow file (`write_pairs`) that the data cache (datacache.py) tokenizes. Training
batches are built by token count from length-sorted buckets, so padding stays small (`token_batches`).
The tokenized `Corpus` and `load_corpus` live in corpus.py.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from attn_mt.config import DataConfig
from attn_mt.config.yamlconf import first_line

log = logging.getLogger(__name__)


class DataError(ValueError):
    """Unusable data; the message names the file, line or split."""


CHUNK = 100_000  # lines (or rows) read, checked and converted at a time: memory stays flat for any corpus size


def _open(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None


def line_chunks(path: Path, size: int = CHUNK) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file, stripped, `size` at a time; DataError names the file and line of bad bytes."""
    with _open(path) as f:
        done = 0
        while chunk := list(itertools.islice(f, size)):  # binary lines end at b"\n" only, like str.split("\n")
            raw = b"".join(chunk)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                line = done + raw.count(b"\n", 0, e.start) + 1
                raise DataError(f"{path}:{line}: invalid UTF-8 (byte {raw[e.start]:#04x})") from None
            lines = text.split("\n")
            if raw.endswith(b"\n"):
                lines.pop()
            done += len(chunk)
            yield [line.strip() for line in lines]


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, stripped; DataError names the file and line of bad bytes."""
    return [line for chunk in line_chunks(path) for line in chunk]


Chunks = Iterator[tuple[list[str], list[str]]]  # (src texts, tgt texts), a few thousand pairs at a time


def _from_files(cfg: DataConfig, split: str) -> Chunks:
    src_path = Path(cfg.dir) / f"{split}.{cfg.src_lang}"
    tgt_path = Path(cfg.dir) / f"{split}.{cfg.tgt_lang}"
    src_chunks, tgt_chunks = line_chunks(src_path), line_chunks(tgt_path)
    n_src = n_tgt = 0
    for src, tgt in itertools.zip_longest(src_chunks, tgt_chunks, fillvalue=[]):
        n_src, n_tgt = n_src + len(src), n_tgt + len(tgt)
        if len(src) != len(tgt):
            n_src, n_tgt = n_src + sum(map(len, src_chunks)), n_tgt + sum(map(len, tgt_chunks))
            raise DataError(f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}")
        yield src, tgt


def _from_jsonl(cfg: DataConfig, split: str) -> Chunks:
    path = Path(cfg.dir) / f"{split}.jsonl"
    i = 0
    for lines in line_chunks(path):
        src, tgt = [], []
        for line in lines:
            i += 1
            if not line:
                continue
            try:
                pair = json.loads(line)["translation"]
                s, t = pair[cfg.src_lang], pair[cfg.tgt_lang]
            except RecursionError:
                raise DataError(f"{path}:{i}: JSON nested too deeply") from None
            except (ValueError, KeyError, TypeError, IndexError) as e:  # ValueError: bad JSON, huge numbers
                raise DataError(
                    f"{path}:{i}: expected {{\"translation\": {{\"{cfg.src_lang}\": ..., "
                    f"\"{cfg.tgt_lang}\": ...}}}} ({e.__class__.__name__}: {str(e)[:200]})"
                ) from None
            if not isinstance(s, str) or not isinstance(t, str):
                raise DataError(f"{path}:{i}: translations must be strings")
            src.append(s.strip())
            tgt.append(t.strip())
        yield src, tgt


def load_hf(cfg: DataConfig, split: str):
    """The split as a (memory-mapped) `datasets.Dataset`, as stored: local dir, else the hub."""
    import datasets

    where = cfg.dir or cfg.name
    try:
        if cfg.dir and (Path(cfg.dir) / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(cfg.dir)[split]
        elif cfg.dir and (Path(cfg.dir) / "dataset_info.json").exists():
            ds = datasets.load_from_disk(cfg.dir)
        else:
            ds = datasets.load_dataset(where, cfg.hf_config or None, split=split)
    except KeyError:
        raise DataError(f"{where}: no split {split!r}") from None
    except Exception as e:  # datasets raises many types for offline / missing hub data
        first = first_line(e)
        raise DataError(f"{where}: cannot load Hugging Face dataset split {split!r}: {first}") from None
    if "translation" not in ds.column_names and not {cfg.src_lang, cfg.tgt_lang} <= set(ds.column_names):
        raise DataError(
            f"{where}: split {split!r} has columns {ds.column_names}; expected 'translation' "
            f"or '{cfg.src_lang}' and '{cfg.tgt_lang}'"
        )
    return ds


def _from_hf(cfg: DataConfig, split: str) -> Chunks:
    ds, where, first = load_hf(cfg, split), cfg.dir or cfg.name, 0
    for batch in ds.iter(batch_size=CHUNK):
        if "translation" in batch:
            rows = batch["translation"]
        else:
            rows = [{cfg.src_lang: s, cfg.tgt_lang: t}
                    for s, t in zip(batch[cfg.src_lang], batch[cfg.tgt_lang], strict=True)]
        src, tgt = [], []
        for i, row in enumerate(rows, first):
            for lang, out in ((cfg.src_lang, src), (cfg.tgt_lang, tgt)):
                value = row.get(lang) if isinstance(row, dict) else None
                if not isinstance(value, str):
                    what = "missing" if not isinstance(row, dict) or lang not in row else f"{type(value).__name__}"
                    raise DataError(f"{where}: split {split!r} row {i}: {lang!r} is {what}, expected a string")
                out.append(value.strip())
        first += len(rows)
        yield src, tgt


def _from_toy(cfg: DataConfig, split: str) -> Chunks:
    from attn_mt.data.toy import make_toy_corpus

    corpus = make_toy_corpus(cfg.toy_size, cfg.toy_seed)
    if split not in corpus:
        raise DataError(f"data.splits: the toy corpus has splits train, valid, test, not {split!r}")
    pairs = corpus[split]
    yield [s for s, _ in pairs], [t for _, t in pairs]


_READERS = {"files": _from_files, "jsonl": _from_jsonl, "hf": _from_hf, "toy": _from_toy}


def iter_pairs(cfg: DataConfig, split: str) -> Chunks:
    """The named split in chunks of (src, tgt) texts, empty pairs dropped; DataError if none is left."""
    kept = dropped = 0
    for src, tgt in _READERS[cfg.source](cfg, split):
        keep = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s and t]
        if len(keep) < len(src):
            dropped += len(src) - len(keep)
            src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
        kept += len(src)
        if src:
            yield src, tgt
    if not kept:
        raise DataError(f"split {split!r} ({cfg.source} {cfg.dir or cfg.name}) has no non-empty pairs")
    if dropped:
        log.info("split %s: dropped %d empty pairs", split, dropped)


def load_pairs(cfg: DataConfig, split: str):
    """The named split in memory as a `datasets.Dataset` with columns `src` and `tgt`, empty pairs dropped."""
    import datasets

    src, tgt = [], []
    for s, t in iter_pairs(cfg, split):
        src += s
        tgt += t
    return datasets.Dataset.from_dict({"src": src, "tgt": tgt})


def write_pairs(cfg: DataConfig, split: str, path: Path) -> int:
    """Stream the split into an Arrow file with columns `src` and `tgt` (for `datasets.Dataset.from_file`,
    which maps it); returns the number of pairs."""
    import pyarrow as pa

    schema = pa.schema([("src", pa.string()), ("tgt", pa.string())])
    n = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer, \
            tqdm(desc=f"reading {split}", unit=" pairs", disable=None, leave=False) as bar:
        for src, tgt in iter_pairs(cfg, split):
            writer.write_batch(pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema))
            n += len(src)
            bar.update(len(src))
    return n


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
                  seed: int, epoch: int, shuffle: bool = True) -> Batches:
    """Index batches of at most `batch_tokens` padded tokens (longest side x sentences).

    Sentences are sorted by length (ties broken randomly), cut into batches, and the batch
    order is shuffled; the result depends only on (seed, epoch), so a resumed run can skip
    to the batch it stopped at.
    """
    rng = np.random.default_rng([seed, epoch])
    n = len(src_lens)
    order = rng.permutation(n) if shuffle else np.arange(n)
    lens = np.maximum(np.asarray(src_lens), np.asarray(tgt_lens)) + 1  # (N,) + bos/eos
    key = lens[order].astype(np.uint16) if n and lens.max() < 2**16 else lens[order]  # radix sort, same order
    order = order[np.argsort(key, kind="stable")].astype(np.int32 if n < 2**31 else np.int64)  # kept all epoch
    # In length order, a batch starting at position s takes position k while (k - s + 1) * lens[k] <= batch_tokens,
    # i.e. while first_start[k] <= s below; first_start rises with k, so each batch end is one binary search.
    first_start = np.arange(n) - batch_tokens // lens[order] + 1  # (N,)
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
