"""Where parallel text comes from: local files, JSONL, Hugging Face datasets or the toy generator.

Each kind of source is one class that describes where a split lies (`paths`) and from that both
reads it, in chunks of (src, tgt) texts, and identifies it for the data cache's key (`identity`: the
files' contents, not their names or dates). `iter_pairs` gives a split with empty pairs dropped; the
training split is streamed into an Arrow file (`write_pairs`) that the data cache tokenizes,
validation and test are read into memory (`read_pairs`).

One job: reading parallel text from each kind of source; tokenizing and caching are build.py's and
cache.py's.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from attn_mt.config import DataConfig
from attn_mt.config.yamlconf import first_line

from .lines import CHUNK, DataError, line_chunks, sha256

log = logging.getLogger(__name__)


# (src texts, tgt texts), a few thousand pairs at a time
Chunks = Iterator[tuple[list[str], list[str]]]


class Source:
    """One kind of source, for one data config: where a split lies, how it is read, what identifies
    it.

    The values `identity` returns keep the shapes the cache keys have always had (a new shape would
    orphan every cache entry, and with it the tokenizer a resumed run finds there).
    """

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg

    def paths(self, split: str) -> list[Path]:
        """The files the split is read from."""
        raise NotImplementedError

    def chunks(self, split: str) -> Chunks:
        """The split as stored, in chunks of (src, tgt) texts (stripped, empty pairs kept)."""
        raise NotImplementedError

    def identity(self, split: str) -> object:
        """What the split holds, as JSON: here the sha256 of each of its files."""
        return [sha256(p) for p in self.paths(split)]

    def contrastive(self, split: str) -> list[dict] | None:
        """A contrastive test set written with the split (decoding/contrastive.py's records), if it
        has one."""
        return None

    def gold_links(self, split: str) -> list[str] | None:
        """The split's gold word alignment, a Pharaoh line per pair, if the source knows it."""
        return None


class Files(Source):
    """`{dir}/{split}.{lang}`: one sentence per line, line i of one language translating line i of
    the other."""

    def paths(self, split: str) -> list[Path]:
        return [Path(self.cfg.dir) / f"{split}.{lang}"
                for lang in (self.cfg.src_lang, self.cfg.tgt_lang)]

    def chunks(self, split: str) -> Chunks:
        src_path, tgt_path = self.paths(split)
        src_chunks, tgt_chunks = line_chunks(src_path), line_chunks(tgt_path)
        n_src = n_tgt = 0
        for src, tgt in itertools.zip_longest(src_chunks, tgt_chunks, fillvalue=[]):
            n_src, n_tgt = n_src + len(src), n_tgt + len(tgt)
            if len(src) != len(tgt):
                n_src, n_tgt = n_src + sum(map(len, src_chunks)), n_tgt + sum(map(len, tgt_chunks))
                raise DataError(f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has "
                                f"{n_tgt}")
            yield src, tgt


class Jsonl(Source):
    """`{dir}/{split}.jsonl`: one `{"translation": {src_lang: ..., tgt_lang: ...}}` per line."""

    def paths(self, split: str) -> list[Path]:
        return [Path(self.cfg.dir) / f"{split}.jsonl"]

    def identity(self, split: str) -> object:
        return sha256(self.paths(split)[0])

    def chunks(self, split: str) -> Chunks:
        (path,), sl, tl = self.paths(split), self.cfg.src_lang, self.cfg.tgt_lang
        i = 0
        for lines in line_chunks(path):
            src, tgt = [], []
            for line in lines:
                i += 1
                if not line:
                    continue
                try:
                    pair = json.loads(line)["translation"]
                    s, t = pair[sl], pair[tl]
                except RecursionError:
                    raise DataError(f"{path}:{i}: JSON nested too deeply") from None
                # ValueError: bad JSON, huge numbers
                except (ValueError, KeyError, TypeError, IndexError) as e:
                    raise DataError(f"{path}:{i}: expected {{\"translation\": {{\"{sl}\": ..., "
                                    f"\"{tl}\": ...}}}} ({e.__class__.__name__}: "
                                    f"{str(e)[:200]})") from None
                if not isinstance(s, str) or not isinstance(t, str):
                    raise DataError(f"{path}:{i}: translations must be strings")
                src.append(s.strip())
                tgt.append(t.strip())
            yield src, tgt


class HuggingFace(Source):
    """A `datasets` dataset saved with `save_to_disk` in `dir`, else `name` (and `hf_config`) on the
    hub; identified by the dataset's own fingerprint. Rows hold a `translation` dict or one column
    per language."""

    def paths(self, split: str) -> list[Path]:
        return [Path(self.cfg.dir)] if self.cfg.dir else []

    def identity(self, split: str) -> object:
        return self.load(split)._fingerprint

    def load(self, split: str):
        """The split as a (memory-mapped) `datasets.Dataset`, as stored: local dir, else the hub."""
        import datasets

        cfg, where = self.cfg, self.cfg.dir or self.cfg.name
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
            raise DataError(f"{where}: cannot load Hugging Face dataset split {split!r}: "
                            f"{first}") from None
        if ("translation" not in ds.column_names
            and not {cfg.src_lang, cfg.tgt_lang} <= set(ds.column_names)):
            raise DataError(f"{where}: split {split!r} has columns {ds.column_names}; expected "
                            f"'translation' or '{cfg.src_lang}' and '{cfg.tgt_lang}'")
        return ds

    def chunks(self, split: str) -> Chunks:
        cfg, where, first = self.cfg, self.cfg.dir or self.cfg.name, 0
        for batch in self.load(split).iter(batch_size=CHUNK):
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
                        what = ("missing" if not isinstance(row, dict) or lang not in row
                                else type(value).__name__)
                        raise DataError(f"{where}: split {split!r} row {i}: {lang!r} is {what}, "
                                        "expected a string")
                    out.append(value.strip())
            first += len(rows)
            yield src, tgt


class Toy(Source):
    """The built-in generator (toy.py): its code is the file, `toy_size` and `toy_seed` the rest of
    its identity."""

    def paths(self, split: str) -> list[Path]:
        from attn_mt.data import toy

        if self.cfg.toy_variant == "pronoun":
            from attn_mt.data import pronoun

            return [Path(toy.__file__), Path(pronoun.__file__)]
        return [Path(toy.__file__)]

    def identity(self, split: str) -> object:
        # the default's keys as they were
        variant = [self.cfg.toy_variant] if self.cfg.toy_variant else []
        return [self.cfg.toy_size, self.cfg.toy_seed, *variant, *super().identity(split)]

    def contrastive(self, split: str) -> list[dict] | None:
        """The pronoun variant's contrastive test set of a split (pronoun.contrastive_records)."""
        if self.cfg.toy_variant != "pronoun":
            return None
        from attn_mt.data.pronoun import contrastive_records, make_pronoun_corpus

        return contrastive_records(make_pronoun_corpus(self.cfg.toy_size, self.cfg.toy_seed)[split])

    def gold_links(self, split: str) -> list[str] | None:
        """The links the generator's rules make (toy.Aligned, pronoun.Example.links)."""
        if self.cfg.toy_variant == "pronoun":
            from attn_mt.data.pronoun import make_pronoun_corpus

            examples = make_pronoun_corpus(self.cfg.toy_size, self.cfg.toy_seed)[split]
            return [ex.links for ex in examples]
        from attn_mt.data.toy import make_aligned_corpus

        pairs = make_aligned_corpus(self.cfg.toy_size, self.cfg.toy_seed)[split]
        return [p.pharaoh() for p in pairs]

    def chunks(self, split: str) -> Chunks:
        if self.cfg.toy_variant == "pronoun":
            from attn_mt.data.pronoun import pronoun_pairs as make
        else:
            from attn_mt.data.toy import make_toy_corpus as make
        corpus = make(self.cfg.toy_size, self.cfg.toy_seed)
        if split not in corpus:
            raise DataError("data.splits: the toy corpus has splits train, valid, test, not "
                            f"{split!r}")
        pairs = corpus[split]
        yield [s for s, _ in pairs], [t for _, t in pairs]


SOURCES: dict[str, type[Source]] = {"files": Files, "jsonl": Jsonl, "hf": HuggingFace, "toy": Toy}


def source(cfg: DataConfig) -> Source:
    """The source `data.source` names, for this config."""
    return SOURCES[cfg.source](cfg)


def non_empty(src: list[str], tgt: list[str]) -> list[int]:
    """The pairs of a chunk that are kept: both sides non-empty."""
    return [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s and t]


def iter_pairs(cfg: DataConfig, split: str) -> Chunks:
    """The named split in chunks of (src, tgt) texts, empty pairs dropped; DataError if none is
    left."""
    kept = dropped = 0
    for src, tgt in source(cfg).chunks(split):
        keep = non_empty(src, tgt)
        if len(keep) < len(src):
            dropped += len(src) - len(keep)
            src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
        kept += len(src)
        if src:
            yield src, tgt
    if not kept:
        raise DataError(f"split {split!r} ({cfg.source} {cfg.dir or cfg.name}) has no non-empty "
                        "pairs")
    if dropped:
        log.info("split %s: dropped %d empty pairs", split, dropped)


def read_pairs(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """The named split in memory as (src texts, tgt texts), empty pairs dropped (validation and
    test)."""
    src, tgt = [], []
    for s, t in iter_pairs(cfg, split):
        src += s
        tgt += t
    return src, tgt


def write_pairs(cfg: DataConfig, split: str, path: Path) -> int:
    """Stream the split into an Arrow file with columns `src` and `tgt` (for
    `datasets.Dataset.from_file`, which maps it); returns the number of pairs."""
    import pyarrow as pa

    schema = pa.schema([("src", pa.string()), ("tgt", pa.string())])
    n = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer, \
            tqdm(desc=f"reading {split}", unit=" pairs", disable=None, leave=False) as bar:
        for src, tgt in iter_pairs(cfg, split):
            writer.write_batch(pa.record_batch([pa.array(src, pa.string()),
                                                pa.array(tgt, pa.string())], schema))
            n += len(src)
            bar.update(len(src))
    return n
