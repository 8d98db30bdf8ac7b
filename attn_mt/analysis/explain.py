"""Explaining one head's attention for one query token: check the request, translate, recompute,
report.

The model translates the sentence (greedy unless a beam is asked for), then runs source and output
once more the way translation does: the encoder once, the decoder a token at a time with its
`DecoderCache` (decoding.attention_maps.translate_then_force), while a hook records the chosen
attention module. recompute.py then redoes the five steps for the chosen query from the module's
weights, and every head's output for it, concatenated and multiplied by W_o, is compared with the
module's own output. The `Explanation` (explanation.py) holds every number, and prints and draws
itself.
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig, TransformerConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.attention_maps import translate_then_force
from attn_mt.errors import InputError
from attn_mt.models import Seq2Seq

from .explanation import Explanation, Key
from .recompute import gather, recompute, recording

# flag -> attention map name
KINDS = {"encoder": "encoder_self", "decoder": "decoder_self", "cross": "cross"}


class ExplainError(InputError):
    """A request `explain` cannot answer; `field` names the argument at fault (layer, head, token,
    ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field)

    def __str__(self) -> str:
        return self.message


def _g(x: float | Tensor) -> float:
    return float(f"{float(x):.7g}")  # float32's 7 significant digits, without the float64 tail


def _floats(t: Tensor) -> list:
    """A vector (D,) or matrix (N, D) as Python floats."""
    out = t.detach().double().cpu().tolist()
    return [[_g(x) for x in row] for row in out] if t.dim() > 1 else [_g(x) for x in out]


def _pick(value: int | str, tokens: list[str], field: str, what: str) -> int:
    """A query position from an index or a token's text (the piece, or the piece without its ▁)."""
    text = str(value).strip()
    # ASCII digits only: "²" is a digit to str.isdigit, not to int
    if re.fullmatch(r"-?[0-9]+", text):
        i = int(text) if len(text) < 19 else None  # int() refuses over 4300 digits
        if i is None or not 0 <= i < len(tokens):
            shown = text if len(text) < 19 else text[:16] + "..."
            raise ExplainError(field, f"{shown} is out of range: the {what} has {len(tokens)} "
                               f"tokens (0-{len(tokens) - 1})")
        return i
    for match in (lambda t: t == text, lambda t: t.lstrip("▁") == text.lstrip("▁")):
        found = [i for i, t in enumerate(tokens) if match(t)]
        if found:
            return found[0]
    raise ExplainError(field, f"{text!r} is not a token of the {what}: {' '.join(tokens)}")


def check(model: Seq2Seq, text: str, kind: str, layer: int, head: int) -> str:
    """The attention map's name of `kind` (encoder, decoder or cross), after checking what can be
    checked before translating: the sentence, the model's kind, layer and head in range (else
    ExplainError)."""
    if not text.strip():
        raise ExplainError("text", "the sentence is empty")
    if kind not in KINDS and kind not in KINDS.values():
        raise ExplainError("kind", f"{kind!r} is not one of encoder, decoder, cross")
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, TransformerConfig):  # an imported Transformer (a subclass) too
        raise ExplainError("checkpoint", "explain recomputes a Transformer's attention, not "
                           f"{cfg.kind}'s additive attention (its weights: `attn-mt serve`'s page)")
    if not 1 <= layer <= cfg.n_layers:
        raise ExplainError("layer", f"{layer} is out of range: the model has {cfg.n_layers} layers "
                           f"(1-{cfg.n_layers})")
    if not 1 <= head <= cfg.n_heads:
        raise ExplainError("head", f"{head} is out of range: the model has {cfg.n_heads} heads "
                           f"(1-{cfg.n_heads})")
    return KINDS.get(kind, kind)


@torch.inference_mode()
def explain(model: Seq2Seq, tok: Tokenizer, text: str, *, kind: str = "cross", layer: int = 1,
            head: int = 1, token: int | str = 0, dcfg: DecodeConfig,
            device: torch.device | str = "cpu") -> Explanation:
    """Translate `text` with `dcfg` (beam_size 1: greedy) and explain head `head` of layer `layer`
    of `kind` (encoder, decoder or cross) for query `token`: its position (from 0) or its text; a
    decoder query is named by the token it predicts (explanation.py's query_name)."""
    kind = check(model, text, kind, layer, head)
    stack = model.encoder if kind == "encoder_self" else model.decoder
    attn = stack[layer - 1].cross_attn if kind == "cross" else stack[layer - 1].self_attn
    calls: list[dict] = []  # the forward pass translation makes: the decoder a token at a time
    f = translate_then_force(model, tok, text, dcfg, device, stepwise=True,
                             watch=recording(attn, calls))
    src_tokens, tgt_in, predicted = f.source_tokens, f.target_in, f.predicted
    queries, keys = {"encoder_self": (src_tokens, src_tokens), "decoder_self": (predicted, tgt_in),
                     "cross": (predicted, src_tokens)}[kind]
    i = _pick(token, queries, "token", "source" if kind == "encoder_self"
              else "translation (with </s>)")
    call = gather(attn, calls)
    r = recompute(attn, call, 0, i)
    h = head - 1
    contribution = (r.weights[h, :, None] * r.v[h]).norm(dim=-1)  # (S,)
    rows = [Key(j, t, _g(r.scores[h, j]), _g(r.scaled[h, j]), not bool(r.allowed[j]),
                _g(r.weights[h, j]), _g(contribution[j])) for j, t in enumerate(keys)]
    model_output = call.output[0, i]
    return Explanation(
        kind=kind, layer=layer, head=head, source=text.strip(), translation=f.translation,
        source_tokens=src_tokens, target_tokens=predicted, query_index=i, query_token=queries[i],
        query_input=src_tokens[i] if kind == "encoder_self" else tgt_in[i],
        d_model=attn.d_model, n_heads=attn.n_heads, d_k=attn.d_k, scale=1 / math.sqrt(attn.d_k),
        x=_floats(call.x[0, i]), q=_floats(r.q[h]), keys=rows, k=_floats(r.k[h]), v=_floats(r.v[h]),
        head_output=_floats(r.heads[h]), head_outputs=_floats(r.heads), output=_floats(r.output),
        model_output=_floats(model_output),
        max_abs_diff=float((r.output - model_output).abs().max()))
