"""A loaded model behind one interface, `Translator`, for `translate`, `evaluate` and `serve`; here
the PyTorch checkpoint kind (imports/ct2_translator.py makes the CTranslate2 kind and chooses
between the two)."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.checkpoint import CheckpointError
from attn_mt.config import ARGS, OPTION, DecodeConfig
from attn_mt.config.yamlconf import OptionError
from attn_mt.data import checks
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.metrics import score
from attn_mt.decoding.search import Interrupt
from attn_mt.decoding.translate import Translation

if TYPE_CHECKING:
    from attn_mt.decoding.scoring import Score


@dataclass(frozen=True)
class Translator:
    """A loaded model of either kind, with its decode defaults (`.decode`) and tokenizer.

    `model` and `cfg` are set for a PyTorch checkpoint (kind "checkpoint") and None for a
    CTranslate2 export (kind "export"), which has no attention maps to show.
    """

    kind: str
    path: Path
    decode: DecodeConfig
    tok: Tokenizer
    run: Callable[..., list[list[Translation]]]  # (texts, dcfg, interrupt=) -> n-best lists
    device: str
    model: Any = None
    cfg: Any = None
    state: dict | None = None  # the checkpoint's step, epoch, best_bleu (or the export's step)
    # (sources, targets, batch_size=) -> scores (scoring.py)
    scorer: Callable[..., list[Score]] | None = None

    def translate_nbest(self, texts: list[str], dcfg: DecodeConfig,
                        interrupt: Interrupt | None = None) -> list[list[Translation]]:
        """The `dcfg.nbest` best translations of each text, best first, in input order; `interrupt`
        is called before each decoder step (a checkpoint) or batch (an export), and raises to
        abandon the call."""
        return self.run(texts, dcfg, interrupt=interrupt)

    def score(self, sources: list[str], targets: list[str], batch_size: int = 64) -> list[Score]:
        """log P of each given target (its pieces, per piece and in all) given its source, in input
        order."""
        if self.scorer is None:
            raise CheckpointError(f"{self.path}: this {self.kind} cannot score translations")
        return self.scorer(sources, targets, batch_size=batch_size)


def checkpoint_translator(path: Path | str, device: str = "auto") -> Translator:
    """A PyTorch checkpoint file written by `attn-mt train`, ready to translate (`attn_mt.load`
    chooses between this and an export folder)."""
    from attn_mt import checkpoint
    from attn_mt.device import pick_device

    path, dev = Path(path), pick_device(device)
    state = checkpoint.load(path)
    try:
        model, cfg, tok = checkpoint.model_from_state(state, dev)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return model_translator(model, cfg, tok, dev, path, state)


# what a Translator keeps of its checkpoint
KEPT = ("step", "epoch", "best_bleu", "pruned_heads", "pruned_from")


def model_translator(model, cfg, tok: Tokenizer, device, path: Path | str,
                     state: dict | None = None) -> Translator:
    """A loaded PyTorch model (in eval mode, on `device`) as a Translator; `state` is its
    checkpoint's dict."""
    from attn_mt.decoding.translate import translate_nbest

    state = state or {}
    return Translator("checkpoint", Path(path), cfg.decode, tok,
                      functools.partial(translate_nbest, model, tok, device=device), str(device),
                      model, cfg, {k: state.get(k) for k in KEPT},
                      functools.partial(_score_texts, model, tok, device=device))


def _score_texts(model, tok: Tokenizer, sources: list[str], targets: list[str], *,
                 batch_size: int = 64, device: Any = "cpu") -> list[Score]:
    """A checkpoint's scorer: scoring.score_texts, imported at the first score (translating never
    loads it)."""
    from attn_mt.decoding import scoring

    return scoring.score_texts(model, tok, sources, targets, batch_size=batch_size, device=device)


def decode_options(defaults: DecodeConfig, names: Mapping[str, str] = ARGS,
                   **given: int | float | None,
                   ) -> DecodeConfig:
    """`defaults` (a model's decode section) with the options `given` by DecodeConfig field (None:
    not given), as the caller's arguments or `/api/translate`'s fields set them, each checked
    against its row of DECODE_OPTIONS; an error names the option as `names` spells it (ARGS, the
    default: the API's arguments, "beam 0: must be >= 1"; FIELDS: the request's; the command line
    passes its own spelling)."""
    values = {}
    for key, value in given.items():
        if value is None:
            continue
        o, name = OPTION[key], names[key]
        value = (checks.integer(value, name, least=None) if o.type is int
                 else checks.number(value, name, o.least))
        if why := o.problem(value):
            raise OptionError(f"{name} {value}: {why}", name)
        values[key] = value
    beam, nbest = values.get("beam_size", defaults.beam_size), values.get("nbest", defaults.nbest)
    if nbest > beam and values.get("nbest", 1) != 1:
        where = (f"{names['beam_size']} {beam}" if "beam_size" in values
                 else f"the checkpoint's beam size ({beam})")
        raise OptionError(f"{nbest} hypotheses need a beam at least as wide, not {where}: "
                          f"add {names['beam_size']} {nbest}", names["nbest"])
    if nbest > beam:  # the checkpoint's n-best, wider than the beam given
        raise OptionError(f"decode.nbest={nbest} exceeds {names['beam_size']} {beam}",
                          names["beam_size"])
    return replace(defaults, **values)


def evaluate_texts(translator: Translator, sources: list[str], refs: list[str],
                   dcfg: DecodeConfig) -> dict:
    """Translate `sources` (best hypothesis each) and score them against `refs`: `attn-mt
    evaluate`'s result, sacrebleu BLEU and chrF with signatures, and the decode settings used."""
    result = score([n[0].text for n in translator.translate_nbest(sources, dcfg)], refs)
    return {**result, "decode": {"beam_size": dcfg.beam_size, "alpha": dcfg.alpha}}


def hypotheses_json(nbest: list[Translation], links: list[str] | None = None) -> list[dict]:
    """One n-best list as the objects of `attn-mt translate`'s jsonl format and of `/api/translate`;
    with `links`, each hypothesis's word alignment (Pharaoh) as "alignment"."""
    return [{"text": h.text, "score": round(h.score, 4), "log_prob": round(h.log_prob, 4),
             **({"alignment": links[k]} if links is not None else {})} for k, h in enumerate(nbest)]


def format_nbest(sources: list[str], nbests: list[list[Translation]], fmt: str, first: int,
                 links: list[list[str]] | None = None) -> str:
    """`attn-mt translate`'s output lines: the best translations, Moses-style n-best lines (`i |||
    text ||| score`, i counted from `first`), or (fmt "jsonl") one JSON object per source; with
    `links` (Pharaoh, one per hypothesis) each line ends in ` ||| links` and each JSON hypothesis
    has them."""
    tails = links or [[None] * len(n) for n in nbests]
    if fmt == "jsonl":
        return "\n".join(json.dumps({"source": s,
                                     "hypotheses": hypotheses_json(n, t if links else None)},
                                    ensure_ascii=False) for s, n,
                         t in zip(sources, nbests, tails, strict=True))
    end = [[f" ||| {a}" if links else "" for a in t] for t in tails]
    if max(map(len, nbests)) == 1:
        return "\n".join(n[0].text + e[0] for n, e in zip(nbests, end, strict=True))
    return "\n".join(f"{first + i} ||| {h.text} ||| {h.score:.4f}{e[k]}"
                     for i, (n, e) in enumerate(zip(nbests, end, strict=True)) for k,
                     h in enumerate(n))


def hypothesis_links(translator: Translator, sources: list[str], nbests: list[list[Translation]],
                     batch_size: int) -> list[list[str]]:
    """Each hypothesis's word alignment with its source (Pharaoh), by the default method of
    decoding/alignment.py, teacher-forced on the hypothesis's text."""
    from attn_mt.decoding.alignment import align_texts

    if translator.model is None:
        raise CheckpointError(f"{translator.path}: a CTranslate2 export keeps no attention to "
                              "align; give a checkpoint file written by `attn-mt train`")
    srcs = [s for s, n in zip(sources, nbests, strict=True) for _ in n]
    found = iter(align_texts(translator.model, translator.tok, srcs,
                             [h.text for n in nbests for h in n], None, translator.device,
                             batch_size))
    return [[next(found).pharaoh for _ in n] for n in nbests]


def translate_lines(translator: Translator, lines: Iterable[str], dcfg: DecodeConfig, fmt: str,
                    stream: bool = False, align: bool = False) -> Iterator[str]:
    """`attn-mt translate`'s output for `lines`, in order: each line's as soon as it is read with
    `stream` (a terminal, or when asked), else pieces of 1000 lines or more (batches of
    dcfg.batch_size inside); with `align`, each hypothesis with its word alignment
    (hypothesis_links)."""
    if align and translator.model is None:  # before any work
        hypothesis_links(translator, [], [], 1)
    lines, done, chunk = iter(lines), 0, 1 if stream else max(1000, dcfg.batch_size)
    while piece := list(itertools.islice(lines, chunk)):
        nbests = translator.translate_nbest(piece, dcfg)
        links = hypothesis_links(translator, piece, nbests, dcfg.batch_size) if align else None
        yield format_nbest(piece, nbests, fmt, done, links)
        done += len(piece)
