"""The `Model`'s methods that look inside it (model.py's `Model` inherits them): every attention map
of a sentence (`attention`), one head's steps recomputed (`explain`), what each head costs
(`heads`), a model without the heads that matter least (`prune`), and cross-attention read as word
alignment (`align`, `align_report`; aligning.py). analyses.py does their work, under the model's
locks.

Tested in tests/api/test_model.py, tests/api/test_arguments.py and tests/api/test_threads.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, overload

from attn_mt.data import checks
from attn_mt.errors import AttnMTError, InputError, ModelError

if TYPE_CHECKING:
    from attn_mt.analysis.aer import AlignmentReport
    from attn_mt.analysis.explanation import Explanation
    from attn_mt.analysis.overview import HeadsReport
    from attn_mt.decoding.alignment import Alignment

    from .analyses import Items, Lines
    from .attention import Attention


class Inspection:
    """Attention, explain, heads, prune and align for a `Model` (which gives `options`,
    `_transformer`, its translator and device)."""

    def attention(self, text: str, *, target: str | None = None,
                  beam: int | None = None) -> Attention:
        """Translate `text` (or, with `target`, take that as its translation, teacher-forced) and
        return every attention map (an `Attention`: tokens and each layer's weights, (heads,
        queries, keys), for encoder, decoder and cross attention); shows itself in a notebook.

        >>> att = model.attention("the old man sees a small dog.")
        >>> att.weights("cross", layer=1, head=2)  # (target tokens, source tokens), rows sum to 1
        >>> model.attention("the old man sees a small dog.",
        ...                 target="der alte Mann sieht einen kleinen Hund.")
        """
        text = checks.text(text, "text")
        if target is not None:
            target = checks.text(target, "target", empty=True)
        from . import analyses

        dcfg = self.options(beam=beam, nbest=1)
        return analyses.attentions(self, [text], dcfg, None, target)[0]

    def explain(self, text: str, *, kind: str = "cross", layer: int = 1, head: int = 1,
                token: int | str = 0, beam: int = 1) -> Explanation:
        """One head's attention for one query token, step by step, recomputed from the weights (an
        `Explanation`: q, k, v, scores, scaled, weights, the head's output, W_o and the check
        against the model's own output); layers and heads count from 1. `token` is the query: its
        position (from 0) or its text. A decoder or cross query is named by the token it predicts
        (its input is the token before), as the attention maps' rows are: `token="Hund"` and
        `token=k`, where `target_tokens[k]` is "▁Hund", pick the same.

        >>> e = model.explain("the old man sees a small dog.", kind="encoder", layer=1, head=2,
        ...                   token="dog")
        >>> e.max_abs_diff < 1e-4
        """
        from . import analyses

        return analyses.explain(self, text, kind, layer, head, token, beam)

    def heads(self, sources: Lines | None = None, refs: Lines | None = None, *,
              sentences: int = 200, contrastive: Items | None = None) -> HeadsReport:
        """Mask each attention head in turn on the first `sentences` pairs: the BLEU (greedy) and
        loss it costs and where its attention goes (a `HeadsReport`; `.table()` prints it, a
        notebook draws it). With a `contrastive` set (a file or `Item`s, as `contrastive` takes)
        also which heads resolve the pronoun (analysis/coref.py) and the contrastive accuracy each
        one's masking costs; its sources and references are the sentences when `sources` and `refs`
        are not given. Measured on a copy of the module.

        >>> report = model.heads(Path("runs/toy/test.en"), Path("runs/toy/test.de"), sentences=50)
        >>> report = model.heads(contrastive="runs/pronoun/test.contrastive.jsonl")
        """
        from . import analyses

        return analyses.heads(self, sources, refs, sentences, 0, contrastive)[0]

    def prune(self, n: int, sources: Lines, refs: Lines, *, sentences: int = 200,
              out: str | os.PathLike | None = None) -> Self:
        """A new model without the `n` heads that matter least (each removal re-measured on the
        first `sentences` pairs), its `.report` the HeadsReport; with `out`, also written there as a
        checkpoint every command takes. This model is left as it was.

        >>> smaller = model.prune(2, Path("runs/toy/test.en"), Path("runs/toy/test.de"),
        ...                       out="pruned.pt")
        """
        from . import analyses

        translator, report = analyses.prune(self, n, sources, refs, sentences, out)
        pruned = type(self)(translator)
        pruned.report = report
        return pruned

    @overload
    def align(self, sources: str, targets: str, *, method: str | None = ...,  # type: ignore[overload-overlap]
              reverse: Self | str | os.PathLike | None = ...,
              batch_size: int = ...) -> Alignment: ...
    @overload
    def align(self, sources: Iterable[str], targets: Iterable[str], *, method: str | None = ...,
              reverse: Self | str | os.PathLike | None = ...,
              batch_size: int = ...) -> list[Alignment]: ...

    def align(self, sources: str | Iterable[str], targets: str | Iterable[str], *,
              method: str | None = None, reverse: Self | str | os.PathLike | None = None,
              batch_size: int = 64) -> Any:
        """Word alignment of given translations from cross-attention (forced decoding): an
        `Alignment` (the words of each side and the links (source word, target word), from 0;
        `.pharaoh` as text) for one pair, a list for two iterables. `method`: layerL, headL.H,
        shift-..., and with a `reverse` model (target -> source) union:, intersect: or gdf: of both
        directions (docs/alignment.md).

        >>> model.align("the old man sees a small dog.",
        ...             "der alte Mann sieht einen kleinen Hund.").pharaoh
        """
        from . import aligning

        srcs, one = checks.texts(sources, "sources")
        tgts, one_target = checks.texts(targets, "targets")
        if one != one_target or len(srcs) != len(tgts):
            raise InputError(f"{len(tgts)} targets for {len(srcs)} sources: give one target per "
                             "source", "targets")
        if method is not None and not isinstance(method, str):
            raise InputError(f"expected a method's name, not {method!r}", "method")
        checks.integer(batch_size, "batch_size")
        out = aligning.aligned(self, srcs, tgts, method, self._reverse(reverse), batch_size)
        return out[0] if one else out

    def align_report(self, sources: Lines, targets: Lines, gold: str | os.PathLike, *,
                     method: str | None = None, by_head: bool = False,
                     reverse: Self | str | os.PathLike | None = None, one_indexed: bool = False,
                     batch_size: int = 64) -> AlignmentReport:
        """AER, precision and recall of `method` (or, `by_head`, of every layer, head and method)
        against a gold file of Pharaoh lines (`i-j` sure, `ipj` possible; `one_indexed` for files
        counted from 1), line-aligned with `sources` and `targets` (an `AlignmentReport`; `.table()`
        prints it, `.best`).

        >>> model.align_report(Path("runs/toy/test.en"), Path("runs/toy/test.de"),
        ...                    "runs/toy/test.align")
        """
        from . import aligning

        return aligning.report(self, sources, targets, gold, method=method, by_head=by_head,
                               reverse=self._reverse(reverse), one_indexed=one_indexed,
                               batch_size=batch_size)

    def _reverse(self, reverse: Self | str | os.PathLike | None) -> Self | None:
        """The reverse-direction model: given, or opened from a path onto this model's device."""
        if reverse is None or isinstance(reverse, type(self)):
            return reverse
        from .opening import open_translator

        if not isinstance(reverse, str | os.PathLike):
            raise InputError("expected a Model or a checkpoint's path, not "
                             f"{type(reverse).__name__}", "reverse")
        try:
            return type(self)(open_translator(reverse if isinstance(reverse, str)
                                              else Path(reverse), str(self.device), None))
        except AttnMTError as e:
            raise ModelError(e.message, "reverse", named=e.named) from None
