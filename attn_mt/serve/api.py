"""The JSON contract of `attn-mt serve`: request and response models, limits, and errors that name a field."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; larger requests are answered 413, out-of-range values 422."""

    max_texts: int = 64  # sentences per /api/translate request
    max_chars: int = 10_000  # characters per request, all sentences together
    max_attention_chars: int = 1000  # an /api/attention sentence: the maps grow with its length squared
    max_beam: int = 16
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for others

    def __post_init__(self) -> None:
        for key in ("max_texts", "max_chars", "max_attention_chars", "max_beam"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)}: must be >= 1")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms={self.max_wait_ms}: must be >= 0")

    @property
    def max_body_bytes(self) -> int:
        """Request bodies above this are refused unread: 12 bytes a character covers JSON's \\u escapes."""
        return 12 * self.max_chars + 16 * self.max_texts + 4096


class ApiError(Exception):
    """A request the server refuses: HTTP status, the field at fault, and why."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status, self.field, self.message = status, field, message


def error_body(field: str, message: str) -> dict:
    return {"error": f"{field}: {message}", "field": field}


def _clean(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"), which are not text (the response could not encode them)
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")
_STRICT = ConfigDict(extra="forbid", strict=True)  # no "5" for 5, no unknown keys (a typo'd "beam_size")


class TranslateRequest(BaseModel):
    model_config = _STRICT

    texts: list[str] = Field(min_length=1, description="Sentences to translate, in order.",
                             examples=[["Ein Hund rennt über die Wiese."]])
    beam: int | None = Field(None, ge=1, description="Beam size, 1 is greedy (default: the checkpoint's).")
    alpha: float | None = Field(None, ge=0.0, le=10.0, allow_inf_nan=False,
                                description="GNMT length penalty exponent (default: the checkpoint's).")
    nbest: int | None = Field(None, ge=1, description="Hypotheses per sentence, at most beam (default 1).")

    @field_validator("texts")
    @classmethod
    def _texts(cls, texts: list[str]) -> list[str]:
        return [_clean(t) for t in texts]

    def check(self, limits: Limits) -> None:
        """Refuse what the limits do not allow, naming the field."""
        if len(self.texts) > limits.max_texts:
            raise ApiError(413, "texts", f"{len(self.texts)} sentences; at most {limits.max_texts} per request")
        _check_chars("texts", sum(map(len, self.texts)), limits.max_chars)
        _check_beam(self.beam, limits)


class AttentionRequest(BaseModel):
    model_config = _STRICT

    text: str = Field(min_length=1, description="One source sentence.", examples=["Ein Hund rennt."])
    beam: int | None = Field(None, ge=1, description="Beam size for the translation (default: the checkpoint's).")

    @field_validator("text")
    @classmethod
    def _text(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("the sentence is empty")
        return _clean(text)

    def check(self, limits: Limits) -> None:
        _check_chars("text", len(self.text), min(limits.max_chars, limits.max_attention_chars))
        _check_beam(self.beam, limits)


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="log P / length penalty: what ranks the n-best list.")
    log_prob: float = Field(description="log P(translation | source).")


class Result(BaseModel):
    source: str
    hypotheses: list[Hypothesis] = Field(description="Best first.")


class TranslateResponse(BaseModel):
    results: list[Result] = Field(description="One per input text, in input order.")


Maps = list[list[list[list[float]]]]  # [layer][head][query][key]


class AttentionResponse(BaseModel):
    translation: str
    source_tokens: list[str] = Field(description="Subwords of the source, with </s>: encoder keys.")
    target_tokens: list[str] = Field(description="Predicted subwords with </s>: decoder queries.")
    target_input_tokens: list[str] = Field(description="<s> and the prediction: decoder self-attention keys.")
    encoder_self: Maps = Field(description="[layer][head][source][source]; empty for an RNN.")
    decoder_self: Maps = Field(description="[layer][head][target][target input]; empty for an RNN.")
    cross: Maps = Field(description="[layer][head][target][source]; an RNN has one layer, one head.")


def _check_chars(field: str, n: int, most: int) -> None:
    if n > most:
        raise ApiError(413, field, f"{n} characters; at most {most} per request")


def _check_beam(beam: int | None, limits: Limits) -> None:
    if beam is not None and beam > limits.max_beam:
        raise ApiError(422, "beam", f"{beam} exceeds the largest beam size, {limits.max_beam}")
