"""`attn_mt.load`: one loaded model, whatever the file, with everything attn-mt does to a model as a
method.

    >>> import attn_mt
    >>> model = attn_mt.load("runs/toy/checkpoint_best.pt", device="cpu", threads=2)
    >>> model.translate("the old man sees a small dog.")
    'der alte Mann sieht einen kleinen Hund.'

A checkpoint (trained, averaged, pruned) decodes with PyTorch and can show its attention; an export
folder decodes with CTranslate2 and translates and scores only. Every method takes texts as a string
(one result) or any iterable of strings (a list of results, in input order); `sources`/`refs` may
also be a `Path` to a file with one sentence per line. Each method has one return type per kind of
input: `translate` gives strings, `translate_nbest` `Translation`s, `score` `Score`s. A Model may be
shared by threads (sharing.py). The analyses (attention, explain, heads, prune) are inspection.py's
methods, and decoding steered by the caller (a target prefix, sampling, the stream) and placement
(`to`, `dtype`) steering.py's: each is imported by the method that needs it, so a plain `translate`
loads neither.

One job: the `Model` facade; decoding/, analysis/ and export/ below it do the work.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack, overload

from attn_mt.config import ARGS, DECODE_OPTIONS, DecodeConfig
from attn_mt.config.decode import Decoding, OneBest, Streamed
from attn_mt.data import checks
from attn_mt.decoding.translate import Translation
from attn_mt.decoding.translator import decode_options, evaluate_texts
from attn_mt.errors import AttnMTError, InputError, ModelError

from .arguments import refuse_others, spellings
from .inspection import Inspection
from .opening import open_translator
from .sharing import Shared

if TYPE_CHECKING:
    from attn_mt.analysis.overview import HeadsReport
    from attn_mt.decoding.contrastive import ContrastiveReport, Item
    from attn_mt.decoding.scoring import Score
    from attn_mt.decoding.translator import Translator

    from .analyses import Lines
    from .attention import Attention
    from .steering import Steer

Texts = str | Iterable[str]  # one sentence, or any iterable of them (a list, a tuple, a generator)
Prefix = str | Iterable[str] | None  # one target prefix for every text, or one per text


def load(path: str | os.PathLike, *, device: str = "auto", threads: int | None = None,
         dtype: str | None = None) -> Model:
    """Open a model for translation and analysis: a checkpoint file written by `attn-mt train` (or
    averaged, or pruned), a folder written by `attn-mt export` or a MarianMT model, on `device`
    (cpu, cuda, cuda:N, mps or auto), with `threads` CPU threads (default: torch's), its weights in
    `dtype` (float32, bfloat16 or float16; default as stored, float32).

    >>> model = attn_mt.load("runs/toy/checkpoint_best.pt", device="cuda:0", dtype="bfloat16")
    """
    if not isinstance(path, str | os.PathLike):
        raise InputError(f"expected a file or folder name, not {type(path).__name__}", "path")
    if threads is not None:
        checks.integer(threads, "threads")
    if dtype is not None:
        from .steering import DTYPES

        checks.choice(dtype, "dtype", DTYPES)
    try:
        model = Model(open_translator(Path(path) if isinstance(path, os.PathLike) else path, device,
                                      threads))
    except AttnMTError as e:
        raise e.naming("path") from None  # a device's errors name it already
    return model.to(dtype=dtype) if dtype is not None else model


class Model(Inspection):
    """A loaded translation model (`attn_mt.load`): translate, score, attention, explain, heads,
    prune, evaluate.

    `decode` holds the model's decode defaults; `config` its experiment config (None for an export);
    `module` the PyTorch module (None for an export); `tokenizer` its SentencePiece tokenizer.
    """

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.shared = Shared()  # translations side by side; explain and `to` alone
        self.report: HeadsReport | None = None  # a pruned model's (`prune`)

    kind = property(lambda self: self.translator.kind,
                    doc='"checkpoint" (PyTorch) or "export" (CTranslate2).')
    path = property(lambda self: self.translator.path, doc="The file or folder it was loaded from.")
    device = property(lambda self: self.translator.device, doc="Where it runs: cpu, cuda, ...")
    decode = property(lambda self: self.translator.decode,
                      doc="Its decode defaults (a DecodeConfig).")
    config = property(lambda self: self.translator.cfg,
                      doc="Its ExperimentConfig (None for an export).")
    module = property(lambda self: self.translator.model,
                      doc="The PyTorch model (None for an export).")
    tokenizer = property(lambda self: self.translator.tok, doc="Its tokenizer (SentencePiece).")
    info = property(lambda self: dict(self.translator.state or {}),
                    doc="step, epoch, best_bleu, pruned heads.")

    def __repr__(self) -> str:
        m = self.config.model if self.config else None
        arch = ("CTranslate2" if m is None else f"rnn d_hidden={m.d_hidden}" if m.kind == "rnn" else
                f"transformer d_model={m.d_model} layers={m.n_layers} heads={m.n_heads}")
        from .steering import dtype_name

        dtype = f" {dtype_name(self.module)}" if self.module is not None else ""
        return f"<attn_mt.Model {self.kind} {str(self.path)!r} on {self.device}{dtype}: {arch}>"

    def options(self, *, names: Mapping[str, str] = ARGS,
                **options: Unpack[Decoding]) -> DecodeConfig:
        """The model's decode defaults with the given settings (`Decoding`'s keywords: beam, alpha,
        nbest, batch_size, max_len_a, max_len_b; None: the default), each checked against its row of
        DECODE_OPTIONS; an error names a setting as `names` spells it ({"beam_size": "beam", ...};
        the command line passes its own spelling; a setting it leaves out keeps the API's name)."""
        refuse_others("options", options, Decoding.__optional_keys__)
        given: Mapping[str, Any] = options
        return decode_options(self.decode, spellings(names),
                              **{o.key: given[o.arg] for o in DECODE_OPTIONS if o.arg in given})

    @overload
    def translate(self, texts: str, *, target_prefix: Prefix = ..., temperature: float | None = ...,  # type: ignore[overload-overlap]
                  seed: int | None = ..., return_attention: Literal[False] = ...,
                  **options: Unpack[OneBest]) -> str: ...
    @overload
    def translate(self, texts: Iterable[str], *, target_prefix: Prefix = ...,
                  temperature: float | None = ..., seed: int | None = ...,
                  return_attention: Literal[False] = ...,
                  **options: Unpack[OneBest]) -> list[str]: ...
    @overload
    def translate(self, texts: str, *, target_prefix: Prefix = ..., temperature: float | None = ...,  # type: ignore[overload-overlap]
                  seed: int | None = ..., return_attention: Literal[True],
                  **options: Unpack[OneBest]) -> Attention: ...
    @overload
    def translate(self, texts: Iterable[str], *, target_prefix: Prefix = ...,
                  temperature: float | None = ..., seed: int | None = ...,
                  return_attention: Literal[True],
                  **options: Unpack[OneBest]) -> list[Attention]: ...

    def translate(self, texts: Texts, *, target_prefix: Prefix = None,
                  temperature: float | None = None, seed: int | None = None,
                  return_attention: bool = False, **options: Unpack[OneBest]) -> Any:
        """Translate one text (a string back) or many (a list, in input order): beam search of width
        `beam` (1: greedy), ranked by log P / lp with GNMT's length penalty lp = ((5 + length) / 6)
        ** `alpha`; at most `max_len_a` * source length + `max_len_b` tokens each; `batch_size`
        sentences per model call (`OneBest`'s keywords, DECODE_OPTIONS' rows but nbest).
        `target_prefix` starts each translation with given words; `temperature` samples instead of
        searching (greedy steps drawn from softmax(logits / temperature), reproducible with `seed`).
        With `return_attention`, each result is an `Attention` (its `.translation` the text, with
        every map).

        >>> model.translate(["a dog runs.", "two cats sleep."], beam=5)
        >>> model.translate("a dog runs.", target_prefix="ein Hund")
        """
        refuse_others("translate", options, OneBest.__optional_keys__)
        items, one = checks.texts(texts, "texts")
        checks.boolean(return_attention, "return_attention")
        if temperature is not None and options.get("beam") is None:
            options["beam"] = 1  # sampling draws one token a step, whatever the model's beam
        dcfg = self.options(**options, nbest=1)
        steer = self._steer(items, target_prefix, temperature, seed)
        if return_attention:
            from . import analyses

            # maps on the ids of this very decode
            out: list = analyses.attentions(self, items, dcfg, steer)
        else:
            out = [n[0].text for n in self._nbest(items, dcfg, steer)]
        return out[0] if one else out

    @overload
    def translate_nbest(self, texts: str, *, target_prefix: Prefix = ...,  # type: ignore[overload-overlap]
                        **options: Unpack[Decoding]) -> list[Translation]: ...
    @overload
    def translate_nbest(self, texts: Iterable[str], *, target_prefix: Prefix = ...,
                        **options: Unpack[Decoding]) -> list[list[Translation]]: ...

    def translate_nbest(self, texts: Texts, *, target_prefix: Prefix = None,
                        **options: Unpack[Decoding]) -> Any:
        """The `nbest` best translations (default: the model's decode.nbest) of one text (a list of
        `Translation`s: text, log_prob, score = log_prob / lp, best first) or of many (a list of
        such lists); `beam` must be at least `nbest`. The other settings are `translate`'s.

        >>> model.translate_nbest("a dog runs.", beam=5, nbest=3)[0].score
        """
        refuse_others("translate_nbest", options, Decoding.__optional_keys__)
        items, one = checks.texts(texts, "texts")
        dcfg = self.options(**options)
        out = self._nbest(items, dcfg, self._steer(items, target_prefix, None, None))
        return out[0] if one else out

    def stream(self, text: str, *, target_prefix: str | None = None,
               **options: Unpack[Streamed]) -> Iterator[str]:
        """Translate one text greedily, giving the text of each new token as it is decoded (a
        generator); the pieces joined are `translate(text, beam=1)` with the same options
        (`Streamed`'s keywords: the rows of DECODE_OPTIONS whose `calls` name "stream").

        >>> for piece in model.stream("the old man sees a small dog."):
        ...     print(piece, end="", flush=True)
        """
        from . import steering

        refuse_others("stream", options, Streamed.__optional_keys__)
        text = checks.text(text, "text", empty=True)
        dcfg = self.options(**options, beam=1, nbest=1)
        steer = steering.Steer.of(self.translator, [text], target_prefix, None, None)
        return steering.stream(self.translator, self.shared, text, dcfg, steer)

    def _steer(self, items: list[str], target_prefix: Prefix, temperature: float | None,
               seed: int | None) -> Steer | None:
        """The call's steering, checked (steering.py); None where it asks for none: the plain
        search."""
        if target_prefix is None and temperature is None and seed is None:
            return None
        from . import steering

        return steering.Steer.of(self.translator, items, target_prefix, temperature, seed)

    def _nbest(self, items: list[str], dcfg: DecodeConfig,
               steer: Steer | None) -> list[list[Translation]]:
        with self.shared.reading():
            if steer is not None and steer.active:
                from . import steering

                return steering.translate_nbest(self.translator, items, dcfg, steer)
            return self.translator.translate_nbest(items, dcfg)

    @overload
    def score(self, sources: str, targets: str, *, batch_size: int = ...) -> Score: ...  # type: ignore[overload-overlap]
    @overload
    def score(self, sources: Iterable[str], targets: Iterable[str], *,
              batch_size: int = ...) -> list[Score]: ...

    def score(self, sources: Texts, targets: Texts, *, batch_size: int = 64) -> Any:
        """log P(target | source) of given translations by forced decoding, per sentence and per
        token (a `Score`: tokens, token_log_probs, log_prob); one pair, or two iterables of the same
        length (a list of Scores); `batch_size` pairs per model call.

        >>> model.score("a dog runs.", "ein Hund rennt.").log_prob
        """
        srcs, one = checks.texts(sources, "sources")
        tgts, one_target = checks.texts(targets, "targets")
        checks.integer(batch_size, "batch_size")
        if one != one_target or len(srcs) != len(tgts):
            raise InputError(f"{len(tgts)} targets for {len(srcs)} sources: give one target per "
                             "source" if one == one_target
                             else "give a string for each, or an iterable of each", "targets")
        with self.shared.reading():
            out = self.translator.score(srcs, tgts, batch_size=batch_size)
        return out[0] if one else out

    def contrastive(self, items: str | os.PathLike | Iterable[Item], *,
                    batch_size: int = 64) -> ContrastiveReport:
        """Contrastive accuracy (ContraPro's test): the share of items whose reference scores higher
        than every variant, overall and by pronoun, antecedent distance and role (a
        `ContrastiveReport`). `items`: a file (our JSONL, e.g. RUN/test.contrastive.jsonl, or
        ContraPro's JSON) or an iterable of `Item`s.

        >>> model.contrastive("runs/pronoun/test.contrastive.jsonl").accuracy
        """
        from attn_mt.decoding.contrastive import evaluate_contrastive

        from . import analyses

        checks.integer(batch_size, "batch_size")
        found = analyses.contrastive_items(items)
        with self.shared.reading():
            return evaluate_contrastive(
                lambda s, t: self.translator.score(s, t, batch_size=batch_size), found)

    def evaluate(self, sources: Lines, refs: Lines, **options: Unpack[OneBest]) -> dict:
        """Translate `sources` (with `translate`'s decode options) and score them against `refs`:
        sacreBLEU BLEU and chrF with their signatures.

        >>> model.evaluate(Path("runs/toy/test.en"), Path("runs/toy/test.de"))["bleu"]
        """
        from . import analyses

        refuse_others("evaluate", options, OneBest.__optional_keys__)
        srcs, references = analyses.pairs(sources, refs)
        dcfg = self.options(**options, nbest=1)
        with self.shared.reading():
            return evaluate_texts(self.translator, srcs, references, dcfg)

    def to(self, device: str | None = None, dtype: str | None = None) -> Model:
        """Move this model's weights to `device` (cpu, cuda, cuda:N, mps) and/or cast them to
        `dtype` (float32, bfloat16, float16), in place (after the calls in progress); returns the
        model.

        >>> model.to("cuda:1", dtype="bfloat16")
        """
        from . import steering

        if dtype is not None:
            checks.choice(dtype, "dtype", steering.DTYPES)
        if self.module is None:
            raise ModelError(f"{self.path}: a CTranslate2 export is placed when it is loaded "
                             "(`attn_mt.load`'s device; its weights' type is the export's "
                             "quantization)", "dtype" if dtype is not None else "device")
        with self.shared.writing():
            try:
                self.translator = steering.moved(self.translator, device, dtype)
            except AttnMTError as e:
                raise e.naming("device") from None
        return self

    def save(self, path: str | os.PathLike) -> Path:
        """Write this model (a checkpoint or a MarianMT model; pruned heads and step kept) as a
        checkpoint file that `attn_mt.load` and every command open, atomically (a kill leaves the
        old file or the new one); weights in float32. Returns the path.

        >>> model.save("mine.pt")
        """
        from attn_mt import checkpoint
        from attn_mt.files import check_outputs

        from . import analyses

        path = checks.path(path)
        module = self._transformer("save", any_kind=True)
        check_outputs([("path", Path(path), (".pt",))], [self.path])
        with self.shared.reading():
            weights = {k: (v.float() if v.is_floating_point() else v).cpu() for k,
                       v in module.state_dict().items()}
        checkpoint.save({**analyses.checkpoint_state(self), "model": weights}, Path(path))
        return Path(path)

    def _transformer(self, what: str, any_kind: bool = False):
        """The PyTorch module, or ModelError saying why `what` cannot run on this model
        (analysis/tensors.py)."""
        from . import analyses

        return analyses.transformer(self, what, any_kind)
