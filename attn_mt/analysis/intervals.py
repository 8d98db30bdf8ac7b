"""Bootstrap intervals for BLEU changes: how much of a head's dBLEU is the sentences drawn, not the
head.

Each sentence's BLEU statistics (sacreBLEU's: hypothesis and reference length, matching and total
n-grams for n = 1..4) are kept once; a resample draws sentences with replacement and scores the same
draw with and without the head, so the two BLEUs share their sentences (a paired bootstrap, as Koehn
2004 for two systems).

Tested in tests/analysis/test_heads.py.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 1000
LEVEL = 0.95


def sentence_stats(hyps: list[str], refs: list[str]) -> np.ndarray:
    """(N, 10) sacreBLEU statistics per sentence: lengths, then matching and total n-grams for n =
    1..4."""
    from sacrebleu.metrics import BLEU

    return np.asarray(BLEU()._extract_corpus_statistics(hyps, [refs]), dtype=np.int64).reshape(
        len(hyps), -1)


def _bleus(stats: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """(resamples,) the BLEU of each resampled sentence set `idx` (resamples, n), from the (n, 10)
    statistics, summed as (times each sentence is drawn) @ stats: one product for all draws; each
    distinct sum is scored once (few sentences have few: one sentence, one)."""
    from sacrebleu.metrics import BLEU

    resamples, n = idx.shape
    counts = np.bincount((np.arange(resamples)[:, None] * n + idx).ravel(),
                         minlength=resamples * n).reshape(resamples, n)  # (resamples, n)
    sums, which = np.unique(counts @ stats, axis=0, return_inverse=True)  # (distinct, 10)
    bleu = BLEU()
    scores = np.array([bleu._compute_score_from_stats(row).score for row in sums.tolist()])
    return scores[which.reshape(-1)]


def draws(n: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, n) sentence indices drawn with replacement: the same draws for every head of a
    report."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def delta_interval(base: np.ndarray, changed: np.ndarray, idx: np.ndarray, level: float = LEVEL,
                   ) -> tuple[float, float]:
    """The `level` interval of BLEU(changed) - BLEU(base) over the resampled sentence sets `idx`
    (rounded to 2 decimals)."""
    deltas = _bleus(changed, idx) - _bleus(base, idx)  # (resamples,)
    lo, hi = np.quantile(deltas, [(1 - level) / 2, (1 + level) / 2])
    return round(float(lo), 2), round(float(hi), 2)
