"""Metrics: corpus BLEU and chrF with sacrebleu (detokenized, cased, 13a) with their signatures. A
model's validation loss, validation BLEU and test scores are training's (training/validation.py)."""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF


def score(hyps: list[str], refs: list[str]) -> dict:
    """{"bleu", "chrf", "bleu_signature", "chrf_signature"} for one reference per hypothesis."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2),
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature())}


def text(result: dict) -> str:
    """An evaluation (`evaluate_texts`' result: scores and decode settings) as `attn-mt evaluate`
    prints it."""
    decode = result["decode"]
    return (f"beam {decode['beam_size']}, alpha {decode['alpha']}\nBLEU {result['bleu']:.2f}  "
            f"({result['bleu_signature']})\nchrF {result['chrf']:.2f}  "
            f"({result['chrf_signature']})")


def bleu(hyps: list[str], refs: list[str]) -> float:
    """Corpus BLEU, rounded to 2 decimals."""
    return round(BLEU().corpus_score(hyps, [refs]).score, 2)
