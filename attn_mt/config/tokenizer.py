"""The `tokenizer:` section: the SentencePiece model trained on the training split.

Tested in tests/config/test_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attn_mt.config.yamlconf import ConfigError, check_limits

MOST = {"vocab_size": 1_000_000}  # upper bounds (lower bounds: __post_init__)


@dataclass(frozen=True)
class TokenizerConfig:
    type: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for both languages (allows full embedding tying)
    character_coverage: float = 1.0
    # SentencePiece trains on at most this many sentences per model (a fixed random sample of the
    # training pairs; all of them in a smaller corpus)
    sample_sentences: int = 1_000_000

    def __post_init__(self) -> None:
        check_limits("tokenizer", self, MOST)
        if not 1_000 <= self.sample_sentences <= 100_000_000:
            raise ConfigError(f"tokenizer.sample_sentences={self.sample_sentences}: must be in "
                              "[1000, 1e8]", "tokenizer.sample_sentences")
        if self.vocab_size < 16:
            raise ConfigError(f"tokenizer.vocab_size={self.vocab_size}: must be >= 16",
                              "tokenizer.vocab_size")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise ConfigError("tokenizer.character_coverage must be in [0.9, 1.0]",
                              "tokenizer.character_coverage")
