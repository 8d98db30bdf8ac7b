"""An explanation as text for an 80-column terminal.

What `attn-mt explain` prints, `str(explanation)` gives and a view shows without scripts (views.py).
Tested in tests/analysis/test_explain.py and tests/analysis/test_views.py.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .explain import Explanation

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
