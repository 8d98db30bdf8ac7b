"""The `Model`'s methods that look inside it (model.py's `Model` inherits them): every attention map of a
sentence (`attention`), one head's steps recomputed (`explain`), what each head costs (`heads`), and a model
without the heads that matter least (`prune`). analyses.py does their work, under the model's locks.

Tested in tests/api/test_model.py, tests/api/test_arguments.py and tests/api/test_threads.py.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Self

from attn_mt.data import checks

if TYPE_CHECKING:
    from attn_mt.analysis.explanation import Explanation
    from attn_mt.analysis.overview import HeadsReport

    from .analyses import Items, Lines
    from .attention import Attention


class Inspection:
    """Attention, explain, heads and prune for a `Model` (which gives `options`, `_transformer` and
    its translator)."""

    def attention(self, text: str, *, target: str | None = None, beam: int | None = None) -> Attention:
        """Translate `text` (or, with `target`, take that as its translation, teacher-forced) and return every
        attention map (an `Attention`: tokens and each layer's weights, (heads, queries, keys), for encoder,
        decoder and cross attention); shows itself in a notebook.

        >>> att = model.attention("the old man sees a small dog.")
        >>> att.weights("cross", layer=1, head=2)  # (target tokens, source tokens), rows sum to 1
        >>> model.attention("the old man sees a small dog.", target="der alte Mann sieht einen kleinen Hund.")
        """
        text = checks.text(text, "text")
        if target is not None:
            target = checks.text(target, "target", empty=True)
        from . import analyses

        dcfg = self.options(beam=beam, nbest=1)
        return analyses.attentions(self, [text], dcfg, None, target)[0]

    def explain(self, text: str, *, kind: str = "cross", layer: int = 1, head: int = 1, token: int | str = 0,
                beam: int = 1) -> Explanation:
        """One head's attention for one query token, step by step, recomputed from the weights (an
        `Explanation`: q, k, v, scores, scaled, weights, the head's output, W_o and the check against the
        model's own output); layers and heads count from 1. `token` is the query: its position (from 0) or its
        text. A decoder or cross query is named by the token it predicts (its input is the token before), as the
        attention maps' rows are: `token="Hund"` and `token=k`, where `target_tokens[k]` is "▁Hund", pick the same.

        >>> e = model.explain("the old man sees a small dog.", kind="encoder", layer=1, head=2, token="dog")
        >>> e.max_abs_diff < 1e-4
        """
        from . import analyses

        return analyses.explain(self, text, kind, layer, head, token, beam)

    def heads(self, sources: Lines | None = None, refs: Lines | None = None, *, sentences: int = 200,
              contrastive: Items | None = None) -> HeadsReport:
        """Mask each attention head in turn on the first `sentences` pairs: the BLEU (greedy) and loss it
        costs and where its attention goes (a `HeadsReport`; `.table()` prints it, a notebook draws it). With a
        `contrastive` set (a file or `Item`s, as `contrastive` takes) also which heads resolve the pronoun
        (analysis/coref.py) and the contrastive accuracy each one's masking costs; its sources and references
        are the sentences when `sources` and `refs` are not given. Measured on a copy of the module.

        >>> report = model.heads(Path("runs/toy/test.en"), Path("runs/toy/test.de"), sentences=50)
        >>> report = model.heads(contrastive="runs/pronoun/test.contrastive.jsonl")
        """
        from . import analyses

        return analyses.heads(self, sources, refs, sentences, 0, contrastive)[0]

    def prune(self, n: int, sources: Lines, refs: Lines, *, sentences: int = 200,
              out: str | os.PathLike | None = None) -> Self:
        """A new model without the `n` heads that matter least (each removal re-measured on the first
        `sentences` pairs), its `.report` the HeadsReport; with `out`, also written there as a checkpoint
        every command takes. This model is left as it was.

        >>> smaller = model.prune(2, Path("runs/toy/test.en"), Path("runs/toy/test.de"), out="pruned.pt")
        """
        from . import analyses

        translator, report = analyses.prune(self, n, sources, refs, sentences, out)
        pruned = type(self)(translator)
        pruned.report = report
        return pruned
