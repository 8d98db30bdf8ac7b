"""The tokenized corpus every consumer reads: the training split memory-mapped from the data cache
(cache.py), validation and test small and in memory, tokenized with the entry's tokenizer, and their
batches.

Memory does not grow with the training split: its token ids stay on disk (the page cache, shared by
every process that maps them), and what a process holds per pair is a few bytes of lengths and batch
plan (batching.token_batches). `attn-mt prepare` builds the entry ahead of a job (cache.prepare);
`cache.open_entry` finds or builds it, `read_corpus` reads a corpus from it, and `load_corpus` does
both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from attn_mt.config import ExperimentConfig
from attn_mt.data.arrays import collate_ragged
from attn_mt.data.batching import Batch
from attn_mt.data.cache import Entry, Resumed, open_entry
from attn_mt.data.lines import DataError
from attn_mt.data.sources import read_pairs
from attn_mt.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ragged:
    """Token id sequences end to end: sequence i is `ids[offsets[i]:offsets[i + 1]]`."""

    ids: np.ndarray  # (tokens,) uint16 or int32
    offsets: np.ndarray  # (n + 1,) int64
    lengths: np.ndarray  # (n,) int32

    @classmethod
    def from_lists(cls, seqs: list[list[int]]) -> Ragged:
        lengths = np.fromiter(map(len, seqs), np.int32, len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.fromiter((i for s in seqs for i in s), np.int32, int(offsets[-1])), offsets,
                   lengths)

    @classmethod
    def mapped(cls, entry: Entry, side: str) -> Ragged:
        return cls(*(entry.array(f"{side}.{kind}") for kind in ("ids", "offsets", "lengths")))

    def __len__(self) -> int:
        return len(self.lengths)

    def get(self, rows: Iterable[int]) -> list[list[int]]:
        return [self.ids[self.offsets[r] : self.offsets[r + 1]].tolist() for r in rows]

    def spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, starts, lengths) of these rows, for `arrays.collate_ragged`: no list per
        sequence."""
        return self.ids, self.offsets[rows], self.lengths[rows]


class Lengths(Sequence[int]):
    """Token counts of a split's pairs: `np.asarray` gives the array (no copy), indexing gives
    Python ints (which the trainer sums into counters that go into checkpoints and JSON)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array  # (n,)

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i):
        return Lengths(self.array[i]) if isinstance(i, slice) else int(self.array[i])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.array if dtype is None else self.array.astype(dtype)


@dataclass
class Corpus:
    """Tokenized splits: token ids of every split, texts of validation and test (not of
    training)."""

    tok: Tokenizer
    entry: Entry  # the data cache entry of the training split, and of the tokenizer
    text: dict[str, tuple[list[str], list[str]]]  # valid/test split -> (src texts, tgt texts)
    # split -> (src ids, tgt ids); the training split memory-mapped
    ids: dict[str, tuple[Ragged, Ragged]]
    # split -> (n,) rows in use, where not all
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    limit: int = 2**31 - 1  # the most tokens a side of a training pair may have
    _lengths: dict = field(default_factory=dict, repr=False)

    def lengths(self, split: str) -> tuple[Lengths, Lengths]:
        """Token counts (src, tgt) of each pair of a split in use, without bos/eos."""
        if split not in self._lengths:
            rows, (src, tgt) = self.rows.get(split), self.ids[split]
            pick = (lambda a: a) if rows is None else (lambda a: a[rows])
            self._lengths[split] = (Lengths(pick(src.lengths)), Lengths(pick(tgt.lengths)))
        return self._lengths[split]

    def batches(self, split: str, index: Iterable[Sequence[int]], sampling: float = 0.0,
                seed: tuple[int, ...] = (), pin: bool = False) -> Iterator[Batch]:
        """Collated `Batch`es of the pairs in each index batch, gathered from the id arrays in one
        pass (`collate_ragged`; into pinned memory with `pin`); with `sampling` > 0 the sources
        split anew (sampling.py's `resample_src`, one list per sentence), the i-th batch's draw
        seeded by (*seed, i)."""
        rows, (src, tgt) = self.rows.get(split), self.ids[split]
        special = self.tok.pad_id, self.tok.bos_id, self.tok.eos_id
        for i, b in enumerate(index):
            b = (np.asarray(b, dtype=np.int64) if rows is None
                 else rows[np.asarray(b, dtype=np.int64)])
            sources = src.spans(b)
            if sampling:
                from attn_mt.data.sampling import resample_src  # loaded where a run asks for it

                draw = int(np.random.SeedSequence([*seed, i]).generate_state(1)[0])
                drawn = Ragged.from_lists(resample_src(self.tok, src.get(b), sampling, draw,
                                                       self.limit))
                sources = drawn.spans(np.arange(len(drawn)))
            yield collate_ragged(sources, tgt.spans(b), *special, pin=pin)


def load_corpus(cfg: ExperimentConfig, max_positions: int,
                resumed: Resumed | None = None) -> Corpus:
    """The whole path in one process: open the data cache entry (building it on first use, with a
    resumed run's tokenizer if it was trained on that entry), then read the corpus from it."""
    return read_corpus(cfg, open_entry(cfg, resumed), max_positions)


def read_corpus(cfg: ExperimentConfig, entry: Entry, max_positions: int) -> Corpus:
    """The corpus from a complete entry (a pure read): validation and test read and tokenized with
    the entry's tokenizer, the training split mapped, its pairs kept within the length limit."""
    splits = cfg.data.splits
    text = {name: read_pairs(cfg.data, name) for name in dict.fromkeys((splits.valid, splits.test))}
    tok = entry.tok
    ids = {name: (Ragged.from_lists(tok.encode_src(s)), Ragged.from_lists(tok.encode_tgt(t)))
           for name, (s, t) in text.items()}
    src, tgt = ids[splits.train] = (Ragged.mapped(entry, "src"), Ragged.mapped(entry, "tgt"))
    limit = min(cfg.data.max_len, max_positions - 1)
    corpus = Corpus(tok, entry, text, ids, limit=limit)
    if max(src.lengths.max(), tgt.lengths.max()) > limit:
        rows = np.flatnonzero((src.lengths <= limit) & (tgt.lengths <= limit))
        if not len(rows):
            raise DataError(f"split {splits.train!r}: no pair has at most {limit} tokens per side "
                            "(data.max_len / model.max_positions)")
        log.info("dropped %d of %d training pairs longer than %d tokens", len(src) - len(rows),
                 len(src), limit)
        corpus.rows[splits.train] = rows
    return corpus
