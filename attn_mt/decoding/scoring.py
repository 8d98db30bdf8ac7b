"""Scoring given translations: log P(target | source) under a model, per sentence and per token, by
forced decoding (the target fed to the decoder, teacher-forced, as in training): what `attn-mt
score` prints and contrastive evaluation (contrastive.py) compares."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attn_mt.config.yamlconf import OptionError
from attn_mt.data.batching import pad
from attn_mt.data.checks import clean
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.translate import prepare_sources
from attn_mt.models import Seq2Seq


@dataclass(frozen=True)
class Score:
    """One target's score: its pieces ("</s>" last), the log P of each given the source and the
    pieces before it, and their sum, log P(target | source)."""

    tokens: list[str]
    token_log_probs: list[float]
    log_prob: float


def prepare_targets(tok: Tokenizer, texts: list[str], limit: int) -> list[list[int]]:
    """Target ids without eos, truncated (as prepare_sources truncates sources) so that they and
    their eos fit in the model's `limit` positions; an empty text gives no ids (its score is that of
    eos alone)."""
    ids = tok.encode_tgt([clean(t.strip()) for t in texts])
    return [t[: limit - 1] for t in ids]


def check_pairs(sources: list[str], targets: list[str]) -> None:
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets: give one target per "
                         "source")


@torch.inference_mode()
def score_texts(model: Seq2Seq, tok: Tokenizer, sources: list[str], targets: list[str], *,
                batch_size: int = 64, device: torch.device | str = "cpu") -> list[Score]:
    """The score of each target given its source, in input order; pairs are sorted by length into
    batches of `batch_size` so little padding is computed. Sources and targets are truncated to the
    model's limit."""
    check_pairs(sources, targets)
    model.eval()
    srcs = prepare_sources(tok, [s.strip()
                                 for s in sources], model.max_positions) if sources else []
    tgts = prepare_targets(tok, targets, model.max_positions)
    order = sorted(range(len(sources)), key=lambda i: (len(srcs[i]), len(tgts[i])))
    out: list[Score | None] = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = pad([srcs[i] for i in chunk], tok.pad_id).to(device)  # (B, S)
        tgt_in = pad([[tok.bos_id, *tgts[i]] for i in chunk], tok.pad_id).to(device)  # (B, T)
        tgt_out = pad([[*tgts[i], tok.eos_id] for i in chunk], tok.pad_id).to(device)  # (B, T)
        logp = model(src, tgt_in).float().log_softmax(-1)  # (B, T, V)
        picked = logp.gather(-1, tgt_out[..., None])[..., 0].cpu()  # (B, T)
        for row, i in enumerate(chunk):
            n = len(tgts[i]) + 1
            values = picked[row, :n].tolist()
            out[i] = Score(tok.tgt_pieces([*tgts[i], tok.eos_id]), values, float(sum(values)))
    return out  # type: ignore[return-value]


def check_request(src: Path | None, ref: Path | None, contrastive: Path | None) -> None:
    """What `score_files` needs, checked before a model is loaded: `src` with `ref`, or
    `contrastive`, or both."""
    if (src is None) != (ref is None):
        raise OptionError("`src` and `ref` go together: the sources and the translations to score",
                          "ref")
    if src is None and contrastive is None:
        raise OptionError("give `src` and `ref` (translations to score) or `contrastive` (a file)",
                          "src")


def score_files(translator, src: Path | None = None, ref: Path | None = None,
                contrastive: Path | None = None, *, batch_size: int = 64) -> dict:
    """`attn-mt score`: the scores of `ref` given `src` (a `Translator` of either kind), and/or the
    accuracy on a contrastive set (contrastive.py); {"scores": [Score as a dict, ...],
    "contrastive": report}."""
    from attn_mt.data.lines import read_aligned
    from attn_mt.decoding.contrastive import evaluate_contrastive, read_items

    check_request(src, ref, contrastive)
    out: dict = {}
    if src is not None:
        sources, refs = read_aligned(src, ref)
        out["scores"] = [asdict(s) for s in translator.score(sources, refs, batch_size=batch_size)]
    if contrastive is not None:
        items = read_items(contrastive)
        result = evaluate_contrastive(lambda s, t: translator.score(s, t, batch_size=batch_size),
                                      items)
        out["contrastive"] = result.json()
    return out


def format_scores(result: dict) -> str:
    """`attn-mt score`'s output: one log P a line for `ref` (ContraPro's scores file, higher is
    better), then the contrastive accuracy overall and by pronoun, distance and role."""
    lines = [f"{s['log_prob']:.4f}" for s in result.get("scores", [])]
    if (c := result.get("contrastive")) is not None:
        lines.append(f"contrastive accuracy {c['accuracy']:.2%} ({c['correct']}/{c['items']}: the "
                     "reference scores higher than every variant)")
        for group, title in (("by_pronoun", "pronoun"), ("by_distance", f"distance ({c['unit']})"),
                             ("by_role", "antecedent")):
            if c[group]:
                lines.append(f"  by {title}: " + ", ".join(f"{k} {v['accuracy']:.1%} ({v['items']})"
                                                         for k, v in c[group].items()))
    return "\n".join(lines)


def write_json(result: dict, path: Path) -> Path:
    """`result` as JSON at `path`, written whole or not at all."""
    import json

    from attn_mt.files import write_report

    return write_report(path, json.dumps(result, indent=2, ensure_ascii=False) + "\n", "json")
