"""One head's attention for one query token, step by step, recomputed from the model's own weights.

The model translates the sentence (greedy unless a beam is asked for), then runs source and output
once more the way translation does: the encoder once, the decoder a token at a time with its
`DecoderCache`. A forward hook on the chosen attention module records what it was given and what it
returned (the hook exists only while `explain` runs). From the module's weights we then redo the five
steps for the chosen query: q = x W_q, k_j = c_j W_k, v_j = c_j W_v (c = x for self-attention, the
encoder's memory for cross-attention); the scores q . k_j; divided by sqrt(d_k); masked (padding, the
decoder's future) and softmaxed into weights; the weighted sum of the values. Then every head's output
for that query, concatenated and multiplied by W_o, is compared with the module's own output.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig
from attn_mt.config.files import write_atomic
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.attention_maps import translate_then_force
from attn_mt.errors import InputError
from attn_mt.models import Seq2Seq
from attn_mt.models.attention import CrossAttention, MultiHeadAttention, SelfAttention, causal_mask, rotate

KINDS = {"encoder": "encoder_self", "decoder": "decoder_self", "cross": "cross"}  # flag -> attention map name


class ExplainError(InputError):
    """A request `explain` cannot answer; `field` names the argument at fault (layer, head, token, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Call:
    """What one attention module was given and returned during a forward pass (all decoder steps together)."""

    x: Tensor  # (B, T, D) the queries' inputs
    context: Tensor  # (B, S, D) the keys' and values' inputs: x itself for self-attention, the memory for cross
    mask: Tensor  # (B, T, S) bool, True = may attend: padding and, in decoder self-attention, the future
    output: Tensor  # (B, T, D) the module's own output


@contextmanager
def recording(attn: MultiHeadAttention, calls: list[dict] | None = None) -> Iterator[list[dict]]:
    """Record every call of `attn` (its arguments by name and its output) while the block runs, into `calls`."""
    calls = [] if calls is None else calls
    signature = inspect.signature(attn.forward)

    def hook(module, args, kwargs, output) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append({**bound.arguments, "output": output[0]})

    handle = attn.register_forward_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def gather(attn: MultiHeadAttention, calls: list[dict]) -> Call:
    """One `Call` from the recorded calls of a forward pass: decoder steps are joined along T."""
    x = torch.cat([c["x"] for c in calls], dim=1)  # (B, T, D)
    output = torch.cat([c["output"] for c in calls], dim=1)
    b, t, _ = x.shape
    context = x if isinstance(attn, SelfAttention) else calls[0]["context"]  # (B, S, D)
    mask = calls[0]["mask"]
    s = context.size(1)
    allowed = torch.ones(b, t, s, dtype=torch.bool, device=x.device) if mask is None else mask[:, 0].expand(b, t, s)
    if calls[0].get("causal"):  # with a cache the steps' queries are positions 0..T-1 of the keys
        allowed = allowed & causal_mask(t, s, x.device)
    return Call(x, context, allowed, output)


def projections(attn: MultiHeadAttention) -> list[tuple[Tensor, Tensor]]:
    """[(W_q, b_q), (W_k, b_k), (W_v, b_v)] of a module, each weight (D, D) as nn.Linear keeps it (out, in)."""
    if isinstance(attn, SelfAttention):
        p = attn.qkv_proj
        return list(zip(p.weight.chunk(3), p.bias.chunk(3), strict=True))
    assert isinstance(attn, CrossAttention)
    kv = attn.kv_proj
    return [(attn.q_proj.weight, attn.q_proj.bias), *zip(kv.weight.chunk(2), kv.bias.chunk(2), strict=True)]


@dataclass(frozen=True)
class Recomputed:
    """The five steps for one query of one batch row, every head at once (H heads, S keys, Dh = d_k)."""

    q: Tensor  # (H, Dh)
    k: Tensor  # (H, S, Dh)
    v: Tensor  # (H, S, Dh)
    scores: Tensor  # (H, S) q . k
    scaled: Tensor  # (H, S) q . k / sqrt(d_k)
    allowed: Tensor  # (S,) bool, False where a mask removes the key
    weights: Tensor  # (H, S) softmax over the allowed keys
    heads: Tensor  # (H, Dh) each head's output, sum_j w_j v_j
    output: Tensor  # (D,) W_o [head_1; ...; head_H] + b_o


def recompute(attn: MultiHeadAttention, call: Call, row: int, query: int) -> Recomputed:
    """Redo `attn` for query `query` of batch row `row` from its weights and the inputs in `call`."""
    h, dh = attn.n_heads, attn.d_head
    (wq, bq), (wk, bk), (wv, bv) = projections(attn)
    x, context = call.x[row, query], call.context[row]  # (D,), (S, D)
    q = attn.q_norm((wq @ x + bq).view(h, dh))  # (H, Dh); q_norm, k_norm: identity unless model.qk_norm
    k = attn.k_norm((context @ wk.T + bk).view(-1, h, dh).transpose(0, 1))  # (H, S, Dh)
    v = (context @ wv.T + bv).view(-1, h, dh).transpose(0, 1)  # (H, S, Dh)
    if getattr(attn, "rotary", False):  # self-attention turned by positions: the query at `query`, keys at 0..S-1
        q = rotate(q[:, None], torch.tensor([query]))[:, 0]
        k = rotate(k, torch.arange(k.size(1)))
    scores = (k @ q[:, :, None]).squeeze(-1)  # (H, S)
    scaled = scores / math.sqrt(dh)
    allowed = call.mask[row, query]  # (S,)
    weights = scaled.masked_fill(~allowed, float("-inf")).softmax(-1)  # (H, S)
    heads = (weights[:, None] @ v).squeeze(1)  # (H, Dh)
    output = attn.out_proj.weight @ heads.reshape(-1) + attn.out_proj.bias  # (D,)
    return Recomputed(q, k, v, scores, scaled, allowed, weights, heads, output)


@dataclass(frozen=True)
class Key:
    """One key token as the query's head sees it."""

    index: int
    token: str
    score: float  # q . k
    scaled: float  # q . k / sqrt(d_k)
    masked: bool  # removed by a mask (padding, or the decoder's future): weight 0
    weight: float  # after softmax; the weights of the unmasked keys sum to 1
    contribution: float  # |w v|: how much of the head's output comes from this key's value


@dataclass(frozen=True)
class Explanation:
    """Everything `attn-mt explain` prints, with every vector; layers and heads count from 1, tokens from 0."""

    kind: str  # "encoder_self", "decoder_self" or "cross", as in the attention maps
    layer: int
    head: int
    source: str
    translation: str
    source_tokens: list[str]  # with </s>
    target_tokens: list[str]  # the prediction with </s>: query t of the decoder predicts target_tokens[t]
    query_index: int
    query_token: str  # the query's token on the maps' axis: a source token, or the target token it predicts
    query_input: str  # the token read at the query's position (decoder: <s> and the prediction)
    d_model: int
    n_heads: int
    d_k: int
    scale: float  # 1 / sqrt(d_k)
    x: list[float]  # (D) the query's input to the module (after the sublayer's LayerNorm when pre-norm)
    q: list[float]  # (d_k) this head's query
    keys: list[Key]
    k: list[list[float]]  # (S, d_k) this head's keys
    v: list[list[float]]  # (S, d_k) this head's values
    head_output: list[float]  # (d_k) sum_j weight_j v_j
    head_outputs: list[list[float]]  # (H, d_k) every head's output for this query
    output: list[float]  # (D) W_o [head_1; ...; head_H] + b_o, recomputed
    model_output: list[float]  # (D) the module's own output for this query
    max_abs_diff: float  # max |output - model_output|

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    def save_json(self, path: str | Path) -> Path:
        """Every number of the explanation as JSON, written atomically."""
        write_atomic(Path(path), self.to_json() + "\n")
        return Path(path)

    def __str__(self) -> str:
        return render(self)

    def _repr_html_(self) -> str:  # a notebook shows the five steps (views.py loads only when drawn)
        from .views import explanation_html

        return explanation_html(self)

    def save_html(self, path: Path | str) -> Path:
        """The five steps as an HTML page that opens from disk."""
        from .views import explanation_html, save_html

        return save_html(explanation_html(self), path, f"attn-mt explain: {self.kind} {self.layer}.{self.head}")


def _g(x: float | Tensor) -> float:
    return float(f"{float(x):.7g}")  # float32's 7 significant digits, without the float64 tail


def _floats(t: Tensor) -> list:
    """A vector (D,) or matrix (N, D) as Python floats."""
    out = t.detach().double().cpu().tolist()
    return [[_g(x) for x in row] for row in out] if t.dim() > 1 else [_g(x) for x in out]


def _pick(value: int | str, tokens: list[str], field: str, what: str) -> int:
    """A query position from an index or a token's text (the piece, or the piece without its ▁)."""
    text = str(value).strip()
    if re.fullmatch(r"-?[0-9]+", text):  # ASCII digits only: "²" is a digit to str.isdigit, not to int
        i = int(text) if len(text) < 19 else None  # int() refuses over 4300 digits
        if i is None or not 0 <= i < len(tokens):
            shown = text if len(text) < 19 else text[:16] + "..."
            raise ExplainError(field, f"{shown} is out of range: the {what} has {len(tokens)} tokens "
                                      f"(0-{len(tokens) - 1})")
        return i
    for match in (lambda t: t == text, lambda t: t.lstrip("▁") == text.lstrip("▁")):
        found = [i for i, t in enumerate(tokens) if match(t)]
        if found:
            return found[0]
    raise ExplainError(field, f"{text!r} is not a token of the {what}: {' '.join(tokens)}")


def check(model: Seq2Seq, text: str, kind: str, layer: int, head: int) -> str:
    """The attention map's name of `kind` (encoder, decoder or cross), after checking what can be checked
    before translating: the sentence, the model's kind, layer and head in range (else ExplainError)."""
    if not text.strip():
        raise ExplainError("text", "the sentence is empty")
    if kind not in KINDS and kind not in KINDS.values():
        raise ExplainError("kind", f"{kind!r} is not one of encoder, decoder, cross")
    cfg = getattr(model, "cfg", None)
    if getattr(cfg, "kind", None) != "transformer":
        raise ExplainError("checkpoint", f"explain recomputes a Transformer's attention, not {cfg.kind}'s "
                                         "additive attention (its weights: `attn-mt serve`'s page)")
    if not 1 <= layer <= cfg.n_layers:
        raise ExplainError("layer", f"{layer} is out of range: the model has {cfg.n_layers} layers (1-{cfg.n_layers})")
    if not 1 <= head <= cfg.n_heads:
        raise ExplainError("head", f"{head} is out of range: the model has {cfg.n_heads} heads (1-{cfg.n_heads})")
    return KINDS.get(kind, kind)


@torch.inference_mode()
def explain(model: Seq2Seq, tok: Tokenizer, text: str, *, kind: str = "cross", layer: int = 1, head: int = 1,
            token: int | str = 0, dcfg: DecodeConfig, device: torch.device | str = "cpu") -> Explanation:
    """Translate `text` with `dcfg` (beam_size 1: greedy) and explain head `head` of layer `layer` of `kind`
    (encoder, decoder or cross) for query `token`: its position (from 0) or its text."""
    kind = check(model, text, kind, layer, head)
    stack = model.encoder if kind == "encoder_self" else model.decoder
    attn = stack[layer - 1].cross_attn if kind == "cross" else stack[layer - 1].self_attn
    calls: list[dict] = []  # the forward pass translation makes: the decoder a token at a time
    f = translate_then_force(model, tok, text, dcfg, device, stepwise=True, watch=recording(attn, calls))
    src_tokens, tgt_in, predicted = f.source_tokens, f.target_in, f.predicted
    queries, keys = {"encoder_self": (src_tokens, src_tokens), "decoder_self": (predicted, tgt_in),
                     "cross": (predicted, src_tokens)}[kind]
    i = _pick(token, queries, "token", "source" if kind == "encoder_self" else "translation (with </s>)")
    call = gather(attn, calls)
    r = recompute(attn, call, 0, i)
    h = head - 1
    contribution = (r.weights[h, :, None] * r.v[h]).norm(dim=-1)  # (S,)
    rows = [Key(j, t, _g(r.scores[h, j]), _g(r.scaled[h, j]), not bool(r.allowed[j]), _g(r.weights[h, j]),
                _g(contribution[j])) for j, t in enumerate(keys)]
    model_output = call.output[0, i]
    return Explanation(
        kind=kind, layer=layer, head=head, source=text.strip(), translation=f.translation,
        source_tokens=src_tokens, target_tokens=predicted, query_index=i, query_token=queries[i],
        query_input=src_tokens[i] if kind == "encoder_self" else tgt_in[i],
        d_model=attn.d_model, n_heads=attn.n_heads, d_k=attn.d_head, scale=1 / math.sqrt(attn.d_head),
        x=_floats(call.x[0, i]), q=_floats(r.q[h]), keys=rows, k=_floats(r.k[h]), v=_floats(r.v[h]),
        head_output=_floats(r.heads[h]), head_outputs=_floats(r.heads), output=_floats(r.output),
        model_output=_floats(model_output), max_abs_diff=float((r.output - model_output).abs().max()))


NAMES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
         "cross": "cross-attention"}


def _vec(xs: list[float], n: int = 6) -> str:
    """[+0.123 -0.456 ...] |v| = 1.23: the first n components and the norm."""
    head = " ".join(f"{x:+.3f}" for x in xs[:n])
    return f"[{head}{' ...' if len(xs) > n else ''}]  |.| = {math.sqrt(sum(x * x for x in xs)):.3f}"


def render(e: Explanation, top: int = 5) -> str:
    """The explanation for an 80-column terminal: the five steps, then the heads and W_o."""
    context = {"encoder_self": "c = x, the source positions", "decoder_self": "c = x, the target positions",
               "cross": "c = the encoder's output"}[e.kind]
    masked = "future" if e.kind == "decoder_self" else "padding"
    reads = "" if e.query_input == e.query_token else f", reading {e.query_input!r}"
    lines = [
        *textwrap.wrap(f"{NAMES[e.kind]}, layer {e.layer}, head {e.head} of {e.n_heads}: query {e.query_index} "
                       f"{e.query_token!r}{reads}", 80, subsequent_indent="  "),
        *textwrap.wrap(f"source       {e.source}", 80, subsequent_indent=" " * 13),
        *textwrap.wrap(f"translation  {e.translation}", 80, subsequent_indent=" " * 13),
        f"d_model {e.d_model} = {e.n_heads} heads x d_k {e.d_k}; scores are divided by sqrt({e.d_k}) = "
        f"{1 / e.scale:.3g}",
        "",
        f"1. q = x W_q (x: the query's {e.d_model}-number input); k_j = c_j W_k, v_j = c_j W_v",
        f"   ({context}); this head's {e.d_k} columns of each:",
        f"   q = {_vec(e.q)}",
        "2. scores q.k_j   3. divided by sqrt(d_k)   4. masked, softmax -> weights",
        "    j  key                 q.k  /sqrt(d_k)  weight",
    ]
    hidden = [k for k in e.keys if k.masked]
    for k in e.keys:
        if not k.masked:
            lines.append(f"  {k.index:3d}  {k.token[:14]:14s} {k.score:8.3f}  {k.scaled:9.3f}  {k.weight:6.3f} "
                         f"{'#' * round(20 * k.weight)}")
        elif len(hidden) <= 3:
            lines.append(f"  {k.index:3d}  {k.token[:14]:14s} {k.score:8.3f}  {k.scaled:9.3f}  masked ({masked})")
        elif k is hidden[0]:  # the future is a long run of keys: one line
            lines.append(f"  {k.index:3d}-{hidden[-1].index}: {len(hidden)} keys masked ({masked}), weight 0")
    lines += ["5. output = sum_j weight_j v_j; the largest contributions |weight_j v_j|:"]
    for k in sorted((k for k in e.keys if not k.masked), key=lambda k: -k.contribution)[:top]:
        lines.append(f"  {k.index:3d}  {k.token[:14]:14s} weight {k.weight:.3f} x |v| "
                     f"{math.sqrt(sum(x * x for x in e.v[k.index])):.3f} = {k.contribution:.3f}")
    norms = " ".join(f"{math.sqrt(sum(x * x for x in o)):.3f}" for o in e.head_outputs)
    lines += [
        f"   head {e.head}'s output = {_vec(e.head_output, 5)}",
        "",
        f"All {e.n_heads} heads' outputs for this query (|o_h|: {norms}),",
        f"concatenated ({e.n_heads} x {e.d_k} = {e.d_model}) and projected: W_o [o_1; ...; o_{e.n_heads}] + b_o",
        f"   recomputed   {_vec(e.output, 5)}",
        f"   the model's  {_vec(e.model_output, 5)}",
        f"   max |recomputed - model| = {e.max_abs_diff:.1e}",
    ]
    return "\n".join(line.rstrip() for line in lines)
