"""What `bench` and `compare-rnn` do first: threads, device, precision and the corpus, in one place.

Tested in tests/measure/test_bench.py and tests/measure/test_compare.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_mt.config import ExperimentConfig
from attn_mt.data.corpus import Corpus, load_corpus
from attn_mt.data.download import missing_data_hint
from attn_mt.data.lines import DataError
from attn_mt.device import pick_device, pick_precision


@dataclass(frozen=True)
class Prelude:
    device: torch.device
    precision: str  # train.precision resolved for the device
    corpus: Corpus


def prelude(cfg: ExperimentConfig, max_positions: int, hint: str) -> Prelude:
    """train.threads (the caller restores the old count if it must), device, precision, and the
    corpus through the same data path as training; missing data ends in one line saying how to get
    it or to run `hint`."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = pick_device(cfg.train.device)
    precision = pick_precision(cfg.train.precision, device)
    try:
        corpus = load_corpus(cfg, max_positions)
    except DataError as e:
        raise missing_data_hint(e, hint) from None
    return Prelude(device, precision, corpus)
