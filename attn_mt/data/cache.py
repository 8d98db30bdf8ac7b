"""The data cache: the training split tokenized once, kept on disk, memory-mapped by every run and
rank.

An entry is a directory named after a fingerprint of the training data (what its source says
identifies it: the files' contents, or a Hugging Face dataset's own fingerprint) and of the
tokenizer settings; it holds the tokenizer it was built with:

    <cache_dir>/<key>/
        spm.model (joint) or spm.src.model, spm.tgt.model
        src.ids, tgt.ids          (tokens,) uint16 (int32 above 65536 pieces): all pairs' ids, end
                                  to end
        src.offsets, tgt.offsets  (pairs + 1,) int64: pair i is ids[offsets[i]:offsets[i + 1]]
        src.lengths, tgt.lengths  (pairs,) int32
        complete.json             written last: the size and CRC-32 of every file above, what they
                                  hold

It is built (build.py) in a temporary directory beside it, fsynced and renamed into place, under a
lock that only the building process holds (lock.py), so concurrent runs and torchrun ranks build it
once while the others wait, and a killed build leaves nothing that blocks the next. An entry that is
incomplete or does not match its complete.json is rebuilt, never read. A run notes in its directory
which entry it used (training.rundir's `RunDir.record_entry`).

One job: the cache's entries (find, lock, build into place, check); tokenizing is build.py's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from attn_mt.config import DataConfig, ExperimentConfig
from attn_mt.data.build import KINDS, SIDES, build
from attn_mt.data.lines import DataError
from attn_mt.data.lock import exclusive
from attn_mt.data.sources import iter_pairs, source
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.files import replace_folder, sync_folder, write_atomic

log = logging.getLogger(__name__)

VERSION = 1  # of the entry layout; part of the key
MARKER = "complete.json"
DTYPES = ("uint16", "int32")


def cache_root(cfg: DataConfig) -> Path:
    """data.cache_dir, else $ATTN_MT_CACHE, else $XDG_CACHE_HOME/attn_mt (~/.cache/attn_mt)."""
    if cfg.cache_dir or os.environ.get("ATTN_MT_CACHE"):
        return Path(cfg.cache_dir or os.environ["ATTN_MT_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attn_mt"


def fingerprint(cfg: ExperimentConfig, tok: Tokenizer | None = None) -> str:
    """Key of the training split's entry: data identity (contents, not names or dates) and tokenizer
    settings, or the given tokenizer itself (a fine-tuned model's: train.init_from)."""
    d = cfg.data
    parts = {"version": VERSION, "source": d.source, "split": d.splits.train,
             "langs": [d.src_lang, d.tgt_lang], "tokenizer": asdict(cfg.tokenizer),
             "data": source(d).identity(d.splits.train)}
    if tok is not None:
        files = tok.files()
        parts["given_tokenizer"] = {k: hashlib.sha256(files[k]).hexdigest() for k in sorted(files)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class Damaged(Exception):
    """An entry that cannot be used; the message says why, in a few words."""


class Entry:
    """A complete cache entry: its tokenizer, and the token ids of the training pairs,
    memory-mapped."""

    def __init__(self, path: Path, marker: dict, tok: Tokenizer) -> None:
        self.path, self.marker, self.tok = path, marker, tok
        self.key, self.pairs, self.tokens = path.name, marker["pairs"], marker["tokens"]

    @classmethod
    def open(cls, path: Path) -> Entry | None:
        """The entry at `path`, checked (its complete.json, and every file's size and CRC-32), or
        None if there is none; `Damaged` if there is one that cannot be used."""
        try:
            raw = (path / MARKER).read_bytes()
        except FileNotFoundError:
            if path.exists() or path.is_symlink():
                raise Damaged(f"no {MARKER} (a build that did not finish)") from None
            return None
        except OSError as e:
            raise Damaged(f"{MARKER} unreadable ({e.strerror})") from None
        try:
            marker = json.loads(raw)
            _check(marker, path.name)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise Damaged(f"{MARKER} unreadable or incomplete ({e.__class__.__name__})") from None
        for name, want in marker["files"].items():
            try:
                if ((path / name).stat().st_size != want["bytes"]
                    or _crc32(path / name) != want["crc32"]):
                    raise Damaged(f"{name} is damaged")
            except OSError as e:
                raise Damaged(f"{name} unreadable ({e.strerror})") from None
        try:
            tok = Tokenizer.from_files({n: (path / n).read_bytes() for n in marker["tokenizer"]})
        except (KeyError, RuntimeError, OSError):
            raise Damaged("its tokenizer does not load") from None
        return cls(path, marker, tok)

    def array(self, name: str) -> np.ndarray:
        """One flat file as a read-only memory-mapped array."""
        dtype = np.dtype(self.marker["dtype"] if name.endswith(".ids") else
                         np.int64 if name.endswith(".offsets") else np.int32)
        size = self.marker["files"][name]["bytes"] // dtype.itemsize
        return (np.memmap(self.path / name, dtype, mode="r", shape=(size,)) if size
                else np.zeros(0, dtype))

    def tokenizer_settings(self) -> dict:
        """The tokenizer section of the config the entry was built with."""
        return dict(self.marker["config"]["tokenizer"])

    def describe(self) -> str:
        """Where the entry is and what it holds (`attn-mt prepare` prints it)."""
        return (f"data cache: {self.path}\n{self.pairs} training pairs, {self.tokens['src']} + "
                f"{self.tokens['tgt']} tokens")


def _check(marker: dict, key: str) -> None:
    """complete.json as a build writes it, consistent with itself; ValueError, KeyError or TypeError
    if not."""
    files, tokens = marker["files"], marker["tokens"]
    sizes = {name: f["bytes"] for name, f in files.items()}
    for name, f in files.items():
        if Path(name).name != name or name.startswith(".") or not all(
                type(f[k]) is int and f[k] >= 0 for k in ("bytes", "crc32")):
            raise ValueError(name)
    if marker["version"] != VERSION or marker["key"] != key or marker["dtype"] not in DTYPES:
        raise ValueError("version, key or dtype")
    n, width = marker["pairs"], np.dtype(marker["dtype"]).itemsize
    if not all(type(x) is int and x >= 0 for x in (n, tokens["src"], tokens["tgt"])):
        raise TypeError("pairs or tokens")
    for side in SIDES:
        want = {"ids": tokens[side] * width, "offsets": (n + 1) * 8, "lengths": n * 4}
        if any(sizes[f"{side}.{kind}"] != want[kind] for kind in KINDS):
            raise ValueError(side)
    if (not isinstance(marker["config"]["tokenizer"], dict)
        or not set(marker["tokenizer"]) <= set(files)):
        raise ValueError("tokenizer")


def _crc32(path: Path) -> int:
    crc, buf = 0, bytearray(1 << 23)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(memoryview(buf)[:n], crc)
    return crc


@dataclass(frozen=True)
class Resumed:
    """What a resumed run brings to its data: the key of the entry it was trained on (from its run
    directory) and its tokenizer (from its checkpoint). If that entry is gone, it is rebuilt with
    this tokenizer rather than a newly trained one, so resuming survives a deleted cache."""

    key: str
    tok: Tokenizer

    @classmethod
    def of(cls, key: str | None, tokenizer_state: dict) -> Resumed | None:
        """From the entry key a run directory noted (`RunDir.entry_key`) and a checkpoint's
        tokenizer; None where either is missing or unreadable."""
        try:
            return cls(key, Tokenizer.from_state(tokenizer_state)) if isinstance(key, str) else None
        except (ValueError, KeyError, TypeError, RuntimeError):
            return None


def open_entry(cfg: ExperimentConfig, resumed: Resumed | None = None,
               tok: Tokenizer | None = None) -> Entry:
    """The complete entry of the config's training split: found, or else built under the lock (found
    again there first: another process may have built it while this one waited). A resumed run whose
    entry this is lends its tokenizer to the build; `tok`, where given, is the tokenizer the entry
    must have (a fine-tuned model's). An unwritable cache, and validation or test data that cannot
    be read, fail before a build starts."""
    root, key = cache_root(cfg.data), fingerprint(cfg, tok)
    path = root / key
    found, damage = _find(path)
    if found:
        log.info("data cache: %s (%d training pairs)", path, found.pairs)
        return found
    reason = _not_writable(root)
    if reason:
        raise DataError(f"data.cache_dir {root}: cannot write the data cache there ({reason}); "
                        "set data.cache_dir or ATTN_MT_CACHE to a writable directory")
    check_splits(cfg)
    with exclusive(root / f"{key}.lock", str(path)):
        found, damage = _find(path)
        if found:
            return found
        if damage:
            log.warning("data cache %s: %s; rebuilding", path, damage)
        return _build(cfg, path, tok or (resumed.tok if resumed and resumed.key == key else None))


def _find(path: Path) -> tuple[Entry | None, str | None]:
    """(the entry at `path`, None), or (None, why it cannot be used) where it is damaged, or (None,
    None)."""
    try:
        return Entry.open(path), None
    except Damaged as e:
        return None, str(e)


def _build(cfg: ExperimentConfig, path: Path, tok: Tokenizer | None) -> Entry:
    """Tokenize the training split into a temporary directory beside `path`, then rename it into
    place."""
    root, key = path.parent, path.name
    for stale in root.glob(f"{key}.tmp-*"):  # left by a build that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp, t0 = root / f"{key}.tmp-{os.getpid()}", time.perf_counter()
    tmp.mkdir()
    try:
        facts, tok = build(cfg, tmp, key, tok)
        files = {f.name: {"bytes": f.stat().st_size, "crc32": _crc32(f)}
                 for f in sorted(tmp.iterdir())}
        marker = {"version": VERSION, "key": key, **facts, "files": files,
                  "config": {"data": asdict(cfg.data), "tokenizer": asdict(cfg.tokenizer)}}
        write_atomic(tmp / MARKER, json.dumps(marker, indent=1))
        sync_folder(tmp)
        replace_folder(tmp, path)  # over a damaged entry
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("data cache: built %s in %.1f s (%d training pairs, %d + %d tokens)", path,
             time.perf_counter() - t0, marker["pairs"], *marker["tokens"].values())
    return Entry(path, marker, tok)


def check_splits(cfg: ExperimentConfig) -> None:
    """Validation and test read to the end: a missing or damaged file fails in one line, before any
    build."""
    for split in dict.fromkeys((cfg.data.splits.valid, cfg.data.splits.test)):
        for _ in iter_pairs(cfg.data, split):
            pass


def prepare(cfg: ExperimentConfig) -> Entry:
    """Check validation and test, then build (or find) the training split's cache entry: `attn-mt
    prepare`."""
    check_splits(cfg)
    return open_entry(cfg)


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
