"""The RNN baseline: shapes, source masking, caching, overfitting, training, checkpoints, beam
search."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attn_mt import checkpoint
from attn_mt.config import DecodeConfig, RNNConfig, to_dict
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.metrics import score
from attn_mt.decoding.translate import greedy, translate, translate_nbest
from attn_mt.models import AttentionWeights, build_model
from attn_mt.models.rnn import RNNCache, RNNSeq2Seq

PAD, BOS, EOS, V = 0, 2, 3, 40


def make(**kw) -> RNNSeq2Seq:
    cfg = RNNConfig(**{"d_embed": 16, "d_hidden": 16, "d_attn": 8, "dropout": 0.0, **kw})
    torch.manual_seed(0)
    return build_model(cfg, src_vocab=V, tgt_vocab=V, pad_id=PAD, shared_vocab=True).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 4:] = PAD  # sentence 1 has 4 real tokens
    src[2, 6:] = PAD
    return src, torch.randint(4, V, (3, 5), generator=g)


@pytest.mark.parametrize("cell,n_layers", [("gru", 1), ("lstm", 2)])
def test_shapes(cell, n_layers):
    model = make(cell=cell, n_layers=n_layers)
    src, tgt = batch()
    mask = model.src_mask(src)
    assert mask.shape == (3, 1, 1, 7)  # the Transformer's convention
    assert model.encode(src, mask).shape == (3, 7, 32)  # (B, S, 2Hd)
    assert model(src, tgt).shape == (3, 5, V)
    weights = cross_weights(model, src, tgt)
    assert weights.shape == (3, 5, 7)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 5))


def cross_weights(model, src, tgt) -> torch.Tensor:
    """The additive attention of a teacher-forced pass, (B, T, S)."""
    weights, mask = AttentionWeights(), model.src_mask(src)
    model.decode(tgt, model.encode(src, mask, weights), mask, weights=weights)
    assert not weights.encoder_self and not weights.decoder_self and len(weights.cross) == 1
    return weights.cross[0][:, 0]


def test_embeddings_tied_and_separate():
    model = make()
    assert model.out_proj.weight is model.tgt_embed.weight is model.src_embed.weight
    untied = build_model(RNNConfig(d_embed=16, d_hidden=16, tie_embeddings=False), src_vocab=30,
                         tgt_vocab=V, pad_id=PAD, shared_vocab=False)
    assert untied.out_proj.weight is not untied.tgt_embed.weight
    assert untied.src_embed.weight.shape == (30, 16)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_padded_source_positions_are_ignored(cell):
    model = make(cell=cell)
    src, tgt = batch()
    logits = model(src, tgt)
    weights = cross_weights(model, src, tgt)
    assert (weights[1, :, 4:] == 0).all()  # no attention on padding
    assert (weights[2, :, 6:] == 0).all()
    longer = F.pad(src, (0, 5), value=PAD)  # five more pad columns
    assert torch.allclose(model(longer, tgt), logits, atol=1e-5)
    alone = model(src[1:2, :4], tgt[1:2])  # sentence 1 without any padding or neighbours
    assert torch.allclose(alone, logits[1:2], atol=1e-5)


def test_cached_decoding_matches_full_decoding():
    model = make(n_layers=2)
    src, tgt = batch()
    mask = model.src_mask(src)
    memory = model.encode(src, mask)
    full = model.decode(tgt, memory, mask)
    cache = model.new_cache()
    # several positions at once, then one by one
    steps = [model.decode(tgt[:, :2], memory, mask, cache)]
    steps += [model.decode(tgt[:, t : t + 1], memory, mask, cache) for t in range(2, 5)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_reorder_cache_follows_the_batch():
    model = make()
    src, tgt = batch()
    mask = model.src_mask(src)
    memory = model.encode(src, mask)
    cache = model.new_cache()
    model.decode(tgt[:, :2], memory, mask, cache)
    index = torch.tensor([2, 2, 0, 1])  # as beam search does: keep, repeat, reorder rows
    cache.reorder(index)
    got = model.decode(tgt[index, 2:3], memory[index], mask[index], cache)
    want = model.decode(tgt[index, :3], memory[index], mask[index])[:, 2:3]
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.slow
def test_overfits_a_few_sentences():
    torch.manual_seed(0)
    model = make(d_embed=32, d_hidden=32, d_attn=32).train()
    src, tgt = batch()
    tgt_in = F.pad(tgt, (1, 0), value=BOS)
    tgt_out = F.pad(tgt, (0, 1), value=EOS)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    out = greedy(model.eval(), src, torch.full((3,), 8), BOS, EOS)
    assert out == tgt.tolist()


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory):
    """A tiny RNN trained by train.train for two epochs on the toy corpus."""
    from conftest import TINY

    from attn_mt.config import load_config
    from attn_mt.training.run import train

    cfg = load_config(None, [o for o in TINY if not o.startswith("model.")])
    cfg = replace(cfg, model=RNNConfig(d_embed=32, d_hidden=32, d_attn=32, dropout=0.0))
    run_dir = tmp_path_factory.mktemp("rnn_run")
    return run_dir, train(cfg, run_dir)


@pytest.mark.slow
def test_trains_through_the_shared_loop(rnn_run):
    run_dir, best = rnn_run
    results = json.loads((run_dir / "results.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and metrics[1]["valid_loss"] < metrics[0]["valid_loss"]
    model, cfg, tok = checkpoint.load_model(best)
    assert isinstance(model, RNNSeq2Seq) and cfg.model.kind == "rnn"
    assert results["params"] == sum(p.numel() for p in model.parameters())
    # the reported score is sacrebleu's on the run's own test texts, and those are the tested
    # model's
    hyps = (run_dir / "test_hyps.txt").read_text(encoding="utf-8").splitlines()
    sources = (run_dir / "test.en").read_text(encoding="utf-8").splitlines()
    refs = (run_dir / "test.de").read_text(encoding="utf-8").splitlines()
    assert results["test_bleu"] == score(hyps, refs)["bleu"]
    assert hyps == translate(model, tok, sources, cfg.decode)


@pytest.mark.slow
def test_checkpoint_round_trip(rnn_run, tmp_path):
    run_dir, best = rnn_run
    state = checkpoint.load(best)
    tok = Tokenizer.from_state(state["tokenizer"])
    cfg = replace(checkpoint.model_from_state(state)[1], model=RNNConfig(d_embed=24, d_hidden=20,
                                                                         cell="lstm", n_layers=2))
    torch.manual_seed(3)
    model = build_model(cfg.model, **tok.sizes()).eval()
    checkpoint.save({"model": model.state_dict(), "config": to_dict(cfg), "tokenizer": tok.state()},
                    tmp_path / "rnn.pt")
    loaded, _, _ = checkpoint.load_model(tmp_path / "rnn.pt")
    src, tgt = batch()
    src, tgt = src % tok.src_vocab_size, tgt % tok.tgt_vocab_size
    assert torch.equal(loaded(src, tgt), model(src, tgt))


@pytest.mark.slow
def test_beam_search(rnn_run, monkeypatch):
    model, _, tok = checkpoint.load_model(rnn_run[1])
    calls = []
    reorder = RNNCache.reorder
    monkeypatch.setattr(RNNCache, "reorder", lambda c, i: calls.append(i) or reorder(c, i))
    texts = ["the small dog sees the cat.", "a woman likes the old horses.",
             "the child finds a book."]
    nbest = translate_nbest(model, tok, texts, DecodeConfig(beam_size=4, nbest=4))
    assert calls, "beam search never reordered the RNN's cache"
    # four hypotheses per sentence, best first, and the best one is what translate returns
    for hyps in nbest:
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert [n[0].text for n in nbest] == translate(model, tok, texts, DecodeConfig(beam_size=4))
