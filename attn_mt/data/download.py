"""`attn-mt download multi30k`: the corpus as `{split}.{de,en}` files, from the hub or the original URL."""

from __future__ import annotations

import gzip
import logging
import urllib.request
from pathlib import Path

from attn_mt.config.yamlconf import first_line

log = logging.getLogger(__name__)


class DownloadError(RuntimeError):
    """A corpus that could not be fetched (offline, unknown name, ...)."""


HUB_NAME = "bentrevett/multi30k"  # splits train / validation / test (= test2016), columns de, en
HUB_SPLITS = {"train": "train", "validation": "valid", "test": "test2016"}
URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"
URL_SPLITS = {"train": "train", "val": "valid", "test_2016_flickr": "test2016",
              "test_2017_flickr": "test2017", "test_2018_flickr": "test2018",
              "test_2017_mscoco": "test2017_mscoco"}


def _write(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_text("".join(line.strip() + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)


def _from_hub(out: Path) -> list[Path]:
    import datasets

    written = []
    ds = datasets.load_dataset(HUB_NAME)
    for hub_split, split in HUB_SPLITS.items():
        for lang in ("de", "en"):
            path = out / f"{split}.{lang}"
            _write(path, ds[hub_split][lang])
            written.append(path)
    return written


def _from_url(out: Path) -> list[Path]:
    written = []
    for name, split in URL_SPLITS.items():
        for lang in ("de", "en"):
            with urllib.request.urlopen(URL.format(name=name, lang=lang), timeout=30) as r:
                lines = gzip.decompress(r.read()).decode("utf-8").split("\n")
            path = out / f"{split}.{lang}"
            _write(path, lines[:-1] if lines[-1] == "" else lines)
            written.append(path)
    return written


def download(dataset: str, out: Path) -> list[Path]:
    """Write the corpus into `out`; returns the files written."""
    if dataset != "multi30k":
        raise DownloadError(f"unknown dataset {dataset!r}; available: multi30k")
    out.mkdir(parents=True, exist_ok=True)
    errors = []
    for fetch, where in ((_from_url, "URL"), (_from_hub, f"hub {HUB_NAME}")):
        try:
            return fetch(out)
        except Exception as e:  # network and hub failures come in many types
            first = first_line(e)
            errors.append(f"{where}: {first}")
            log.info("download from %s failed: %s", where, first)
    raise DownloadError(f"cannot download multi30k (offline?): {'; '.join(errors)}")
