"""`attn_mt.load`: one loaded model, whatever the file, with everything attn-mt does to a model as a method.

    >>> import attn_mt
    >>> model = attn_mt.load("runs/toy/checkpoint_best.pt", device="cpu", threads=2)
    >>> model.translate("the old man sees a small dog.")
    'der alte Mann sieht einen kleinen Hund.'

A checkpoint (trained, averaged, pruned) decodes with PyTorch and can show its attention; an export folder
decodes with CTranslate2 and translates and scores only. Every method takes texts as a string (one result)
or a list of strings (a list of results, in input order); `sources`/`refs` may also be a `Path` to a file
with one sentence per line.

One job: the `Model` facade; decoding/, analysis/ and export/ below it do the work.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from attn_mt.config import ConfigError, DecodeConfig
from attn_mt.data.sources import read_aligned, read_lines
from attn_mt.decoding.search import Translation
from attn_mt.decoding.translator import ARGS, Translator, decode_options, evaluate_texts
from attn_mt.errors import InputError, ModelError

from .opening import open_translator

Texts = str | Sequence[str]
Lines = Sequence[str] | os.PathLike


def load(path: str | os.PathLike, *, device: str = "auto", threads: int | None = None) -> Model:
    """Open a model for translation and analysis: a checkpoint file written by `attn-mt train` (or averaged,
    or pruned) or a folder written by `attn-mt export`, on `device` (cpu, cuda, mps or auto), with `threads`
    CPU threads (default: torch's).

    >>> model = attn_mt.load("runs/toy/checkpoint_best.pt")
    """
    return Model(open_translator(path, device, threads))


def _texts(texts: Texts, field: str) -> tuple[list[str], bool]:
    """(the texts as a list, whether one string was given)."""
    if isinstance(texts, str):
        return [texts], True
    if isinstance(texts, os.PathLike):
        return read_lines(Path(texts)), False
    if not all(isinstance(t, str) for t in texts):
        raise InputError("expected a string or a list of strings", field)
    return list(texts), False


def _lines(lines: Lines, field: str) -> list[str]:
    """A list of sentences from a list or a file (a Path)."""
    return _texts(lines, field)[0] if not isinstance(lines, str) else [lines]


def _items(items: str | os.PathLike | Sequence) -> list:
    """A contrastive set from a file (decoding/contrastive.py reads ours and ContraPro's) or a list of Items."""
    from attn_mt.decoding.contrastive import Item, read_items

    if isinstance(items, str | os.PathLike):
        return read_items(items)
    if not isinstance(items, Sequence) or not items or not all(isinstance(i, Item) for i in items):
        raise InputError("expected a file or a non-empty list of contrastive Items", "contrastive")
    return list(items)


class Model:
    """A loaded translation model (`attn_mt.load`): translate, score, attention, explain, heads, prune, evaluate.

    `decode` holds the model's decode defaults; `config` its experiment config (None for an export);
    `module` the PyTorch module (None for an export); `tokenizer` its SentencePiece tokenizer.
    """

    def __init__(self, translator: Translator) -> None:
        self.translator = translator

    kind = property(lambda self: self.translator.kind, doc='"checkpoint" (PyTorch) or "export" (CTranslate2).')
    path = property(lambda self: self.translator.path, doc="The file or folder it was loaded from.")
    device = property(lambda self: self.translator.device, doc="Where it runs: cpu, cuda, ...")
    decode = property(lambda self: self.translator.decode, doc="Its decode defaults (a DecodeConfig).")
    config = property(lambda self: self.translator.cfg, doc="Its ExperimentConfig (None for an export).")
    module = property(lambda self: self.translator.model, doc="The PyTorch model (None for an export).")
    tokenizer = property(lambda self: self.translator.tok, doc="Its tokenizer (SentencePiece).")
    info = property(lambda self: dict(self.translator.state or {}), doc="step, epoch, best_bleu, pruned heads.")

    def __repr__(self) -> str:
        m = self.config.model if self.config else None
        arch = ("CTranslate2" if m is None else f"rnn d_hidden={m.d_hidden}" if m.kind == "rnn" else
                f"transformer d_model={m.d_model} layers={m.n_layers} heads={m.n_heads}")
        return f"<attn_mt.Model {self.kind} {str(self.path)!r} on {self.device}: {arch}>"

    def options(self, *, beam: int | None = None, alpha: float | None = None, nbest: int | None = None,
                batch_size: int | None = None, max_len_a: float | None = None, max_len_b: int | None = None,
                names: Mapping[str, str] = ARGS) -> DecodeConfig:
        """The model's decode defaults with the given settings (None: the default), checked; an error names
        a setting as `names` spells it ({"beam_size": "beam", ...}; the CLI passes its flags)."""
        dcfg = decode_options(self.decode, names, beam_size=beam, alpha=alpha, nbest=nbest, batch_size=batch_size)
        limits = {k: v for k, v in (("max_len_a", max_len_a), ("max_len_b", max_len_b)) if v is not None}
        try:
            return replace(dcfg, **limits)
        except ConfigError as e:
            key = next(k for k in limits if f"decode.{k}" in str(e))
            raise InputError(str(e).split(": ", 1)[-1], key) from None

    def translate(self, texts: Texts, *, beam: int | None = None, alpha: float | None = None,
                  nbest: int | None = None, batch_size: int | None = None, max_len_a: float | None = None,
                  max_len_b: int | None = None) -> Any:
        """Translate one text (a string back) or many (a list, in input order). With `nbest`, each result is
        the list of the `nbest` best `Translation`s (text, log_prob, score), best first.

        >>> model.translate(["a dog runs.", "two cats sleep."], beam=5)
        >>> model.translate("a dog runs.", beam=5, nbest=3)[0].score
        """
        items, one = _texts(texts, "texts")
        dcfg = self.options(beam=beam, alpha=alpha, nbest=nbest, batch_size=batch_size, max_len_a=max_len_a,
                            max_len_b=max_len_b)
        nbests = self.translator.translate_nbest(items, dcfg)
        out: list = nbests if nbest is not None else [n[0].text for n in nbests]
        return out[0] if one else out

    def translate_nbest(self, texts: list[str], dcfg: DecodeConfig) -> list[list[Translation]]:
        """The n-best lists of `texts` for a ready DecodeConfig (what `translate` and the CLI call)."""
        return self.translator.translate_nbest(texts, dcfg)

    def score(self, sources: Texts, targets: Texts, *, batch_size: int = 64) -> Any:
        """log P(target | source) of given translations by forced decoding, per sentence and per token (a
        `Score`: tokens, token_log_probs, log_prob); one pair or two lists of the same length.

        >>> model.score("a dog runs.", "ein Hund rennt.").log_prob
        """
        srcs, one = _texts(sources, "sources")
        tgts, _ = _texts(targets, "targets")
        if len(srcs) != len(tgts):
            raise InputError(f"{len(tgts)} targets for {len(srcs)} sources", "targets")
        out = self.translator.score(srcs, tgts, batch_size=batch_size)
        return out[0] if one else out

    def contrastive(self, items: str | os.PathLike | Sequence, *, batch_size: int = 64):
        """Contrastive accuracy (ContraPro's test): the share of items whose reference scores higher than every
        variant, overall and by pronoun, antecedent distance and role (a `ContrastiveReport`). `items`: a file
        (our JSONL, e.g. RUN/test.contrastive.jsonl, or ContraPro's JSON) or a list of `Item`s.

        >>> model.contrastive("runs/pronoun/test.contrastive.jsonl").accuracy
        """
        from attn_mt.decoding.contrastive import evaluate_contrastive

        return evaluate_contrastive(lambda s, t: self.translator.score(s, t, batch_size=batch_size),
                                    _items(items))

    def evaluate(self, sources: Lines, refs: Lines, *, beam: int | None = None, alpha: float | None = None,
                 batch_size: int | None = None) -> dict:
        """Translate `sources` and score them against `refs`: sacreBLEU BLEU and chrF with their signatures.

        >>> model.evaluate(Path("runs/toy/test.en"), Path("runs/toy/test.de"))["bleu"]
        """
        if isinstance(sources, os.PathLike) and isinstance(refs, os.PathLike):
            srcs, references = read_aligned(Path(sources), Path(refs))
        else:
            srcs, references = _lines(sources, "sources"), _lines(refs, "refs")
        if len(srcs) != len(references):
            raise InputError(f"{len(references)} references for {len(srcs)} sources", "refs")
        if not srcs:
            raise InputError("nothing to evaluate: no sentences", "sources")
        dcfg = self.options(beam=beam, alpha=alpha, batch_size=batch_size, nbest=1)
        return evaluate_texts(self.translator, srcs, references, dcfg)

    def _transformer(self, what: str):
        """The PyTorch Transformer, or ModelError saying why `what` cannot run on this model."""
        if self.module is None:
            raise ModelError(f"{self.path}: a CTranslate2 export keeps no PyTorch weights to {what}; give a "
                             "checkpoint file written by `attn-mt train`, e.g. RUN/checkpoint_best.pt", "path")
        if self.config.model.kind != "transformer" and what == "heads":
            raise ModelError(f"{self.path}: an {self.config.model.kind.upper()} model; {what} needs a Transformer (the "
                             "RNN has one additive attention, no heads)", "path")
        return self.module

    def attention(self, text: str, *, beam: int | None = None):
        """Translate `text` and return every attention map (an `Attention`: tokens and each layer's weights,
        (heads, queries, keys), for encoder, decoder and cross attention); shows itself in a notebook.

        >>> att = model.attention("the old man sees a small dog.")
        >>> att.weights("cross", layer=1, head=2)  # (target tokens, source tokens), rows sum to 1
        """
        from attn_mt.decoding.attention_maps import attention_maps

        from .attention import Attention

        model = self._transformer("draw")
        if not isinstance(text, str) or not text.strip():
            raise InputError("the sentence is empty", "text")
        translation, maps = attention_maps(model, self.tokenizer, text, self.options(beam=beam, nbest=1),
                                           self.translator.device)
        return Attention(text.strip(), translation, maps)

    def explain(self, text: str, *, kind: str = "cross", layer: int = 1, head: int = 1, token: int | str = 0,
                beam: int = 1):
        """One head's attention for one query token, step by step, recomputed from the weights (an
        `Explanation`: q, k, v, scores, scaled, weights, the head's output, W_o and the check against the
        model's own output); `token` is a position (from 0) or a token's text.

        >>> e = model.explain("the old man sees a small dog.", kind="encoder", layer=1, head=2, token="dog")
        >>> e.max_abs_diff < 1e-4
        """
        from attn_mt.analysis.explain import ExplainError, explain

        model = self._transformer("explain")
        if not isinstance(text, str):
            raise ExplainError("text", "expected a string")
        try:
            dcfg = replace(self.decode, beam_size=beam, nbest=1)
        except (ConfigError, TypeError):
            raise ExplainError("beam", f"must be an integer >= 1, not {beam!r}") from None
        return explain(model, self.tokenizer, text, kind=kind, layer=layer, head=head, token=token, dcfg=dcfg,
                       device=self.translator.device)

    def heads(self, sources: Lines | None = None, refs: Lines | None = None, *, sentences: int = 200,
              contrastive: str | os.PathLike | Sequence | None = None):
        """Mask each attention head in turn on the first `sentences` pairs: the BLEU (greedy) and loss it
        costs and where its attention goes (a `HeadsReport`; `.table()` prints it, a notebook draws it). With a
        `contrastive` set (a file or `Item`s, as `contrastive` takes) also which heads resolve the pronoun
        (analysis/coref.py) and the contrastive accuracy each one's masking costs; its sources and references
        are the sentences when `sources` and `refs` are not given.

        >>> report = model.heads(Path("runs/toy/test.en"), Path("runs/toy/test.de"), sentences=50)
        >>> report = model.heads(contrastive="runs/pronoun/test.contrastive.jsonl")
        """
        return self._heads(sources, refs, sentences, 0, contrastive)[0]

    def prune(self, n: int, sources: Lines, refs: Lines, *, sentences: int = 200,
              out: str | os.PathLike | None = None) -> Model:
        """A new model without the `n` heads that matter least (each removal re-measured on the first
        `sentences` pairs), its `.report` the HeadsReport; with `out`, also written there as a checkpoint
        every command takes. This model is left as it was.

        >>> smaller = model.prune(2, Path("runs/toy/test.en"), Path("runs/toy/test.de"), out="pruned.pt")
        """
        from attn_mt import checkpoint
        from attn_mt.analysis.pruned import pruned_state
        from attn_mt.config.files import check_outputs
        from attn_mt.decoding.translator import model_translator

        if not isinstance(n, int) or n < 1:
            raise InputError(f"must be an integer >= 1, not {n!r}", "n")
        check_outputs([("out", out, (".pt",))], [self.path])  # before any work
        report, model, gone = self._heads(sources, refs, sentences, n)
        state = pruned_state(model, self._state(), gone, self.path.name)
        path = Path(out) if out is not None else self.path.with_name(f"{self.path.stem}.pruned{n}.pt")
        if out is not None:
            checkpoint.save(state, path)
            report.out = str(path)
        pruned = Model(model_translator(model, self.config, self.tokenizer, self.translator.device, path, state))
        pruned.report = report
        return pruned

    def _state(self) -> dict:
        """What a checkpoint written from this model keeps: config, tokenizer, step, the pruned heads."""
        from attn_mt.checkpoint import model_state

        info = {k: v for k, v in self.info.items() if v is not None and k != "pruned_from"}
        return {**info, **model_state({}, self.config, self.tokenizer)}

    def _heads(self, sources: Lines | None, refs: Lines | None, sentences: int, prune_n: int,
               contrastive: str | os.PathLike | Sequence | None = None):
        import copy

        from attn_mt.analysis.heads import analyse
        from attn_mt.analysis.pruned import pruned_heads

        model = self._transformer("heads")
        if not isinstance(sentences, int) or sentences < 1:
            raise InputError(f"must be an integer >= 1, not {sentences!r}", "sentences")
        items = _items(contrastive) if contrastive is not None else []
        if (sources is None) != (refs is None):
            raise InputError("`sources` and `refs` go together: the sentences and their references", "refs")
        if sources is None:
            if not items:
                raise InputError("give `sources` and `refs`, or a `contrastive` set to measure on", "sources")
            sources, refs = [i.src for i in items], [i.ref for i in items]
        if isinstance(sources, os.PathLike) and isinstance(refs, os.PathLike):
            srcs, references = read_aligned(Path(sources), Path(refs))
        else:
            srcs, references = _lines(sources, "sources"), _lines(refs, "refs")
        if not srcs:
            where = f"{sources}: no lines" if isinstance(sources, os.PathLike) else "no sentences"
            raise InputError(f"{where} to measure on", "sources")
        if prune_n:
            model = copy.deepcopy(model)
        before = pruned_heads(self.info.get("pruned_heads") or [], model, self.path)
        report, gone = analyse(model, self.config, self.tokenizer, srcs, references, name=str(self.path),
                               before=before, n_sentences=sentences, prune_n=prune_n, device=self.translator.device,
                               items=items)
        return report, model, gone
