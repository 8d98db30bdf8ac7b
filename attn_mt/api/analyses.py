"""The work of the `Model`'s analyses of attention (model.py's methods call these functions, so that
model.py stays about translation): every map of a sentence (`attentions`, for its translation or a
given target), one head's five steps (`explain`), what masking each head costs (`heads`), and a
model without the heads that matter least (`prune`).

Thread safety (sharing.py): `attentions` reads the module as translation does; `explain` records it
with a hook and runs alone; `heads` and `prune` measure a copy, so translations elsewhere never see
a masked head.

One job: the analyses' arguments and locks; analysis/ does the work.
Tested in tests/api/test_model.py, tests/api/test_arguments.py and tests/api/test_threads.py.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from attn_mt.data import checks
from attn_mt.errors import AttnMTError, InputError, ModelError

if TYPE_CHECKING:
    from torch import nn

    from attn_mt.analysis.explanation import Explanation
    from attn_mt.analysis.masking import Head
    from attn_mt.analysis.overview import HeadsReport
    from attn_mt.config import DecodeConfig
    from attn_mt.decoding.contrastive import Item
    from attn_mt.decoding.translator import Translator

    from .attention import Attention
    from .sharing import Shared
    from .steering import Steer

Lines = Iterable[str] | os.PathLike  # sentences, or a file of them (a Path)
Items = str | os.PathLike | Iterable["Item"]  # a contrastive set: a file, or `Item`s


def pairs(sources: Lines, refs: Lines) -> tuple[list[str], list[str]]:
    """Sentences and their references (iterables or files), as many of each and at least one."""
    srcs, references = checks.texts(sources, "sources")[0], checks.texts(refs, "refs")[0]
    if len(srcs) != len(references):
        files = isinstance(sources, os.PathLike) and isinstance(refs, os.PathLike)
        raise InputError(f"line counts differ: {sources} has {len(srcs)} lines, {refs} has "
                         f"{len(references)}" if files else f"{len(references)} references for "
                         f"{len(srcs)} sources", "refs")
    if not srcs:
        where = f"{sources}: no lines" if isinstance(sources, os.PathLike) else "no sentences"
        raise InputError(f"{where} to measure on", "sources")
    return srcs, references


def contrastive_items(items: Items) -> list[Item]:
    """A contrastive set from a file (decoding/contrastive.py reads ours and ContraPro's) or
    `Item`s."""
    from attn_mt.decoding.contrastive import Item, read_items

    if isinstance(items, str | os.PathLike):
        try:
            return read_items(Path(items) if isinstance(items, os.PathLike) else items)
        except AttnMTError as e:
            raise e.naming("contrastive") from None
    found = list(items) if isinstance(items, Iterable) else []
    if not found or not all(isinstance(i, Item) for i in found):
        raise InputError("expected a file or a non-empty iterable of contrastive Items",
                         "contrastive")
    return found


class Loaded(Protocol):
    """What the analyses use of a `Model` (model.py): its Translator, read where it is used
    (`Model.to` may replace it between two calls), and the lock its threads share."""

    translator: Translator
    shared: Shared


def transformer(model: Loaded, what: str, any_kind: bool = False) -> nn.Module:
    """The PyTorch module, or ModelError saying why `what` cannot run on this model."""
    t = model.translator
    if t.model is None:
        raise ModelError(f"{t.path}: a CTranslate2 export keeps no PyTorch weights to {what}; give "
                         "a checkpoint file written by `attn-mt train`, e.g. "
                         "RUN/checkpoint_best.pt", "path")
    if t.cfg.model.kind == "rnn" and what == "heads" and not any_kind:
        raise ModelError(f"{t.path}: an {t.cfg.model.kind.upper()} model; {what} needs a "
                         "Transformer (the RNN has one additive attention, no heads)", "path")
    return t.model


def attentions(model: Loaded, items: list[str], dcfg: DecodeConfig, steer: Steer | None,
               target: str | None = None) -> list[Attention]:
    """Each text's translation and maps: `target` teacher-forced, or the texts decoded as
    `translate` decodes them (batched, `steer`; None: plain search), each one's maps teacher-forced
    on the very ids its decode gave."""
    from attn_mt.decoding.attention_maps import attention_maps

    from . import steering
    from .attention import Attention

    net = transformer(model, "draw")
    if any(not text.strip() for text in items):
        raise InputError("a text is empty: attention needs a sentence", "texts")
    ids: dict[int, list[int]] = {}
    with model.shared.reading():
        if target is None:
            steering.translate_nbest(model.translator, items, dcfg, steer or steering.Steer(), ids)
        found = [attention_maps(net, model.translator.tok, text, dcfg, model.translator.device,
                                target=target, target_ids=ids.get(i)) for i,
                 text in enumerate(items)]
    return [Attention(text.strip(), translation, maps)
            for text, (translation, maps) in zip(items, found, strict=True)]


def explain(model: Loaded, text: str, kind: str, layer: int, head: int, token: int | str,
            beam: int) -> Explanation:
    """`Model.explain`: its arguments checked, then analysis/explain.py's recomputation, alone on
    the module."""
    from attn_mt.analysis.explain import ExplainError
    from attn_mt.analysis.explain import explain as recompute

    net = transformer(model, "explain")
    text = checks.text(text, "text")
    if not isinstance(kind, str):
        raise ExplainError("kind", f"expected one of encoder, decoder, cross, not {kind!r}")
    for value, name in ((layer, "layer"), (head, "head"), (beam, "beam")):
        # types here; ranges as explain's own (the model's sizes)
        checks.integer(value, name, least=None)
    if isinstance(token, bool) or not isinstance(token, int | str):
        raise InputError("expected a position (an integer from 0) or a token's text, not "
                         f"{token!r}", "token")
    try:
        dcfg = replace(model.translator.decode, beam_size=beam, nbest=1)
    except AttnMTError:
        raise ExplainError("beam", f"must be an integer from 1 to 1000, not {beam!r}") from None
    with model.shared.writing():  # its hook would record other threads' calls
        return recompute(net, model.translator.tok, text, kind=kind, layer=int(layer),
                         head=int(head), token=token, dcfg=dcfg, device=model.translator.device)


def prune(model: Loaded, n: int, sources: Lines, refs: Lines, sentences: int,
          out: str | os.PathLike | None) -> tuple[Translator, HeadsReport]:
    """`Model.prune`: the pruned model's Translator and its report; with `out`, its checkpoint
    written there."""
    from attn_mt import checkpoint
    from attn_mt.analysis.pruned import pruned_state
    from attn_mt.decoding.translator import model_translator
    from attn_mt.files import check_outputs

    checks.integer(n, "n")
    if out is not None:
        out = checks.path(out, "out")
    # first
    check_outputs([("out", None if out is None else Path(out), (".pt",))], [model.translator.path])
    report, net, gone = heads(model, sources, refs, sentences, n)
    state = pruned_state(net, checkpoint_state(model), gone, model.translator.path.name)
    t = model.translator
    path = Path(out) if out is not None else t.path.with_name(f"{t.path.stem}.pruned{n}.pt")
    if out is not None:
        checkpoint.save(state, path)
        report.out = str(path)
    return model_translator(net, t.cfg, t.tok, t.device, path, state), report


def checkpoint_state(model: Loaded) -> dict:
    """What a checkpoint written from this model keeps: config, tokenizer, step, the pruned
    heads."""
    from attn_mt.checkpoint import model_state

    t = model.translator
    info = {k: v for k, v in (t.state or {}).items() if v is not None and k != "pruned_from"}
    return {**info, **model_state({}, t.cfg, t.tok)}


def heads(model: Loaded, sources: Lines | None, refs: Lines | None, sentences: int, prune_n: int,
          contrastive: Items | None = None) -> tuple[HeadsReport, nn.Module, list[Head]]:
    """Mask each head of a copy of the module on the first `sentences` pairs (or the contrastive
    set's sentences): the report, the copy (pruned of `prune_n` heads) and the heads it lost."""
    from attn_mt.analysis.heads import analyse
    from attn_mt.analysis.pruned import pruned_heads

    transformer(model, "heads")
    checks.integer(sentences, "sentences")
    items = contrastive_items(contrastive) if contrastive is not None else []
    if (sources is None) != (refs is None):
        raise InputError("`sources` and `refs` go together: the sentences and their references",
                         "refs")
    if sources is None or refs is None:
        if not items:
            raise InputError("give `sources` and `refs`, or a `contrastive` set to measure on",
                             "sources")
        sources, refs = [i.src for i in items], [i.ref for i in items]
    srcs, references = pairs(sources, refs)
    # masking sets head_mask: on a copy, never on the module others use
    with model.shared.reading():
        net = copy.deepcopy(model.translator.model)
    t = model.translator
    before = pruned_heads((t.state or {}).get("pruned_heads") or [], net, t.path)
    report, gone = analyse(net, t.cfg, t.tok, srcs, references, name=str(t.path), before=before,
                           n_sentences=sentences, prune_n=prune_n, device=t.device, items=items)
    return report, net, gone
