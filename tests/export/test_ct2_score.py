"""`attn-mt score` on a CTranslate2 export: its scores (score_batch) are the checkpoint's."""

import pytest
from conftest import cli, toy_test_files

from attn_mt.data.pronoun import contrastive_records, make_pronoun_corpus
from attn_mt.data.toy import make_toy_corpus
from attn_mt.decoding.contrastive import evaluate_contrastive, items_from_records
from attn_mt.decoding.translator import checkpoint_translator


def test_export_scores_equal_the_checkpoints(tiny_run, tiny_ct2):
    from attn_mt.imports.ct2_translator import export_translator, load_exported, score_texts

    pairs = make_toy_corpus(300)["test"][:20]
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    # an empty target, and one over the position limit
    refs[3], refs[5] = "", " ".join([refs[5]] * 60)
    ours = checkpoint_translator(tiny_run / "checkpoint_best.pt", "cpu").score(
        sources, refs, batch_size=7)
    theirs = score_texts(load_exported(tiny_ct2), sources, refs, batch_size=7)
    assert export_translator(tiny_ct2, "cpu").score(sources, refs) == theirs
    for a, b in zip(ours, theirs, strict=True):
        assert a.tokens == b.tokens
        assert a.log_prob == pytest.approx(b.log_prob, abs=1e-3)
        assert a.token_log_probs == pytest.approx(b.token_log_probs, abs=1e-3)
    assert theirs[3].tokens == ["</s>"]


def test_contrastive_accuracy_of_the_export_is_the_checkpoints(tiny_run, tiny_ct2, tmp_path):
    from attn_mt.imports.ct2_translator import export_translator

    items = items_from_records(contrastive_records(make_pronoun_corpus(200, seed=0)["test"]))[:20]
    a = evaluate_contrastive(checkpoint_translator(tiny_run / "checkpoint_best.pt", "cpu").score,
                             items)
    b = evaluate_contrastive(export_translator(tiny_ct2, "cpu").score, items)
    assert a.results == b.results
    src, ref = toy_test_files(tmp_path, 4)
    result = cli("score", "--checkpoint", tiny_ct2, "--src", src, "--ref", ref, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 4
