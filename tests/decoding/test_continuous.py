"""Continuous decoding: sentences that join a running batch at any step, and leave it when they end,
get what offline search gives them; the batch's rows and cache shrink as they leave."""

from __future__ import annotations

import copy
import functools
import random

import pytest
import torch
from conftest import BOS, EOS, PAD, batch, sources, train_reverser, with_distance_bias

from attn_mt.config import DecodeConfig, RNNConfig
from attn_mt.decoding.continuous import RunningBatch, RunningLimit, supports
from attn_mt.decoding.search import beam_search, greedy_search
from attn_mt.models import build_model

SETTINGS = [DecodeConfig(beam_size=1, alpha=0.0, max_len_b=3),
            DecodeConfig(beam_size=5, nbest=3, max_len_b=3),
            DecodeConfig(beam_size=4, nbest=4, alpha=1.0, max_len_b=3)]


@pytest.fixture(scope="module")
def model():
    return train_reverser()


def offline(model, srcs, cfg):
    src, max_len = batch(srcs)  # max_len 1.5 |src| + 3, as the settings above
    if cfg.beam_size == 1:
        return [[h] for h in greedy_search(model, src, max_len, bos_id=BOS, eos_id=EOS,
                                           alpha=cfg.alpha)]
    return beam_search(model, src, max_len, bos_id=BOS, eos_id=EOS, beam_size=cfg.beam_size,
                       nbest=cfg.nbest, alpha=cfg.alpha)


def test_the_length_rule_reads_each_rows_own_step():
    logp = torch.randn(4, 6).log_softmax(-1)
    limit = RunningLimit(torch.tensor([1, 2, 3, 1]), eos_id=5)
    per_row = limit.apply(torch.tensor([0, 1, 1, 0]), logp.clone(),
                          torch.zeros(4, 0, dtype=torch.long))
    assert per_row[:2].isfinite().sum() == 2 and torch.equal(per_row[2], logp[2])
    assert per_row[[0, 1], 5].tolist() == logp[[0, 1], 5].tolist()
    # none at it
    assert torch.equal(limit.apply(torch.tensor([-1, 0, 1, -1]), logp.clone(), logp[:, :0]), logp)


def running(model, cfg) -> RunningBatch:
    return RunningBatch(model, cfg, bos_id=BOS, eos_id=EOS, pad_id=PAD)


def run_staggered(rb: RunningBatch, srcs, seed: int, room: int = 12):
    """Sentences join a few at a time (0-4 a step, at most `room` at once); their events, and the
    rows seen."""
    rng, todo, done, tokens, rows = random.Random(seed), list(range(len(srcs))), {}, {}, []
    with torch.inference_mode():
        while todo or len(rb):
            take = [todo.pop(0) for _ in range(min(rng.randint(0, 4), room - len(rb), len(todo)))]
            rb.add([(i, srcs[i]) for i in take])
            rows.append(rb.rows)
            for e in rb.step():
                if e.kind == "done":
                    assert e.tag not in done
                    done[e.tag] = e.value
                elif e.kind == "token":
                    tokens.setdefault(e.tag, []).append(e.value)
    return done, tokens, rows


@pytest.mark.parametrize("cfg", SETTINGS, ids=["greedy", "beam5-nbest3", "beam4-alpha1"])
def test_joining_at_any_step_gives_the_offline_result(model, cfg):
    check_joining(model, cfg)


@pytest.mark.parametrize("cfg", SETTINGS[:2], ids=["greedy", "beam5-nbest3"])
def test_rows_at_different_positions_with_rotary_positions(cfg):
    """Rotary positions turn each row's keys by its own positions, however late it joined."""
    check_joining(rotary_model(), cfg)


@pytest.mark.parametrize("cfg", SETTINGS[:2], ids=["greedy", "beam5-nbest3"])
def test_rows_at_different_positions_with_a_bias_on_the_scores(model, cfg):
    """A position scheme's bias over each row's own keys (right-aligned in the cache), however
    late the row joined."""
    check_joining(with_distance_bias(copy.deepcopy(model)), cfg)


@functools.cache
def rotary_model():
    return train_reverser(positions="rotary", qk_norm=True)


def check_joining(model, cfg) -> None:
    srcs = sources(40, seed=5)
    want = offline(model, srcs, cfg)
    got, _, rows = run_staggered(running(model, cfg), srcs, seed=1)
    assert sorted(got) == list(range(len(srcs)))
    for i, nbest in enumerate(want):
        assert [h.tokens for h in got[i]] == [h.tokens for h in nbest], i
        assert [h.score for h in got[i]] == pytest.approx([h.score for h in nbest], abs=1e-4)
    assert max(rows) <= 12 * cfg.beam_size and len(set(rows)) > 3  # the batch grew and shrank


def test_greedy_streams_each_token_and_beams_each_hypothesis(model):
    srcs = sources(6, seed=7)
    done, tokens, _ = run_staggered(running(model, SETTINGS[0]), srcs, seed=2)
    for i, nbest in done.items():
        steps = tokens.get(i, [])
        assert [list(t) for t in steps] == [nbest[0].tokens[:n]
                                            for n in range(1, len(nbest[0].tokens) + 1)]
    rb = running(model, SETTINGS[1])
    rb.add([(0, srcs[0])])
    events = []
    with torch.inference_mode():
        while len(rb):
            events += rb.step()
    found = [e.value for e in events if e.kind == "hypothesis"]
    (final,) = [e.value for e in events if e.kind == "done"]
    assert all(h in found for h in final) and len(found) >= len(final)


def test_sentences_leave_when_they_end_and_the_cache_shrinks(model):
    short, long = [5, EOS], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, EOS]
    rb = running(model, SETTINGS[0])
    rb.add([("short", short)])
    with torch.inference_mode():
        rb.step()
        rb.add([("long", long)])  # joins one step late: its columns start one later
        seen = {}
        while len(rb):
            events = rb.step()
            for e in events:
                if e.kind == "done":
                    seen[e.tag] = rb.cache and (rb.rows, rb.cache.memory_mask.size(-1),
                                                len(rb.cache), rb.steps[0])
    rows, source, columns, decoded = seen["short"]
    assert (rows, source) == (1, len(long))  # its row left; the memory is the long source's alone
    assert columns == decoded  # the column only the short one used is gone
    assert seen["long"] is None and rb.cache is None and rb.chooser is None and not rb.ys


def test_dropped_sentences_leave_and_the_others_are_unchanged(model):
    srcs, cfg = sources(8, seed=9), SETTINGS[1]
    want = offline(model, srcs, cfg)
    rb, done = running(model, cfg), {}
    rb.add(list(enumerate(srcs)))
    with torch.inference_mode():
        for _ in range(2):
            done.update((e.tag, e.value) for e in rb.step() if e.kind == "done")
        rb.drop({1, 4, 6})
        assert rb.rows == cfg.beam_size * len(rb) and {1, 4, 6}.isdisjoint(rb.tags)
        while len(rb):
            done.update((e.tag, e.value) for e in rb.step() if e.kind == "done")
    for i in set(range(8)) - {1, 4, 6}:
        assert [h.tokens for h in done[i]] == [h.tokens for h in want[i]]


def test_only_a_transformer_decodes_in_a_running_batch(model):
    rnn = build_model(RNNConfig(d_embed=8, d_hidden=8, d_attn=8), src_vocab=16, tgt_vocab=16,
                      pad_id=PAD, shared_vocab=True)
    assert supports(model) and not supports(rnn)


def test_sentences_with_their_own_alpha_and_nbest_share_a_batch_and_get_their_offline_result(model):
    """Alpha and n-best are each sentence's own: sentences that differ only in them decode in one
    batch (one decoder call a step), each as offline search with its settings decodes it."""
    srcs = sources(24, seed=11)
    mixed = [DecodeConfig(beam_size=4, alpha=a, nbest=n, max_len_b=3) for a,
             n in [(0.0, 1), (0.6, 4), (1.0, 2),
                   (2.0, 3)]]
    want = {i: offline(model, [src], mixed[i % 4])[0] for i, src in enumerate(srcs)}
    rb, got = running(model, mixed[0]), {}
    rng, todo = random.Random(3), list(range(len(srcs)))
    with torch.inference_mode():
        while todo or len(rb):
            take = [todo.pop(0) for _ in range(min(rng.randint(0, 4), len(todo)))]
            rb.add([(i, srcs[i]) for i in take], [mixed[i % 4] for i in take])
            got.update((e.tag, e.value) for e in rb.step() if e.kind == "done")
    for i, nbest in want.items():
        assert [h.tokens for h in got[i]] == [h.tokens for h in nbest], i
        assert [h.score for h in got[i]] == pytest.approx([h.score for h in nbest], abs=1e-4)
    greedy = running(model, SETTINGS[0])
    with pytest.raises(ValueError, match="beam size and length limits"):
        greedy.add([(0, srcs[0])], [DecodeConfig(beam_size=2, max_len_b=3)])
