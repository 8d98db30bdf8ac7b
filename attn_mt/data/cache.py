"""The data cache: the training split tokenized once, kept on disk, memory-mapped by every run and rank.

An entry is a directory named after a fingerprint of the training data (the files' contents, or a
Hugging Face dataset's own fingerprint) and of the tokenizer settings:

    <cache_dir>/<key>/
        spm.model (joint) or spm.src.model, spm.tgt.model; tokenizer.json
        src.ids, tgt.ids          (tokens,) uint16 (int32 above 65536 pieces): all pairs' ids, end to end
        src.offsets, tgt.offsets  (pairs + 1,) int64: pair i is ids[offsets[i]:offsets[i + 1]]
        src.lengths, tgt.lengths  (pairs,) int32
        complete.json             written last: the size and CRC-32 of every file above

It is built in a temporary directory beside it (text -> Arrow -> SentencePiece on a bounded sample ->
batched `datasets.map` on all cores -> flat files, fsynced, renamed into place) under a file lock, so
concurrent runs and torchrun ranks build it once while the others wait. An entry whose complete.json
is missing or does not match its files is rebuilt, never read.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np

from attn_mt.config import DataConfig, ExperimentConfig, TokenizerConfig
from attn_mt.data.sources import DataError, _open, load_hf, write_pairs
from attn_mt.data.tokenizer import Tokenizer, train_or_load

log = logging.getLogger(__name__)

VERSION = 1  # of the entry layout; part of the key
MARKER = "complete.json"
BIG = 100_000  # pairs from which progress bars show and tokenizing runs in several processes
SIDES, KINDS = ("src", "tgt"), ("ids", "offsets", "lengths")


def cache_root(cfg: DataConfig) -> Path:
    """data.cache_dir, else $ATTN_MT_CACHE, else $XDG_CACHE_HOME/attn_mt (~/.cache/attn_mt)."""
    if cfg.cache_dir or os.environ.get("ATTN_MT_CACHE"):
        return Path(cfg.cache_dir or os.environ["ATTN_MT_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attn_mt"


def _not_writable(root: Path) -> str | None:
    """Why files cannot be created in `root` (created if missing), or None."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with _open(path) as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def fingerprint(cfg: ExperimentConfig) -> str:
    """Key of the training split's entry: data identity (contents, not names or dates) and tokenizer settings."""
    d = cfg.data
    parts = {"version": VERSION, "source": d.source, "split": d.splits.train, "langs": [d.src_lang, d.tgt_lang],
             "tokenizer": asdict(cfg.tokenizer)}
    if d.source == "files":
        parts["data"] = [_sha256(Path(d.dir) / f"{d.splits.train}.{lang}") for lang in (d.src_lang, d.tgt_lang)]
    elif d.source == "jsonl":
        parts["data"] = _sha256(Path(d.dir) / f"{d.splits.train}.jsonl")
    elif d.source == "hf":
        parts["data"] = load_hf(d, d.splits.train)._fingerprint
    else:  # the toy generator: its settings and its code
        parts["data"] = [d.toy_size, d.toy_seed, _sha256(Path(__file__).with_name("toy.py"))]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _crc32(path: Path) -> int:
    crc, buf = 0, bytearray(1 << 23)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(memoryview(buf)[:n], crc)
    return crc


class Entry:
    """A complete cache entry: its tokenizer, and the token ids of the training pairs, memory-mapped."""

    def __init__(self, path: Path, marker: dict) -> None:
        self.path, self.marker = path, marker
        self.pairs, self.tokens = marker["pairs"], marker["tokens"]

    @classmethod
    def open(cls, path: Path) -> Entry | None:
        """The entry at `path` if complete.json exists and every file has its recorded size and CRC-32."""
        try:
            marker = json.loads((path / MARKER).read_text())
            for name, want in marker["files"].items():
                f = path / name
                if f.stat().st_size != want["bytes"] or _crc32(f) != want["crc32"]:
                    log.warning("data cache %s: %s is damaged; rebuilding", path, name)
                    return None
            return cls(path, marker)
        except FileNotFoundError:
            if path.exists():
                log.warning("data cache %s is incomplete; rebuilding", path)
            return None
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("data cache %s: unreadable %s; rebuilding", path, MARKER)
            return None

    def tokenizer(self) -> Tokenizer:
        protos = [(self.path / n).read_bytes() for n in self.marker["tokenizer"]]
        return Tokenizer(protos[0], protos[1] if len(protos) > 1 else None)

    def array(self, name: str) -> np.ndarray:
        """One flat file as a read-only memory-mapped array."""
        dtype = np.dtype(self.marker["dtype"] if name.endswith(".ids") else
                         np.int64 if name.endswith(".offsets") else np.int32)
        size = self.marker["files"][name]["bytes"] // dtype.itemsize
        return np.memmap(self.path / name, dtype, mode="r", shape=(size,)) if size else np.zeros(0, dtype)

    def install_tokenizer(self, run_dir: Path) -> None:
        """Copy the SentencePiece model(s) and tokenizer.json into a run directory, unless already there."""
        for name in [*self.marker["tokenizer"], "tokenizer.json"]:
            src, dst = self.path / name, run_dir / name
            if not dst.exists() or dst.read_bytes() != src.read_bytes():
                tmp = dst.with_name(f".{name}.tmp-{os.getpid()}")
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process preparing %s", path.with_suffix(""))
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class DataCache:
    """The entry of one config's training data: `DataCache(cfg)` hashes the data and fails at once if the
    entry is missing and cannot be written; `entry()` opens it, building it first if needed."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg, self.root = cfg, cache_root(cfg.data)
        self.key = fingerprint(cfg)
        self.path = self.root / self.key
        self.found = Entry.open(self.path) if self.path.exists() else None
        reason = None if self.found else _not_writable(self.root)
        if reason:
            raise DataError(f"data.cache_dir {self.root}: cannot write the data cache there ({reason}); "
                            "set data.cache_dir or ATTN_MT_CACHE to a writable directory")

    def entry(self, run_dir: Path | None = None) -> Entry:
        """The complete entry; built under the lock if missing (the tokenizer reused from `run_dir` if it matches)."""
        if self.found:
            log.info("data cache: %s (%d training pairs)", self.path, self.found.pairs)
            return self.found
        with _locked(self.root / f"{self.key}.lock"):
            self.found = Entry.open(self.path) if self.path.exists() else None  # built while we waited?
            if not self.found:
                self.found = self._build(run_dir)
        return self.found

    def _build(self, run_dir: Path | None) -> Entry:
        for stale in self.root.glob(f"{self.key}.tmp-*"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp, t0 = self.root / f"{self.key}.tmp-{os.getpid()}", time.perf_counter()
        tmp.mkdir()
        try:
            marker = _fill(self.cfg, tmp, run_dir, self.key)
            _write_json(tmp / MARKER, marker)
            _fsync(tmp)
            if self.path.exists():
                shutil.rmtree(self.path)  # a damaged entry
            os.replace(tmp, self.path)
            _fsync(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("data cache: built %s in %.1f s (%d training pairs, %d + %d tokens)", self.path,
                 time.perf_counter() - t0, marker["pairs"], *marker["tokens"].values())
        return Entry(self.path, marker)


def _fill(cfg: ExperimentConfig, tmp: Path, run_dir: Path | None, key: str) -> dict:
    """Read, train the tokenizer, encode and write the flat files into `tmp`; returns complete.json's content."""
    import datasets

    t0 = time.perf_counter()
    n = write_pairs(cfg.data, cfg.data.splits.train, tmp / "text.arrow")
    text = datasets.Dataset.from_file(str(tmp / "text.arrow"))
    t1 = time.perf_counter()
    log.info("read %d training pairs in %.1f s", n, t1 - t0)
    tok_dir = run_dir or tmp
    tok = train_or_load(cfg.tokenizer, *_sample(text, cfg.tokenizer), tok_dir, fingerprint=key)
    t2 = time.perf_counter()
    log.info("tokenizer ready in %.1f s", t2 - t1)
    names = ["spm.model"] if tok.joint else ["spm.src.model", "spm.tgt.model"]
    if tok_dir != tmp:
        for name in [*names, "tokenizer.json"]:
            shutil.copyfile(tok_dir / name, tmp / name)
    dtype = np.uint16 if max(tok.src_vocab_size, tok.tgt_vocab_size) <= 2**16 else np.int32
    procs = cfg.data.num_proc or len(os.sched_getaffinity(0))
    with _progress(n >= BIG and log.isEnabledFor(logging.INFO)):  # a bar for big corpora, none with --quiet
        encoded = text.with_format("arrow").map(
            _Encode(tok.state(), dtype), batched=True, batch_size=2000,
            num_proc=procs if n >= BIG and procs > 1 else None, remove_columns=["src", "tgt"],
            cache_file_name=str(tmp / "encoded.arrow"), new_fingerprint=key, desc="tokenizing")
    tokens = _write_flat(encoded, tmp, dtype)
    log.info("tokenized %d sentences in %.1f s (%d processes)", 2 * n, time.perf_counter() - t2,
             procs if n >= BIG else 1)
    del text, encoded
    for f in tmp.glob("*.arrow"):
        f.unlink()
    files = {f.name: {"bytes": f.stat().st_size, "crc32": _crc32(f)} for f in sorted(tmp.iterdir())}
    return {"version": VERSION, "key": key, "pairs": n, "tokens": tokens, "dtype": np.dtype(dtype).name,
            "tokenizer": names, "files": files,
            "config": {"data": asdict(cfg.data), "tokenizer": asdict(cfg.tokenizer)}}


def _sample(text, cfg: TokenizerConfig):
    """(src, tgt) sentence streams for SentencePiece: every pair, or a fixed random `sample_sentences` of them.

    Read from the memory-mapped Arrow file a batch at a time, so the corpus is never in memory twice.
    """
    from tqdm import tqdm

    k = cfg.sample_sentences // 2 if cfg.joint else cfg.sample_sentences  # pairs per model
    if len(text) > k:
        text = text.select(np.sort(np.random.default_rng(0).choice(len(text), k, replace=False)))
    total = len(text) * 2
    bar = tqdm(total=total, desc="tokenizer: reading sample", unit=" sentences", disable=None if total >= BIG else True,
               leave=False)
    log.info("training the tokenizer on %d sentences", total)

    def column(name: str) -> Iterator[str]:
        for batch in text.with_format("arrow").iter(batch_size=10_000):
            bar.update(len(batch))
            yield from batch[name].to_pylist()
        if name == "tgt":
            bar.close()

    return column("src"), column("tgt")


class _Encode:
    """The batched `map` function: an Arrow batch of texts -> Arrow list arrays of token ids. Picklable for
    the worker processes, which each rebuild the SentencePiece models once."""

    def __init__(self, state: dict, dtype: type) -> None:
        self.state, self.dtype, self.tok = state, dtype, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "tok": None}

    def __call__(self, batch):
        import pyarrow as pa

        self.tok = self.tok or Tokenizer.from_state(self.state)
        src = self.tok.src.encode(batch["src"].to_pylist(), num_threads=1)  # the processes share the cores
        tgt = self.tok.tgt.encode(batch["tgt"].to_pylist(), num_threads=1)
        return pa.table({"src_ids": self._lists(src), "tgt_ids": self._lists(tgt)})

    def _lists(self, seqs: list[list[int]]):
        import pyarrow as pa

        offsets = np.zeros(len(seqs) + 1, dtype=np.int32)  # (n + 1,)
        np.cumsum(np.fromiter(map(len, seqs), np.int32, len(seqs)), out=offsets[1:])
        values = np.fromiter(itertools.chain.from_iterable(seqs), self.dtype, int(offsets[-1]))
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _write_flat(encoded, tmp: Path, dtype: type) -> dict[str, int]:
    """The encoded Arrow table as the flat ids/offsets/lengths files, a record batch at a time; tokens per side."""
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


def _write_json(path: Path, obj: dict) -> None:
    with path.open("w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _fsync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
