"""The `decode:` section: beam search and its length limits, and the table of the decode options callers give.

Tested in tests/config/test_config.py and tests/decoding/test_decode_options.py (the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from attn_mt.config.yamlconf import ConfigError, check_limits

MOST = {"beam_size": 1000, "nbest": 1000, "alpha": 100.0, "max_len_a": 1000.0, "max_len_b": 1_000_000,
        "batch_size": 1_000_000}  # upper bounds (lower bounds: __post_init__)


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 1  # 1: greedy
    alpha: float = 0.6  # length penalty exponent
    length_norm: Literal["gnmt", "power"] = "gnmt"  # beam scores are log P / ((5 + |Y|) / 6) ** alpha (GNMT), or
    #     log P / |Y| ** alpha (power: transformers' length_penalty, what MarianMT models are decoded with)
    nbest: int = 1
    max_len_a: float = 1.5  # maximum output length = a * source length + b
    max_len_b: int = 10
    batch_size: int = 64

    def __post_init__(self) -> None:
        check_limits("decode", self, MOST)
        for key in ("beam_size", "nbest", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"decode.{key}={getattr(self, key)}: must be >= 1")
        if self.nbest > self.beam_size:
            raise ConfigError(f"decode.nbest={self.nbest} exceeds decode.beam_size={self.beam_size}")
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ConfigError("decode.max_len_a must be >= 0 and decode.max_len_b >= 1")

    @property
    def penalty(self) -> float | Penalty:
        """What beam.length_penalty takes: alpha (GNMT) or a Penalty (another form)."""
        return self.alpha if self.length_norm == "gnmt" else Penalty(self.alpha, self.length_norm)


@dataclass(frozen=True)
class DecodeOption:
    """A decode setting a caller may give, defined once: its DecodeConfig field (`key`), its name as an argument
    of the API (`Model.options`, `Model.translate`) and as a field of serve's requests (`arg`), whether serve's
    requests take it, and what it means. The CLI's options, the API's
    arguments, serve's request fields and the page's controls are derived from or tested against this table
    (tests/decoding/test_decode_options.py); public as `attn_mt.DECODE_OPTIONS`."""

    key: str
    arg: str
    served: bool
    help: str


DECODE_OPTIONS = (
    DecodeOption("beam_size", "beam", True, "Beam size; 1 is greedy"),
    DecodeOption("alpha", "alpha", True, "Length penalty exponent"),
    DecodeOption("nbest", "nbest", True, "Hypotheses per sentence, at most the beam size"),
    DecodeOption("batch_size", "batch_size", False, "Sentences per batch"),
    DecodeOption("max_len_a", "max_len_a", False, "Output length limit a x source length + b: its a"),
    DecodeOption("max_len_b", "max_len_b", False, "Output length limit a x source length + b: its b"),
)
OPTION = {o.key: o for o in DECODE_OPTIONS}
ARGS = {o.key: o.arg for o in DECODE_OPTIONS}  # DecodeConfig field -> the API's argument


class Penalty(NamedTuple):
    """A length penalty exponent and its form (beam.length_penalty)."""

    alpha: float
    form: str
