"""The JSON contract of `attn-mt serve`: request and response models, limits, and errors that name a
field.

One job: the JSON contract (request and answer models, limits, error bodies); answering is app.py's.
Tested in tests/serve/test_serve.py and tests/serve/test_hostile_http.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from attn_mt.api.limits import Limits
from attn_mt.config import DECODE_OPTIONS, DecodeOption
from attn_mt.data.checks import clean


class ApiError(Exception):
    """A request the server refuses: HTTP status, the field at fault, and why."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status, self.field, self.message = status, field, message


def error_body(field: str, message: str) -> dict:
    return {"error": f"{field}: {message}", "field": field}


MAX_DIGITS = 30  # a longer integer is refused naming its field, and never echoed back


class _Long:
    """An integer of more than MAX_DIGITS digits, as parsed by check_json."""

    def __init__(self, digits: str) -> None:
        self.size = len(digits.lstrip("-"))


def check_json(body: bytes) -> None:
    """Refuse, naming the field, JSON that the app's parser would refuse without saying where: an
    integer of thousands of digits (Python converts at most 4300) or nesting deeper than it
    recurses. Malformed JSON passes: the app's own answer names the character."""
    try:
        value = json.loads(body, parse_int=lambda s: _Long(s) if len(s) > MAX_DIGITS else int(s))
    except RecursionError:
        raise ApiError(400, "body", "JSON nested too deeply") from None
    except ValueError:  # malformed (or not UTF-8)
        return
    todo = [((), value)]
    while todo:  # iterative: the value may be nested almost as deep as the parser allows
        path, v = todo.pop()
        if isinstance(v, _Long):
            raise ApiError(422, ".".join(map(str, path)) or "body", f"a number of {v.size} digits")
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        todo.extend(((*path, k), x) for k, x in items)


def _clean(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"), which are not text (the response could not encode
    # them): U+FFFD, as every text argument of the API
    return clean(text)


# no "5" for 5, no unknown keys (a typo'd "beam_size")
_STRICT = ConfigDict(extra="forbid", strict=True)


# the server's own bounds, below the table's (the beam's: Limits.max_beam)
SERVED_MOST = {"alpha": 10.0}


def served(o: DecodeOption) -> tuple[Any, Any]:
    """A served decode option's request field, from its row of DECODE_OPTIONS: None (the model's
    default) or a value of its type, at least its `least` (and finite)."""
    default = f"default {o.default}" if o.default else "default: the checkpoint's"
    most = {"le": SERVED_MOST[o.key]} if o.key in SERVED_MOST else {}
    finite = {"allow_inf_nan": False} if o.type is float else {}
    return o.type | None, Field(None, ge=o.least, **most, **finite,
                                description=f"{o.help} ({default}).")


class _Texts(BaseModel):
    """What every translate request has: its texts; TranslateRequest adds the served decode
    options."""

    model_config = _STRICT

    texts: list[str] = Field(min_length=1, description="Sentences to translate, in order.",
                             examples=[["Ein Hund rennt über die Wiese."]])
    if TYPE_CHECKING:  # a field TranslateRequest makes from its row
        beam: int | None

    @field_validator("texts")
    @classmethod
    def _texts(cls, texts: list[str]) -> list[str]:
        return [_clean(t) for t in texts]

    def check(self, limits: Limits) -> None:
        """Refuse what the limits do not allow, naming the field."""
        if len(self.texts) > limits.max_texts:
            raise ApiError(413, "texts", f"{len(self.texts)} sentences; at most {limits.max_texts} "
                           "per request")
        _check_chars("texts", sum(map(len, self.texts)), limits.max_chars)
        _check_beam(self.beam, limits)


TranslateRequest = create_model(  # texts, each served option (DECODE_OPTIONS' `field`s) and stream
    "TranslateRequest", __base__=_Texts, __module__=__name__,
    **{o.field: served(o) for o in DECODE_OPTIONS if o.field},
    stream=(bool, Field(False, description="Answer as server-sent events while decoding: `token` "
                        "(greedy: the translation so far), `hypothesis` (beam: one finished), "
                        "`result` (a sentence done), then `done` with the whole answer, "
                        "or `error`.")),
    align=(bool, Field(False, description="Give each hypothesis its word alignment with the "
                       "source, `alignment`: Pharaoh links i-j (source word i, target word j, "
                       "from 0; words split at spaces), from cross-attention (docs/alignment.md); "
                       "with stream, in the `done` event.")))


def check_work(field: str, costs: list[int], limits: Limits) -> None:
    """Refuse a request whose work (source subwords x beam, see Limits.max_work) is over the
    limit."""
    if sum(costs) > limits.max_work:
        raise ApiError(413, field, f"{sum(costs)} units of work (source subwords x beam); at most "
                       f"max_work={limits.max_work} per request: send fewer or shorter sentences "
                       "or a smaller beam")


class AttentionRequest(BaseModel):
    model_config = _STRICT

    text: str = Field(min_length=1, description="One source sentence.",
                      examples=["Ein Hund rennt."])
    beam: int | None = Field(None, ge=1, description="Beam size for the translation (default: the "
                             "checkpoint's).")

    @field_validator("text", mode="before")
    @classmethod
    # before the length check, which refuses them as not text
    def _surrogates(cls, text: object) -> object:
        return _clean(text) if isinstance(text, str) else text

    @field_validator("text")
    @classmethod
    def _text(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("the sentence is empty")
        return text

    def check(self, limits: Limits) -> None:
        _check_chars("text", len(self.text), min(limits.max_chars, limits.max_attention_chars))
        _check_beam(self.beam, limits)


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="log P / length penalty: what ranks the n-best list.")
    log_prob: float = Field(description="log P(translation | source).")
    alignment: str | None = Field(None, description="With `align`: the word links, Pharaoh i-j.")


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
    target_input_tokens: list[str] = Field(description="<s> and the prediction: decoder "
                                           "self-attention keys.")
    encoder_self: Maps = Field(description="[layer][head][source][source]; empty for an RNN.")
    decoder_self: Maps = Field(description="[layer][head][target][target input]; empty for an RNN.")
    cross: Maps = Field(description="[layer][head][target][source]; "
                        "an RNN has one layer, one head.")


class ExplainRequest(AttentionRequest):
    """An attention request (same text, beam and limits) and which head and query to explain."""

    kind: str = Field("cross", description="`encoder`, `decoder` or `cross` (or a map's name: "
                      "`encoder_self`, `decoder_self`).")
    layer: int = Field(1, ge=1, description="Layer, from 1.")
    head: int = Field(1, ge=1, description="Head, from 1.")
    token: int | str = Field(0, description="The query: its position (from 0) or its text; decoder "
                             "queries are named by the token they predict.")

    @field_validator("token", mode="before")
    @classmethod
    # one error naming "token", not one per type of the union
    def _token(cls, token: object) -> object:
        if isinstance(token, bool) or not isinstance(token, int | str):
            raise ValueError("a position (an integer) or a token's text (a string)")
        return _clean(token) if isinstance(token, str) else token


class ExplainKey(BaseModel):
    index: int
    token: str
    score: float = Field(description="q . k")
    scaled: float = Field(description="q . k / sqrt(d_k)")
    masked: bool = Field(description="Removed by a mask (padding, the decoder's future): weight 0.")
    weight: float = Field(description="After softmax; the unmasked keys' weights sum to 1.")
    contribution: float = Field(description="|weight v|: this key's share of the head's output.")


Vector = list[float]


class ExplainResponse(BaseModel):
    """What explain's JSON holds: one head's attention for one query, step by step."""

    kind: str = Field(description="encoder_self, decoder_self or cross, as in /api/attention.")
    layer: int
    head: int
    source: str
    translation: str
    source_tokens: list[str] = Field(description="Subwords of the source, with </s>.")
    target_tokens: list[str] = Field(description="Predicted subwords with </s>: decoder query t "
                                     "predicts token t.")
    query_index: int
    query_token: str = Field(description="The query on the maps' axis: a source token or the token "
                             "it predicts.")
    query_input: str = Field(description="The token read at the query's position.")
    d_model: int
    n_heads: int
    d_k: int
    scale: float = Field(description="1 / sqrt(d_k).")
    x: Vector = Field(description="(d_model) The query's input to the attention module.")
    q: Vector = Field(description="(d_k) This head's query, x W_q.")
    keys: list[ExplainKey] = Field(description="Every key token: "
                                   "score, scaled score, mask, weight.")
    k: list[Vector] = Field(description="(keys, d_k) This head's keys.")
    v: list[Vector] = Field(description="(keys, d_k) This head's values.")
    head_output: Vector = Field(description="(d_k) sum_j weight_j v_j.")
    head_outputs: list[Vector] = Field(description="(heads, d_k) "
                                       "Every head's output for this query.")
    output: Vector = Field(description="(d_model) W_o [head_1; ...; head_H] + b_o, recomputed.")
    model_output: Vector = Field(description="(d_model) "
                                 "The model's own attention output for this query.")
    max_abs_diff: float = Field(description="max |output - model_output|: about 1e-7 in fp32.")


def _check_chars(field: str, n: int, most: int) -> None:
    if n > most:
        raise ApiError(413, field, f"{n} characters; at most {most} per request")


def _check_beam(beam: int | None, limits: Limits) -> None:
    if beam is not None and beam > limits.max_beam:
        raise ApiError(422, "beam", f"{beam} exceeds the largest beam size, {limits.max_beam}")
