"""Metrics: sacrebleu scores with signatures (validation and test scoring:
tests/training/test_validation.py)."""

from __future__ import annotations

import pytest
from sacrebleu.metrics import BLEU, CHRF

from attn_mt.decoding.metrics import bleu, score

HYPS = ["the dog sees a cat .", "a man reads the old book", "children play"]
REFS = ["the dog sees the cat .", "a man reads an old book", "the children play outside"]


def test_score_is_sacrebleu_with_signatures():
    s = score(HYPS, REFS)
    assert s["bleu"] == round(BLEU().corpus_score(HYPS, [REFS]).score, 2) == bleu(HYPS, REFS)
    assert s["chrf"] == round(CHRF().corpus_score(HYPS, [REFS]).score, 2)
    assert s["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert s["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    assert score(REFS, REFS)["bleu"] == 100.0 and score(REFS, REFS)["chrf"] == 100.0
    assert score(["x y z"] * 3, REFS)["bleu"] == 0.0
    with pytest.raises(ValueError, match="3 hypotheses but 2 references"):
        score(HYPS, REFS[:2])
