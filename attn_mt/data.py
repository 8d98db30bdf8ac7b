"""Parallel data: local files, JSONL or Hugging Face datasets -> (src, tgt) pairs -> a tokenized
`Corpus` -> token batches.

Every source ends as a `datasets.Dataset` with string columns `src` and `tgt`; training
batches are built by token count from length-sorted buckets, so padding stays small.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .config import DataConfig, ExperimentConfig
from .tokenizer import Tokenizer, train_or_load

log = logging.getLogger(__name__)


class DataError(ValueError):
    """Unusable data; the message names the file, line or split."""


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, stripped; DataError names the file and line of bad bytes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 (byte {raw[e.start]:#04x})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def _from_files(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    src_path = Path(cfg.dir) / f"{split}.{cfg.src_lang}"
    tgt_path = Path(cfg.dir) / f"{split}.{cfg.tgt_lang}"
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}"
        )
    return src, tgt


def _from_jsonl(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    path = Path(cfg.dir) / f"{split}.jsonl"
    src, tgt = [], []
    for i, line in enumerate(read_lines(path), 1):
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
    return src, tgt


def _from_hf(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
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
        first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise DataError(f"{where}: cannot load Hugging Face dataset split {split!r}: {first}") from None
    if "translation" in ds.column_names:
        rows = list(ds["translation"])
    elif cfg.src_lang in ds.column_names and cfg.tgt_lang in ds.column_names:
        rows = [{cfg.src_lang: s, cfg.tgt_lang: t} for s, t in zip(ds[cfg.src_lang], ds[cfg.tgt_lang], strict=True)]
    else:
        raise DataError(
            f"{where}: split {split!r} has columns {ds.column_names}; expected 'translation' "
            f"or '{cfg.src_lang}' and '{cfg.tgt_lang}'"
        )
    src, tgt = [], []
    for i, row in enumerate(rows):
        for lang, out in ((cfg.src_lang, src), (cfg.tgt_lang, tgt)):
            value = row.get(lang) if isinstance(row, dict) else None
            if not isinstance(value, str):
                what = "missing" if not isinstance(row, dict) or lang not in row else f"{type(value).__name__}"
                raise DataError(f"{where}: split {split!r} row {i}: {lang!r} is {what}, expected a string")
            out.append(value.strip())
    return src, tgt


def _from_toy(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    from .toy import make_toy_corpus

    corpus = make_toy_corpus(cfg.toy_size, cfg.toy_seed)
    if split not in corpus:
        raise DataError(f"data.splits: the toy corpus has splits train, valid, test, not {split!r}")
    pairs = corpus[split]
    return [s for s, _ in pairs], [t for _, t in pairs]


_READERS = {"files": _from_files, "jsonl": _from_jsonl, "hf": _from_hf, "toy": _from_toy}


def load_pairs(cfg: DataConfig, split: str):
    """The named split as a `datasets.Dataset` with columns `src` and `tgt`, empty pairs dropped."""
    import datasets

    src, tgt = _READERS[cfg.source](cfg, split)
    keep = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s and t]
    if not keep:
        raise DataError(f"split {split!r} ({cfg.source} {cfg.dir or cfg.name}) has no non-empty pairs")
    if len(keep) < len(src):
        log.info("split %s: dropped %d empty pairs", split, len(src) - len(keep))
    return datasets.Dataset.from_dict({"src": [src[i] for i in keep], "tgt": [tgt[i] for i in keep]})


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


def token_batches(src_lens: list[int], tgt_lens: list[int], batch_tokens: int,
                  seed: int, epoch: int, shuffle: bool = True) -> list[list[int]]:
    """Index batches of at most `batch_tokens` padded tokens (longest side x sentences).

    Sentences are sorted by length (ties broken randomly), cut into batches, and the batch
    order is shuffled; the result depends only on (seed, epoch), so a resumed run can skip
    to the batch it stopped at.
    """
    rng = np.random.default_rng([seed, epoch])
    n = len(src_lens)
    order = rng.permutation(n) if shuffle else np.arange(n)
    lens = np.maximum(np.asarray(src_lens), np.asarray(tgt_lens)) + 1  # + bos/eos
    order = order[np.argsort(lens[order], kind="stable")]
    batches, current, longest = [], [], 0
    for i in order.tolist():
        longest_if_added = max(longest, int(lens[i]))
        if current and longest_if_added * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest_if_added = [], int(lens[i])
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


@dataclass
class Corpus:
    """Tokenized splits: for each split, the raw texts and their token ids."""

    tok: Tokenizer
    text: dict[str, tuple[list[str], list[str]]]  # split -> (src texts, tgt texts)
    ids: dict[str, tuple[list[list[int]], list[list[int]]]]  # split -> (src ids, tgt ids)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        """Token counts (src, tgt) of each pair of a split, without bos/eos."""
        src, tgt = self.ids[split]
        return [len(s) for s in src], [len(t) for t in tgt]

    def batches(self, split: str, index: list[list[int]]):
        """Collated `Batch`es of the pairs in each index batch."""
        src, tgt = self.ids[split]
        for b in index:
            yield collate([src[i] for i in b], [tgt[i] for i in b], self.tok.pad_id, self.tok.bos_id,
                          self.tok.eos_id)


def load_corpus(cfg: ExperimentConfig, run_dir: Path, max_positions: int) -> Corpus:
    """Read the three splits, train or reuse the tokenizer, encode, filter training pairs by length."""
    splits = cfg.data.splits
    text = {}
    for name in (splits.train, splits.valid, splits.test):
        cols = load_pairs(cfg.data, name).to_dict()
        text[name] = (cols["src"], cols["tgt"])
    tok = train_or_load(cfg.tokenizer, *text[splits.train], run_dir)
    ids = {name: (tok.encode_src(s), tok.encode_tgt(t)) for name, (s, t) in text.items()}
    limit = min(cfg.data.max_len, max_positions - 1)
    src, tgt = ids[splits.train]
    keep = [i for i in range(len(src)) if len(src[i]) <= limit and len(tgt[i]) <= limit]
    if not keep:
        raise DataError(f"split {splits.train!r}: no pair has at most {limit} tokens per side "
                        "(data.max_len / model.max_positions)")
    if len(keep) < len(src):
        log.info("dropped %d of %d training pairs longer than %d tokens", len(src) - len(keep), len(src),
                 limit)
    ids[splits.train] = ([src[i] for i in keep], [tgt[i] for i in keep])
    return Corpus(tok, text, ids)
