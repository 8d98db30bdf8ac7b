"""One head's attention for one query, step by step (what explain.py finds): every number of it, as
text for an 80-column terminal and as an HTML view (views.py).

The text is what `attn-mt explain` prints, `str(explanation)` gives and the view shows without
scripts. Tested in tests/analysis/test_explain.py and tests/analysis/test_views.py.

Query positions count from 0. An encoder query is the source token at its position. A decoder query
(decoder self-attention and cross-attention) at position t holds the token before (the decoder
input, <s> first; a key at that position is roles.py's *same*, not *prev*) and predicts token t of
the translation; it is named by the token it predicts, as the attention maps' rows are: `token="es"`
and `token=13` pick the same query where token 13 of the translation is "es" (`query_name`).
"""

from __future__ import annotations

import html
import json
import math
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

from attn_mt.data import checks
from attn_mt.files import write_report

from .names import head_name

NAMES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
         "cross": "cross-attention"}



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
    """Everything `attn-mt explain` prints, with every vector; layers and heads count from 1, tokens
    from 0."""

    kind: str  # "encoder_self", "decoder_self" or "cross", as in the attention maps
    layer: int
    head: int
    source: str
    translation: str
    source_tokens: list[str]  # with </s>
    # the prediction with </s>: query t of the decoder predicts target_tokens[t]
    target_tokens: list[str]
    query_index: int
    # the query's token on the maps' axis: a source token, or the target token it predicts
    query_token: str
    query_input: str  # the token read at the query's position (decoder: <s> and the prediction)
    d_model: int
    n_heads: int
    d_k: int
    scale: float  # 1 / sqrt(d_k)
    # (D) the query's input to the module (after the sublayer's LayerNorm when pre-norm)
    x: list[float]
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
        return write_report(checks.path(path), self.to_json() + "\n", "json")

    def __str__(self) -> str:
        return render(self)

    def __repr__(self) -> str:  # short: print() shows every step, `to_json` every number
        return (f"<Explanation {self.kind} layer {self.layer} head {self.head}: {query_name(self)} "
                f"over {len(self.keys)} keys, max_abs_diff {self.max_abs_diff:.1e}>")

    # a notebook shows the five steps (views.py loads only when drawn)
    def _repr_html_(self) -> str:
        return explanation_html(self)

    def save_html(self, path: Path | str) -> Path:
        """The five steps as an HTML page that opens from disk."""
        from .views import save_html

        title = f"attn-mt explain: {head_name(self.kind, self.layer, self.head)}"
        return save_html(explanation_html(self), checks.path(path), title)


def query_name(e: Explanation) -> str:
    """The query as the CLI, the page (views.js's stepsTitle) and the notebook name it: its position
    and token; a decoder query by the token it predicts, then the token it reads."""
    if e.kind == "encoder_self":
        return f"query {e.query_index} {e.query_token!r}"
    return f"query {e.query_index} predicts {e.query_token!r} (it reads {e.query_input!r})"


def _vec(xs: list[float], n: int = 6) -> str:
    """[+0.123 -0.456 ...] |v| = 1.23: the first n components and the norm."""
    head = " ".join(f"{x:+.3f}" for x in xs[:n])
    return f"[{head}{' ...' if len(xs) > n else ''}]  |.| = {math.sqrt(sum(x * x for x in xs)):.3f}"


def render(e: Explanation, top: int = 5) -> str:
    """The explanation for an 80-column terminal: the five steps, then the heads and W_o."""
    context = {"encoder_self": "c = x, the source positions",
               "decoder_self": "c = x, the target positions",
               "cross": "c = the encoder's output"}[e.kind]
    masked = "future" if e.kind == "decoder_self" else "padding"
    title = f"{NAMES[e.kind]}, layer {e.layer}, head {e.head} of {e.n_heads}:"
    lines = [
        # else the query on a line
        *([f"{title} {query_name(e)}"] if len(title) + len(query_name(e)) < 80 else
          [title,
           *textwrap.wrap(query_name(e), 80, initial_indent="  ", subsequent_indent="    ")]),
        *textwrap.wrap(f"source       {e.source}", 80, subsequent_indent=" " * 13),
        *textwrap.wrap(f"translation  {e.translation}", 80, subsequent_indent=" " * 13),
        f"d_model {e.d_model} = {e.n_heads} heads x d_k {e.d_k}; scores are divided by "
        f"sqrt({e.d_k}) = {1 / e.scale:.3g}",
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
            lines.append(f"  {k.index:3d}  {k.token[:14]:14s} {k.score:8.3f}  {k.scaled:9.3f}  "
                         f"{k.weight:6.3f} {'#' * round(20 * k.weight)}")
        elif len(hidden) <= 3:
            lines.append(f"  {k.index:3d}  {k.token[:14]:14s} {k.score:8.3f}  {k.scaled:9.3f}  "
                         f"masked ({masked})")
        elif k is hidden[0]:  # the future is a long run of keys: one line
            lines.append(f"  {k.index:3d}-{hidden[-1].index}: {len(hidden)} keys masked "
                         f"({masked}), weight 0")
    lines += ["5. output = sum_j weight_j v_j; the largest contributions |weight_j v_j|:"]
    for k in sorted((k for k in e.keys if not k.masked), key=lambda k: -k.contribution)[:top]:
        lines.append(f"  {k.index:3d}  {k.token[:14]:14s} weight {k.weight:.3f} x |v| "
                     f"{math.sqrt(sum(x * x for x in e.v[k.index])):.3f} = {k.contribution:.3f}")
    norms = " ".join(f"{math.sqrt(sum(x * x for x in o)):.3f}" for o in e.head_outputs)
    lines += [
        f"   head {e.head}'s output = {_vec(e.head_output, 5)}",
        "",
        f"All {e.n_heads} heads' outputs for this query (|o_h|: {norms}),",
        f"concatenated ({e.n_heads} x {e.d_k} = {e.d_model}) and projected: W_o [o_1; ...; "
        f"o_{e.n_heads}] + b_o", f"   recomputed   {_vec(e.output, 5)}",
        f"   the model's  {_vec(e.model_output, 5)}",
        f"   max |recomputed - model| = {e.max_abs_diff:.1e}",
    ]
    return "\n".join(line.rstrip() for line in lines)


def explanation_html(e: Explanation) -> str:
    """One head's five steps for one query: vectors as strips, scores, scaling, mask and softmax
    weights as bars, the largest contributions, every head's output and W_o's, checked against the
    model's own output (drawn by views.js's drawSteps; the text where scripts do not run)."""
    from .views import view

    return view("explanation", f'<pre class="nojs">{html.escape(render(e))}</pre>',
                "explanationView", asdict(e))
