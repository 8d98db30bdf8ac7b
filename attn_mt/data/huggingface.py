"""The `hf` data source: a Hugging Face `datasets` dataset, saved on disk or on the hub (interop; sources.py's
`source` loads this module only for `data.source: hf`)."""

from __future__ import annotations

from pathlib import Path

from attn_mt.config.yamlconf import first_line
from attn_mt.data.sources import CHUNK, Chunks, DataError, Source


class HuggingFace(Source):
    """A `datasets` dataset saved with `save_to_disk` in `dir`, else `name` (and `hf_config`) on the hub;
    identified by the dataset's own fingerprint. Rows hold a `translation` dict or one column per language."""

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
            raise DataError(f"{where}: cannot load Hugging Face dataset split {split!r}: {first}") from None
        if "translation" not in ds.column_names and not {cfg.src_lang, cfg.tgt_lang} <= set(ds.column_names):
            raise DataError(f"{where}: split {split!r} has columns {ds.column_names}; expected 'translation' "
                            f"or '{cfg.src_lang}' and '{cfg.tgt_lang}'")
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
                        what = "missing" if not isinstance(row, dict) or lang not in row else type(value).__name__
                        raise DataError(f"{where}: split {split!r} row {i}: {lang!r} is {what}, expected a string")
                    out.append(value.strip())
            first += len(rows)
            yield src, tgt
