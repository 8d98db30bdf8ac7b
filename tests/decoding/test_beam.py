"""Beam search: batch-independence, cache, n-best lists, length limits, exactness on a tiny search
space."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import BOS, EOS, PAD, batch, sources, train_reverser

from attn_mt.data.batching import pad
from attn_mt.decoding.beam import length_penalty
from attn_mt.decoding.search import beam_search, greedy_search


@pytest.fixture(scope="module")
def model():
    return train_reverser()


def search(model, srcs, **kw):
    src, max_len = batch(srcs)
    return beam_search(model, src, max_len, bos_id=BOS, eos_id=EOS, **kw)


def test_hypotheses_do_not_depend_on_the_batch(model):
    srcs = sources(64, seed=1)  # lengths 2..12: most sentences are padded in the full batch
    together = search(model, srcs, beam_size=5, nbest=5)
    alone = [search(model, [s], beam_size=5, nbest=5)[0] for s in srcs]
    assert [[h.tokens for h in n] for n in together] == [[h.tokens for h in n] for n in alone]
    for a, b in zip(together, alone, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    assert any(len(n[0].tokens) + 1 < len(s) * 1.5 + 3 for n, s in zip(together, srcs, strict=True))


def test_cache_and_no_cache_give_the_same_beams(model):
    srcs = sources(16, seed=2)
    cached = search(model, srcs, beam_size=4, nbest=4, alpha=1.0)
    uncached = search(model, srcs, beam_size=4, nbest=4, alpha=1.0, use_cache=False)
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in uncached]


def test_beam_of_one_without_length_penalty_is_greedy(model):
    srcs = sources(32, seed=3)
    src, max_len = batch(srcs)
    beam = beam_search(model, src, max_len, bos_id=BOS, eos_id=EOS, beam_size=1, alpha=0.0)
    greedy = greedy_search(model, src, max_len, bos_id=BOS, eos_id=EOS)
    assert [n[0].tokens for n in beam] == [h.tokens for h in greedy]
    assert [n[0].log_prob for n in beam] == pytest.approx([h.log_prob for h in greedy], abs=1e-4)


def test_beam_finds_outputs_greedy_misses(model):
    srcs = sources(32, seed=4)
    beam = search(model, srcs, beam_size=5, alpha=0.0)
    greedy = greedy_search(model, *batch(srcs), bos_id=BOS, eos_id=EOS)
    assert all(n[0].log_prob >= g.log_prob - 1e-4 for n, g in zip(beam, greedy, strict=True))
    assert any(n[0].log_prob > g.log_prob + 1e-3 for n, g in zip(beam, greedy, strict=True))


def teacher_forced_log_probs(model, src: list[int], outs: list[list[int]]) -> list[float]:
    """log P(out + eos | src) for each output, in one batch (outputs may contain any token)."""
    tgt_in = pad([[BOS, *o] for o in outs], PAD)
    tgt_out = pad([[*o, EOS] for o in outs], PAD)
    logp = model(torch.tensor([src] * len(outs)), tgt_in).log_softmax(-1)  # (N, T, V)
    real = torch.arange(tgt_out.size(1)) <= torch.tensor([len(o) for o in outs])[:, None]  # (N, T)
    return (logp.gather(2, tgt_out[..., None])[..., 0] * real).sum(1).tolist()


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_nbest_lists_are_sorted_scored_and_within_limits(model, alpha):
    srcs = sources(12, seed=5)
    for s, nbest in zip(srcs, search(model, srcs, beam_size=5, nbest=3, alpha=alpha), strict=True):
        assert len(nbest) == 3 and len({tuple(h.tokens) for h in nbest}) == 3
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        assert [h.log_prob for h in nbest] == pytest.approx(
            teacher_forced_log_probs(model, s, [h.tokens for h in nbest]), abs=1e-3)
        for h in nbest:
            assert len(h.tokens) + 1 <= int(len(s) * 1.5 + 3) and EOS not in h.tokens
            assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens) + 1, alpha))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_beam_as_wide_as_the_search_space_finds_the_exact_n_best(alpha):
    """Vocabulary 6, at most 3 output tokens: 30 beams hold every prefix; compare with brute
    force."""
    model = train_reverser(vocab=6, steps=20)
    src = [4, 5, 4, EOS]
    outputs = [list(p) for n in range(3) for p in itertools.product([0, 1, 2, 4, 5], repeat=n)]
    log_probs = teacher_forced_log_probs(model, src, outputs)
    scores = [lp / length_penalty(len(o) + 1, alpha) for lp,
              o in zip(log_probs, outputs, strict=True)]
    best = sorted(zip(scores, outputs, strict=True), reverse=True)
    found = beam_search(model, torch.tensor([src]), torch.tensor([3]), bos_id=BOS, eos_id=EOS,
                        beam_size=30, nbest=5, alpha=alpha)[0]
    assert [h.tokens for h in found] == [o for _, o in best[:5]]


def test_output_limit_is_per_sentence(model):
    srcs = sources(8, seed=6)
    src, _ = batch(srcs)
    max_len = torch.tensor([1, 2, 3, 4, 1, 2, 3, 4])
    for n, limit in zip(beam_search(model, src, max_len, bos_id=BOS, eos_id=EOS, beam_size=3,
                                    nbest=3),
                        max_len.tolist(), strict=True):
        assert n and all(len(h.tokens) + 1 <= limit for h in n)
        if limit == 1:  # only eos fits: the empty output is the whole search space
            assert [h.tokens for h in n] == [[]]


def test_stops_when_every_sentence_has_ended(model):
    """A model that always says eos first: one decoder step, empty outputs."""
    calls = []
    decode = model.decode

    def counting_decode(*args, **kw):
        logits = decode(*args, **kw)
        calls.append(1)
        return logits.index_fill(-1, torch.tensor([EOS]), 100.0)

    model.decode = counting_decode
    try:
        out = search(model, sources(4, seed=7), beam_size=4, nbest=1)
    finally:
        del model.decode
    assert [n[0].tokens for n in out] == [[]] * 4 and len(calls) == 1


def test_nbest_cannot_exceed_the_beam(model):
    with pytest.raises(ValueError, match="nbest"):
        search(model, sources(1, seed=8), beam_size=2, nbest=3)
