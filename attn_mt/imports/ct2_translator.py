"""Translating with an exported model (`attn-mt export`) through CTranslate2, returning the same
`Translation` objects as `decode.translate_nbest`, so the CLI prints both the same way
(`export_translator`: an export folder as a `Translator`).

How our decode settings map (docs/export.md):
    beam_size 1     CTranslate2 greedy search; the same tokens as ours on the same weights.
    alpha           CTranslate2's `length_penalty` divides by |Y| ** alpha, ours (GNMT) by ((5 +
                    |Y|) / 6) ** alpha. We pass length_penalty=alpha, ask for every finished
                    hypothesis with eos kept (so |Y| counts eos, as in ours), recover log P = score
                    * |Y| ** alpha, and rank them by our GNMT score. What differs: CTranslate2 stops
                    a sentence once PATIENCE * beam_size hypotheses have finished; ours searches on
                    until no active beam can beat the n-best.
    max_len_a, _b   CTranslate2 has one `max_decoding_length` per call: we pass the batch's largest
                    limit a * |src| + b and cut each output at its own limit, where ours forces eos.
                    For greedy search the cut gives our tokens exactly; only the log P of a cut
                    output differs.

Tested in tests/export/test_ctranslate2.py and tests/export/test_ct2_score.py.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attn_mt.checkpoint import tokenizer_from_protos
from attn_mt.config import ARGS, ConfigError, DecodeConfig
from attn_mt.config.yamlconf import first_line
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.beam import Hypothesis, length_penalty
from attn_mt.decoding.scoring import Score, check_pairs, prepare_targets
from attn_mt.decoding.search import Interrupt
from attn_mt.decoding.translate import Translation, max_lengths, prepare_sources, translate_batches
from attn_mt.decoding.translator import Translator
from attn_mt.errors import ModelError
from attn_mt.export.checkpoint_reader import ExportError
from attn_mt.export.ctranslate2 import META, require_ctranslate2

# beam search collects 2k finished hypotheses before it stops (docs/export.md: why 2)
PATIENCE = 2.0


@dataclass(frozen=True)
class Exported:
    """A loaded export: the CTranslate2 translator, our tokenizer and the decode defaults
    (`.decode`)."""

    translator: Any
    tok: Tokenizer
    decode: DecodeConfig
    max_positions: int
    step: int | None = None  # of the checkpoint it was exported from


def is_export(path: Path | str) -> bool:
    """True for a directory (an export, or something that should have been one)."""
    return Path(path).is_dir()


def ct2_device(name: str) -> str:
    """CTranslate2 runs on "cpu" or "cuda"; "auto" picks CUDA when CTranslate2 sees a GPU."""
    if name not in ("auto", "cpu", "cuda"):
        raise ExportError(f"device {name!r}: CTranslate2 runs on cpu or cuda", "device", named=True)
    gpus = require_ctranslate2().get_cuda_device_count()
    if name == "cuda" and not gpus:
        raise ExportError("device cuda: CTranslate2 sees no CUDA device", "device", named=True)
    return "cuda" if name != "cpu" and gpus else "cpu"


def _read_meta(path: Path) -> dict:
    """META, checked: SentencePiece file names inside the export, max_positions >= 1, a valid decode
    section."""
    try:
        meta = json.loads((path / META).read_text())
        if not isinstance(meta, dict):
            raise TypeError(f"a JSON {type(meta).__name__}, not an object")
        meta = {**meta, "decode": DecodeConfig(**meta["decode"])}
    except FileNotFoundError:
        raise ExportError(f"{path}: not an attn-mt export (no {META}; write one with attn-mt "
                          "export)") from None
    except (ValueError, KeyError, TypeError, ConfigError, OSError) as e:
        raise ExportError(f"{path / META}: unreadable ({type(e).__name__}: "
                          f"{str(e)[:200]})") from None
    names, positions = meta.get("sentencepiece"), meta.get("max_positions")
    if not (isinstance(names, list) and len(names) in (1, 2)
            and all(isinstance(n, str) and n and Path(n).name == n and n != ".." for n in names)):
        raise ExportError(f"{path / META}: sentencepiece must list 1 or 2 file names in the "
                          f"export, not {str(names)[:80]}")
    if type(positions) is not int or positions < 1:
        raise ExportError(f"{path / META}: max_positions must be a positive integer, not "
                          f"{str(positions)[:40]}")
    return meta


def load_exported(path: Path | str, device: str = "cpu", *, compute_type: str = "default",
                  threads: int = 0) -> Exported:
    """Open an export for translation; `threads` is CTranslate2's intra_threads (0: its default)."""
    path = Path(path)
    meta = _read_meta(path)
    ct2 = require_ctranslate2()
    protos = []
    for name in meta["sentencepiece"]:
        try:
            protos.append((path / name).read_bytes())
        except OSError as e:
            raise ExportError(f"{path / name}: cannot read it ({e.strerror or e})") from None
        # one line naming a damaged file
        tokenizer_from_protos(protos[-1], None, what=str(path / name))
    tok = tokenizer_from_protos(protos[0], protos[1] if len(protos) > 1 else None, what=str(path))
    try:
        translator = ct2.Translator(str(path), device=device, compute_type=compute_type,
                                    inter_threads=1, intra_threads=threads)
    # a damaged model.bin fails in CTranslate2's C++ with several exception types
    except Exception as e:
        raise ExportError(f"{path}: CTranslate2 cannot load it: {first_line(e)}") from None
    return Exported(translator, tok, meta["decode"], meta["max_positions"], meta.get("step"))


def export_translator(path: Path | str, device: str = "auto", threads: int = 0) -> Translator:
    """An export folder as a `Translator` (no model: CTranslate2 has no attention maps to show);
    `threads` is CTranslate2's intra_threads (0: its default). `attn_mt.load` chooses between this
    and a checkpoint."""
    dev = ct2_device(device)
    exported = load_exported(path, dev, threads=threads)
    return Translator("export", Path(path), exported.decode, exported.tok,
                      functools.partial(translate_nbest, exported), dev, state={
                          "step": exported.step}, scorer=functools.partial(score_texts, exported))


def _ours(cfg: DecodeConfig) -> dict:
    """No CTranslate2 option: our loop around it decodes with the setting, as for a checkpoint
    (translate_batches' batches, max_lengths' limits, the n-best of `_hypotheses`)."""
    return {}


def _beam(cfg: DecodeConfig) -> dict:
    beam = cfg.beam_size > 1  # all finished hypotheses, for rescoring
    return dict(beam_size=cfg.beam_size, patience=PATIENCE if beam else 1.0,
                num_hypotheses=round(cfg.beam_size * PATIENCE) if beam else 1)


# How an export decodes with each decode option (DECODE_OPTIONS' key; the module docstring says
# where the two differ): its CTranslate2 `translate_batch` options for a DecodeConfig, or why an
# export cannot decode with it (a call that sets it off its default is refused, naming it).
# tests/decoding/test_decode_options.py fails for a row without an entry.
CT2_OPTIONS: dict[str, Callable[[DecodeConfig], dict] | str] = {
    "beam_size": _beam,
    "alpha": lambda cfg: dict(length_penalty=cfg.alpha if cfg.beam_size > 1 else 0.0),
    "nbest": _ours, "batch_size": _ours, "max_len_a": _ours, "max_len_b": _ours,
}


def search_options(cfg: DecodeConfig) -> dict:
    """CTranslate2 `translate_batch` options for our decode settings (CT2_OPTIONS); ModelError
    naming an option an export cannot decode with, set off its default."""
    options = dict(return_scores=True, return_end_token=True, min_decoding_length=0,
                   max_input_length=0)
    for key, how in CT2_OPTIONS.items():
        if not isinstance(how, str):
            options.update(how(cfg))
        elif getattr(cfg, key) != getattr(DecodeConfig(), key):
            raise ModelError(f"a CTranslate2 export cannot decode with it ({how}); a PyTorch "
                             "checkpoint can", ARGS[key])
    return options


def _hypotheses(result, limit: int, cfg: DecodeConfig, tok: Tokenizer) -> list[Hypothesis]:
    """One CTranslate2 result -> our n-best: eos removed, cut at `limit`, GNMT-scored, best
    first."""
    lp_ct2 = cfg.alpha if cfg.beam_size > 1 else 0.0
    out = []
    for pieces, score in zip(result.hypotheses, result.scores, strict=True):
        ids = [tok.tgt.piece_to_id(p) for p in pieces]
        log_prob = score * len(ids) ** lp_ct2 if ids else score
        if ids and ids[-1] == tok.eos_id:
            ids = ids[:-1]
        ids = ids[: limit - 1]  # ours forces eos at the limit
        out.append(Hypothesis(ids, log_prob, log_prob / length_penalty(len(ids) + 1, cfg.alpha)))
    return sorted(out, key=lambda h: -h.score)[: cfg.nbest]


def translate_nbest(exp: Exported, texts: list[str], cfg: DecodeConfig,
                    interrupt: Interrupt | None = None) -> list[list[Translation]]:
    """The `cfg.nbest` best translations of each text, best first, in input order
    (decoding.translate's loop, `translate_batches`, with CTranslate2 decoding each batch;
    `interrupt` is called between batches)."""
    tok, options = exp.tok, search_options(cfg)

    def decode(srcs: list[list[int]], _rows: list[int]) -> list[list[Hypothesis]]:
        limits = max_lengths(torch.tensor([len(s) for s in srcs]), cfg, exp.max_positions).tolist()
        pieces = [[tok.src.id_to_piece(i) for i in s] for s in srcs]
        results = exp.translator.translate_batch(pieces, max_decoding_length=max(limits), **options)
        return [_hypotheses(r, limit, cfg, tok) for r, limit in zip(results, limits, strict=True)]

    return translate_batches(tok, texts, exp.max_positions, cfg.batch_size, decode, interrupt)


def translate(exp: Exported, texts: list[str], cfg: DecodeConfig) -> list[str]:
    """The best translation of each text, in input order."""
    return [n[0].text for n in translate_nbest(exp, texts, cfg)]


def score_texts(exp: Exported, sources: list[str], targets: list[str], *,
                batch_size: int = 64) -> list[Score]:
    """log P of each target given its source (decoding.scoring.score_texts for an export), by
    CTranslate2's `score_batch`, in input order; pairs sorted by length into batches, truncated as
    the checkpoint's are."""
    check_pairs(sources, targets)
    tok = exp.tok
    srcs = prepare_sources(tok, [s.strip() for s in sources], exp.max_positions) if sources else []
    tgts = prepare_targets(tok, targets, exp.max_positions)
    order = sorted(range(len(sources)), key=lambda i: (len(srcs[i]), len(tgts[i])))
    out: list[Score | None] = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        results = exp.translator.score_batch([[tok.src.id_to_piece(i) for i in srcs[j]]
                                              for j in chunk],
                                             [tok.tgt_pieces(tgts[j]) for j in chunk],
                                             max_input_length=0)
        for j, result in zip(chunk, results, strict=True):  # its tokens end with </s>, as ours
            out[j] = Score(list(result.tokens), list(result.log_probs),
                           float(sum(result.log_probs)))
    return out  # type: ignore[return-value]
