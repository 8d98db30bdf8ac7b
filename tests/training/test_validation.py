"""training/validation.py: the validation loss against a pair-by-pair computation, validation BLEU
that leaves the RNG alone, and test scoring."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attn_mt.checkpoint import load_model
from attn_mt.data.corpus import load_corpus
from attn_mt.decoding.metrics import bleu, score
from attn_mt.decoding.translate import translate
from attn_mt.training.validation import score_test_split, valid_bleu, validate, validation_loss

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def trained(tiny_run):
    model, cfg, _ = load_model(tiny_run / "checkpoint_best.pt")
    return model, cfg, load_corpus(cfg, cfg.model.max_positions)


def test_validation_loss_is_the_mean_token_cross_entropy(trained):
    model, cfg, corpus = trained
    split, tok = cfg.data.splits.valid, corpus.tok
    total, n = 0.0, 0
    with torch.no_grad():
        # one pair at a time: no padding at all
        for src, tgt in zip(*corpus.text[split], strict=True):
            s = torch.tensor([tok.encode_src([src])[0][: model.max_positions - 1] + [tok.eos_id]])
            ids = tok.encode_tgt([tgt])[0][: model.max_positions - 1]
            t_in, t_out = torch.tensor([[tok.bos_id] + ids]), torch.tensor([ids + [tok.eos_id]])
            total += F.cross_entropy(model(s, t_in)[0], t_out[0], reduction="sum").item()
            n += t_out.numel()
    loss = validation_loss(model, corpus, split, cfg.train.batch_tokens, CPU, "fp32")
    assert loss == pytest.approx(total / n, rel=1e-4)
    # below a uniform guess: the tiny model learnt something
    assert loss < math.log(tok.tgt_vocab_size)


def test_validate_gives_loss_and_greedy_bleu_and_keeps_the_rng(trained):
    model, cfg, corpus = trained
    torch.manual_seed(3)
    state = torch.get_rng_state()
    metrics = validate(model, corpus, cfg, CPU, "fp32")
    loss, value = metrics["valid_loss"], metrics["valid_bleu"]
    assert torch.equal(torch.get_rng_state(), state)  # training goes on with the same random stream
    assert model.training  # and in training mode
    assert loss == validation_loss(model, corpus, cfg.data.splits.valid, cfg.train.batch_tokens,
                                   CPU, "fp32")
    src, ref = (x[: cfg.train.bleu_sentences] for x in corpus.text[cfg.data.splits.valid])
    greedy = translate(model.eval(), corpus.tok, src, replace(cfg.decode, beam_size=1, nbest=1),
                       CPU)
    assert value == valid_bleu(model, corpus, cfg, CPU, "fp32") == bleu(greedy, ref)


def test_test_scores_are_those_of_the_translated_test_split(trained):
    model, cfg, corpus = trained
    hyps, scores = score_test_split(model.eval(), corpus, cfg, CPU, "fp32")
    src, ref = corpus.text[cfg.data.splits.test]
    assert hyps == translate(model, corpus.tok, src, cfg.decode, CPU)
    assert scores == score(hyps, ref)
