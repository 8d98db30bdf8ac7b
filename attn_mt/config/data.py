"""The `data:` section: where the corpus comes from, its languages and splits, and the training data
cache.

Tested in tests/config/test_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from attn_mt.config.yamlconf import ConfigError, check_limits

# upper bounds far above any sensible value (lower bounds: __post_init__)
MOST = {"max_len": 100_000, "toy_size": 100_000_000, "toy_seed": 2**32 - 1}


@dataclass(frozen=True)
class SplitsConfig:
    train: str = "train"
    valid: str = "valid"
    test: str = "test"


@dataclass(frozen=True)
class DataConfig:
    source: Literal["files", "jsonl", "hf", "toy"] = "toy"
    dir: str = ""  # files: {dir}/{split}.{lang}; jsonl: {dir}/{split}.jsonl; hf: local dataset dir
    name: str = ""  # hf: hub name (used when dir is empty)
    hf_config: str = ""  # hf: dataset config name, e.g. "de-en"
    src_lang: str = "de"
    tgt_lang: str = "en"
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    max_len: int = 100  # training pairs with more tokens on either side are dropped
    toy_size: int = 12000  # toy: number of training pairs
    toy_seed: int = 0
    # toy: "" the default corpus, or the pronoun task (data/pronoun.py)
    toy_variant: Literal["", "pronoun"] = ""
    # tokenized training data, keyed by a fingerprint of data and tokenizer, shared by runs and
    # `attn-mt prepare`; "": $ATTN_MT_CACHE, else ~/.cache/attn_mt (docs/data.md)
    cache_dir: str = ""
    num_proc: int = 0  # processes that tokenize the training split into the cache; 0: one per core

    def __post_init__(self) -> None:
        check_limits("data", self, MOST)
        if not 0 <= self.num_proc <= 1024:
            raise ConfigError(f"data.num_proc={self.num_proc}: must be in [0, 1024]",
                              "data.num_proc")
        if self.max_len < 1:
            raise ConfigError(f"data.max_len={self.max_len}: must be >= 1", "data.max_len")
        if self.source in ("files", "jsonl") and not self.dir:
            raise ConfigError(f"data.dir: required when data.source={self.source}", "data.dir")
        if self.source == "hf" and not (self.dir or self.name):
            raise ConfigError("data.name or data.dir: one is required when data.source=hf",
                              "data.name")
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}",
                              "data.src_lang")
        if self.toy_seed < 0:
            raise ConfigError(f"data.toy_seed={self.toy_seed}: must be >= 0", "data.toy_seed")
        if self.toy_size < 10:
            raise ConfigError(f"data.toy_size={self.toy_size}: must be >= 10", "data.toy_size")
