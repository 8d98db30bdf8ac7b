"""The `decode:` section: beam search and its length limits, and the table of the decode options
callers give.

Tested in tests/config/test_config.py and tests/decoding/test_decode_options.py (the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypedDict

from attn_mt.config.yamlconf import ConfigError


@dataclass(frozen=True)
class DecodeOption:
    """A decode setting a caller may give, defined once; every surface is made from its row. `key`:
    its DecodeConfig field (`decode.<key>` in a config); `arg`: its keyword in the API
    (`Model.options`, `Model.translate`, ...; the command line spells it its own way); `field`: its
    JSON field in serve's `/api/translate` (None: not served); `type`, `least`, `most`: the values
    allowed; `default`: what a caller gets without it (None: the model's decode section); `help`:
    what it means; `calls`: the `Model` methods that take it (CALLS; `translate` also stands for
    `evaluate` and the command line's `evaluate`, `translate_nbest` for its `translate`; `stream`
    decodes greedily, one sentence). Public as `attn_mt.DECODE_OPTIONS`."""

    key: str
    arg: str
    type: type
    least: float
    most: float
    help: str
    field: str | None = None
    default: str | None = None
    calls: tuple[str, ...] = ("translate_nbest", "translate", "stream")

    def problem(self, value: int | float) -> str | None:
        """Why `value` is not allowed (the end of the message: "must be >= 1"), or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if value > self.most:
            return f"must be at most {self.most:g}"
        return f"must be >= {self.least:g}" if value < self.least else None


CALLS = ("translate_nbest", "translate", "stream")  # the Model's calls that decode
WHOLE = CALLS[:2]  # calls that decode whole sentences, in batches

DECODE_OPTIONS = (
    DecodeOption("beam_size", "beam", int, 1, 1000, "Beam size; 1 is greedy", field="beam",
                 calls=WHOLE),
    DecodeOption("alpha", "alpha", float, 0.0, 100.0, "Length penalty exponent", field="alpha",
                 calls=WHOLE),
    DecodeOption("nbest", "nbest", int, 1, 1000, "Hypotheses per sentence, at most the beam size",
                 field="nbest", default="1", calls=CALLS[:1]),
    DecodeOption("batch_size", "batch_size", int, 1, 1_000_000, "Sentences per batch",
                 calls=WHOLE),
    DecodeOption("max_len_a", "max_len_a", float, 0.0, 1000.0,
                 "Output length limit a x source length + b: its a"),
    DecodeOption("max_len_b", "max_len_b", int, 1, 1_000_000,
                 "Output length limit a x source length + b: its b"),
)
OPTION = {o.key: o for o in DECODE_OPTIONS}
ARGS = {o.key: o.arg for o in DECODE_OPTIONS}  # DecodeConfig field -> the API's argument
# DecodeConfig field -> serve's JSON field
FIELDS = {o.key: o.field for o in DECODE_OPTIONS if o.field}


def taking(call: str) -> tuple[DecodeOption, ...]:
    """The rows whose options `call` (one of CALLS) takes."""
    return tuple(o for o in DECODE_OPTIONS if call in o.calls)


class Streamed(TypedDict, total=False):
    """The API's decode keywords, DECODE_OPTIONS' `arg`s, for a stream (`Model.stream`); each is
    None or left out for the model's default. Written out for type checkers, as OneBest and
    Decoding are; tests/decoding/test_decode_options.py keeps each equal to its rows (`taking`)."""

    max_len_a: float | None
    max_len_b: int | None


class OneBest(Streamed, total=False):
    """The decode keywords of a one-best call (`Model.translate`, `Model.evaluate`)."""

    beam: int | None
    alpha: float | None
    batch_size: int | None


class Decoding(OneBest, total=False):
    """Every decode keyword: OneBest's and `nbest` (`Model.translate_nbest`, `Model.options`)."""

    nbest: int | None


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 1  # 1: greedy
    alpha: float = 0.6  # length penalty exponent
    # beam scores are log P / ((5 + |Y|) / 6) ** alpha (GNMT), or
    length_norm: Literal["gnmt", "power"] = "gnmt"
    #     log P / |Y| ** alpha (power: transformers' length_penalty, what MarianMT models are
    #     decoded with)
    nbest: int = 1
    max_len_a: float = 1.5  # maximum output length = a * source length + b
    max_len_b: int = 10
    batch_size: int = 64

    def __post_init__(self) -> None:
        for o in DECODE_OPTIONS:  # each option's range, from its row
            value = getattr(self, o.key)
            if why := o.problem(value):
                raise ConfigError(f"decode.{o.key}={value}: {why}", f"decode.{o.key}")
        if self.nbest > self.beam_size:
            raise ConfigError(f"decode.nbest={self.nbest} exceeds "
                              f"decode.beam_size={self.beam_size}", "decode.nbest")

    @property
    def penalty(self) -> float | Penalty:
        """What beam.length_penalty takes: alpha (GNMT) or a Penalty (another form)."""
        return self.alpha if self.length_norm == "gnmt" else Penalty(self.alpha, self.length_norm)


class Penalty(NamedTuple):
    """A length penalty exponent and its form (beam.length_penalty)."""

    alpha: float
    form: str
