"""`attn-mt download multi30k`: the corpus as `{split}.{de,en}` files, from the original URL, else
the hub.

Tested in tests/data/test_sources.py and tests/test_files.py (never through a planted link).
"""

from __future__ import annotations

import gzip
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from attn_mt.config.yamlconf import first_line
from attn_mt.errors import RunError
from attn_mt.files import write_atomic

log = logging.getLogger(__name__)


class DownloadError(RunError):
    """A corpus that could not be fetched (offline, unknown name, ...)."""


HUB_NAME = "bentrevett/multi30k"  # splits train / validation / test (= test2016), columns de, en
HUB_SPLITS = {"train": "train", "validation": "valid", "test": "test2016"}
URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"
URL_SPLITS = {"train": "train", "val": "valid", "test_2016_flickr": "test2016",
              "test_2017_flickr": "test2017", "test_2018_flickr": "test2018",
              "test_2017_mscoco": "test2017_mscoco"}


def missing_data_hint(error: Exception, offline: str) -> Exception:
    """A 'data file not found' error, extended by how to get Multi30k and what runs offline
    instead."""
    if "data file not found" not in str(error):
        return error
    return type(error)(f"{error}; get Multi30k with attn_mt.download or `attn-mt download "
                       "multi30k`, then set MULTI30K_DIR=DIR or give `overrides` data.dir=DIR "
                       f"(offline instead: {offline})")


def _write(path: Path, lines: list[str]) -> None:
    """Atomically, through a new O_EXCL temporary file: a planted file or link is never followed."""
    write_atomic(path, "".join(line.strip() + "\n" for line in lines))


def _hub_reachable() -> None:
    """Fail in seconds, not after the hub client's half a minute of retries, when the hub cannot be
    reached (in offline mode, HF_HUB_OFFLINE=1, datasets looks in its local cache instead)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/datasets/{HUB_NAME}", method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError:
        pass  # an answer: the hub is there
    except OSError as e:
        raise DownloadError(f"{endpoint} unreachable ({getattr(e, 'reason', e)})") from None


def _from_hub(out: Path) -> list[Path]:
    _hub_reachable()
    import datasets

    written = []
    # it has its own handler: without this, each line twice
    hub_log = logging.getLogger("huggingface_hub")
    propagate, hub_log.propagate = hub_log.propagate, False
    try:
        ds = datasets.load_dataset(HUB_NAME)
    finally:
        hub_log.propagate = propagate
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
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    errors = []
    for fetch, where in ((_from_url, "URL"), (_from_hub, f"hub {HUB_NAME}")):
        try:
            return fetch(out)
        except Exception as e:  # network and hub failures come in many types
            first = first_line(e)
            errors.append(f"{where}: {first}")
            log.info("download from %s failed: %s", where, first)
    if created and not any(out.iterdir()):
        out.rmdir()  # a failed download leaves no empty folder behind
    raise DownloadError(f"cannot download multi30k (offline?): {'; '.join(errors)}")
