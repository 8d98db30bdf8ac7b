"""The `Model`'s analyses of attention (its methods, defined here so that model.py stays about translation):
every map of a sentence (`attention`, for its translation or a given target), one head's five steps
(`explain`), what masking each head costs (`heads`), and a model without the heads that matter least (`prune`).

Thread safety (sharing.py): `attention` reads the module as translation does; `explain` records it with a hook
and runs alone; `heads` and `prune` measure a copy, so translations elsewhere never see a masked head.

One job: the analysis methods and their arguments; analysis/ does the work. Tested in tests/api/test_model.py,
tests/api/test_arguments.py and tests/api/test_threads.py.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from attn_mt.config import DecodeConfig
from attn_mt.errors import AttnMTError, InputError, ModelError

from . import checks
from .sharing import Shared

if TYPE_CHECKING:
    from attn_mt.analysis.explanation import Explanation
    from attn_mt.analysis.overview import HeadsReport
    from attn_mt.decoding.contrastive import Item
    from attn_mt.decoding.translator import Translator

    from .attention import Attention
    from .steering import Steer

Lines = Iterable[str] | os.PathLike
Items = str | os.PathLike | Iterable["Item"]


def pairs(sources: Lines, refs: Lines) -> tuple[list[str], list[str]]:
    """Sentences and their references (iterables or files), as many of each and at least one."""
    srcs, references = checks.texts(sources, "sources")[0], checks.texts(refs, "refs")[0]
    if len(srcs) != len(references):
        files = isinstance(sources, os.PathLike) and isinstance(refs, os.PathLike)
        raise InputError(f"line counts differ: {sources} has {len(srcs)} lines, {refs} has {len(references)}"
                         if files else f"{len(references)} references for {len(srcs)} sources", "refs")
    if not srcs:
        where = f"{sources}: no lines" if isinstance(sources, os.PathLike) else "no sentences"
        raise InputError(f"{where} to measure on", "sources")
    return srcs, references


def contrastive_items(items: Items) -> list[Item]:
    """A contrastive set from a file (decoding/contrastive.py reads ours and ContraPro's) or `Item`s."""
    from attn_mt.decoding.contrastive import Item, read_items

    if isinstance(items, str | os.PathLike):
        try:
            return read_items(Path(items) if isinstance(items, os.PathLike) else items)
        except AttnMTError as e:
            raise e.naming("contrastive") from None
    found = list(items) if isinstance(items, Iterable) else []
    if not found or not all(isinstance(i, Item) for i in found):
        raise InputError("expected a file or a non-empty iterable of contrastive Items", "contrastive")
    return found


class Analyses:
    """The analysis methods of `Model` (model.py), and the state both read: its Translator, the lock."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.shared = Shared()  # translations side by side; explain and `to` alone
        self.report: HeadsReport | None = None  # a pruned model's (`prune`)

    path: Path
    module: Any
    config: Any
    tokenizer: Any
    info: dict
    decode: DecodeConfig

    options: Callable[..., DecodeConfig]  # model.py's

    def _transformer(self, what: str, any_kind: bool = False):
        """The PyTorch module, or ModelError saying why `what` cannot run on this model."""
        if self.module is None:
            raise ModelError(f"{self.path}: a CTranslate2 export keeps no PyTorch weights to {what}; give a "
                             "checkpoint file written by `attn-mt train`, e.g. RUN/checkpoint_best.pt", "path")
        if self.config.model.kind != "transformer" and what == "heads" and not any_kind:
            raise ModelError(f"{self.path}: an {self.config.model.kind.upper()} model; {what} needs a Transformer "
                             "(the RNN has one additive attention, no heads)", "path")
        return self.module

    def attention(self, text: str, *, target: str | None = None, beam: int | None = None) -> Attention:
        """Translate `text` (or, with `target`, take that as its translation, teacher-forced) and return every
        attention map (an `Attention`: tokens and each layer's weights, (heads, queries, keys), for encoder,
        decoder and cross attention); shows itself in a notebook.

        >>> att = model.attention("the old man sees a small dog.")
        >>> att.weights("cross", layer=1, head=2)  # (target tokens, source tokens), rows sum to 1
        >>> model.attention("the old man sees a small dog.", target="der alte Mann sieht einen kleinen Hund.")
        """
        from .steering import Steer

        text = checks.text(text, "text")
        if target is not None:
            target = checks.text(target, "target", empty=True)
        return self._attention(text, self.options(beam=beam, nbest=1), target, Steer())

    def _attention(self, text: str, dcfg: DecodeConfig, target: str | None, steer: Steer) -> Attention:
        return self._attentions([text], dcfg, steer, target)[0]

    def _attentions(self, items: list[str], dcfg: DecodeConfig, steer: Steer,
                    target: str | None = None) -> list[Attention]:
        """Each text's translation and maps: `target` teacher-forced, or the texts decoded as `translate`
        decodes them (batched, `steer`), each one's maps teacher-forced on the very ids its decode gave."""
        from attn_mt.decoding.attention_maps import attention_maps

        from . import steering
        from .attention import Attention

        model = self._transformer("draw")
        if any(not text.strip() for text in items):
            raise InputError("a text is empty: attention needs a sentence", "texts")
        ids: dict[int, list[int]] = {}
        with self.shared.reading():
            if target is None:
                steering.translate_nbest(self.translator, items, dcfg, steer, ids)
            found = [attention_maps(model, self.tokenizer, text, dcfg, self.translator.device, target=target,
                                    target_ids=ids.get(i)) for i, text in enumerate(items)]
        return [Attention(text.strip(), translation, maps)
                for text, (translation, maps) in zip(items, found, strict=True)]

    def explain(self, text: str, *, kind: str = "cross", layer: int = 1, head: int = 1, token: int | str = 0,
                beam: int = 1) -> Explanation:
        """One head's attention for one query token, step by step, recomputed from the weights (an
        `Explanation`: q, k, v, scores, scaled, weights, the head's output, W_o and the check against the
        model's own output); layers and heads count from 1. `token` is the query: its position (from 0) or its
        text. A decoder or cross query is named by the token it predicts (it reads the token before), as the
        attention maps' rows are: `token="Hund"` and `token=k`, where `target_tokens[k]` is "▁Hund", pick the same.

        >>> e = model.explain("the old man sees a small dog.", kind="encoder", layer=1, head=2, token="dog")
        >>> e.max_abs_diff < 1e-4
        """
        from attn_mt.analysis.explain import ExplainError, explain

        model = self._transformer("explain")
        text = checks.text(text, "text")
        if not isinstance(kind, str):
            raise ExplainError("kind", f"expected one of encoder, decoder, cross, not {kind!r}")
        for value, name in ((layer, "layer"), (head, "head"), (beam, "beam")):
            checks.integer(value, name, least=None)  # types here; ranges as explain's own (the model's sizes)
        if isinstance(token, bool) or not isinstance(token, int | str):
            raise InputError(f"expected a position (an integer from 0) or a token's text, not {token!r}", "token")
        try:
            dcfg = replace(self.decode, beam_size=beam, nbest=1)
        except AttnMTError:
            raise ExplainError("beam", f"must be an integer from 1 to 1000, not {beam!r}") from None
        with self.shared.writing():  # its hook would record other threads' calls
            return explain(model, self.tokenizer, text, kind=kind, layer=int(layer), head=int(head), token=token,
                           dcfg=dcfg, device=self.translator.device)

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
        return self._heads(sources, refs, sentences, 0, contrastive)[0]

    def prune(self, n: int, sources: Lines, refs: Lines, *, sentences: int = 200,
              out: str | os.PathLike | None = None) -> Self:
        """A new model without the `n` heads that matter least (each removal re-measured on the first
        `sentences` pairs), its `.report` the HeadsReport; with `out`, also written there as a checkpoint
        every command takes. This model is left as it was.

        >>> smaller = model.prune(2, Path("runs/toy/test.en"), Path("runs/toy/test.de"), out="pruned.pt")
        """
        from attn_mt import checkpoint
        from attn_mt.analysis.pruned import pruned_state
        from attn_mt.decoding.translator import model_translator
        from attn_mt.files import check_outputs

        checks.integer(n, "n")
        if out is not None:
            out = checks.path(out, "out")
        check_outputs([("out", None if out is None else Path(out), (".pt",))], [self.path])  # before any work
        report, model, gone = self._heads(sources, refs, sentences, n)
        state = pruned_state(model, self._state(), gone, self.path.name)
        path = Path(out) if out is not None else self.path.with_name(f"{self.path.stem}.pruned{n}.pt")
        if out is not None:
            checkpoint.save(state, path)
            report.out = str(path)
        pruned = type(self)(model_translator(model, self.config, self.tokenizer, self.translator.device, path, state))
        pruned.report = report
        return pruned

    def _state(self) -> dict:
        """What a checkpoint written from this model keeps: config, tokenizer, step, the pruned heads."""
        from attn_mt.checkpoint import model_state

        info = {k: v for k, v in self.info.items() if v is not None and k != "pruned_from"}
        return {**info, **model_state({}, self.config, self.tokenizer)}

    def _heads(self, sources: Lines | None, refs: Lines | None, sentences: int, prune_n: int,
               contrastive: Items | None = None):
        from attn_mt.analysis.heads import analyse
        from attn_mt.analysis.pruned import pruned_heads

        self._transformer("heads")
        checks.integer(sentences, "sentences")
        items = contrastive_items(contrastive) if contrastive is not None else []
        if (sources is None) != (refs is None):
            raise InputError("`sources` and `refs` go together: the sentences and their references", "refs")
        if sources is None or refs is None:
            if not items:
                raise InputError("give `sources` and `refs`, or a `contrastive` set to measure on", "sources")
            sources, refs = [i.src for i in items], [i.ref for i in items]
        srcs, references = pairs(sources, refs)
        with self.shared.reading():  # masking sets head_mask: on a copy, never on the module others use
            model = copy.deepcopy(self.module)
        before = pruned_heads(self.info.get("pruned_heads") or [], model, self.path)
        report, gone = analyse(model, self.config, self.tokenizer, srcs, references, name=str(self.path),
                               before=before, n_sentences=sentences, prune_n=prune_n, device=self.translator.device,
                               items=items)
        return report, model, gone
