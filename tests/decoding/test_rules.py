"""Decoding rules: each rules out what it says and nothing else, in every loop; a rule may read the
tokens."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import BOS, EOS, V, batch, sources, train_reverser
from torch import Tensor

from attn_mt.api.steering import Prefix, Sample
from attn_mt.decoding.rules import BAN, DRAW, FORCE, LIMIT, BanIds, MaxLength, only, step_rules
from attn_mt.decoding.search import beam_search, greedy_search


@pytest.fixture(scope="module")
def reverser():
    return train_reverser()


def test_only_keeps_one_token_where_asked():
    logp = torch.randn(3, 5).log_softmax(-1)
    out = only(logp.clone(), torch.tensor([2, -1, 0]))
    assert out[0, 2] == logp[0, 2] and out[0].isfinite().sum() == 1
    assert torch.equal(out[1], logp[1])
    assert out[2, 0] == logp[2, 0] and out[2].isfinite().sum() == 1


def test_ban_max_length_prefix_and_sample_rule_out_what_they_say():
    logp = torch.randn(4, 6).log_softmax(-1)
    tokens = torch.zeros(4, 0, dtype=torch.long)
    banned = BanIds([1, 3]).apply(0, logp.clone(), tokens)
    assert (banned[:, [1, 3]].eq(-math.inf).all()
            and torch.equal(banned[:, [0, 2, 4, 5]], logp[:, [0, 2, 4, 5]]))
    limit = MaxLength(torch.tensor([1, 2, 3, 1]), eos_id=5)
    # rows 1, 2 are not at their limit
    assert torch.equal(limit.apply(0, logp.clone(), tokens)[1:3], logp[1:3])
    last = limit.apply(0, logp.clone(), tokens)
    assert last[[0, 3], 5].tolist() == logp[[0,
                                             3], 5].tolist() and last[[0, 3]].isfinite().sum() == 2
    prefix = Prefix([[4], [], [2, 2], [0]], "cpu")
    assert prefix.apply(0, logp.clone(), tokens).isfinite().sum(-1).tolist() == [1, 6, 1, 1]
    assert prefix.apply(1, logp.clone(), tokens).isfinite().sum(-1).tolist() == [6, 6, 1, 6]
    assert torch.equal(prefix.apply(2, logp.clone(), tokens), logp)
    drawn = Sample(1.0, [1, 2, 3, 4], "cpu").apply(0, logp.clone(), tokens)
    assert drawn.isfinite().sum(-1).tolist() == [1, 1, 1, 1]
    # seeded
    assert torch.equal(drawn, Sample(1.0, [1, 2, 3, 4], "cpu").apply(0, logp.clone(), tokens))


class NoRepeat:
    """A rule that reads the tokens so far: a token never follows itself."""

    order = BAN

    def __init__(self) -> None:
        self.seen: list[Tensor] = []

    def apply(self, step: int, logp: Tensor, tokens: Tensor) -> Tensor:
        self.seen.append(tokens.clone())
        if step == 0:
            return logp
        return logp.scatter(1, tokens[:, -1:], -math.inf)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_rule_sees_the_tokens_so_far_in_greedy_and_beam(reverser, beam):
    # a source repeating a token: the reverser would too
    srcs = [s + s[-1:] * 3 for s in sources(6, seed=5)]
    src, max_len = batch(srcs)
    rule = NoRepeat()
    if beam == 1:
        outs = [h.tokens for h in greedy_search(reverser, src, max_len, bos_id=BOS, eos_id=EOS,
                                                rules=[rule])]
        free = [h.tokens for h in greedy_search(reverser, src, max_len, bos_id=BOS, eos_id=EOS)]
    else:
        search = dict(bos_id=BOS, eos_id=EOS, beam_size=beam)
        outs = [n[0].tokens for n in beam_search(reverser, src, max_len, rules=[rule], **search)]
        free = [n[0].tokens for n in beam_search(reverser, src, max_len, **search)]
    assert [t.shape for t in rule.seen[:3]] == [(6 * beam, 0), (6 * beam, 1), (6 * beam, 2)]
    assert all(a != b for out in outs for a, b in zip(out, out[1:], strict=False))
    # the rule did something
    assert any(a == b for out in free for a, b in zip(out, out[1:], strict=False))


class EosBan:
    """A caller's rule that bans eos before step `until` (a minimum length; every step: None)."""

    order = BAN

    def __init__(self, until: int | None = None) -> None:
        self.until = until

    def apply(self, step: int, logp: Tensor, tokens: Tensor) -> Tensor:
        if self.until is None or step < self.until:
            logp[:, EOS] = -math.inf
        return logp


def test_rules_run_in_their_order_whatever_order_they_are_given_in():
    """A ban given after sampling still runs before it: in the given order, the draw of eos (the
    only likely token) is then banned and leaves the row no token at all."""
    rules = [Sample(1.0, [7], "cpu"), Prefix([[5]], "cpu"), EosBan()]
    limit = MaxLength(torch.tensor([4]), EOS)
    ordered = step_rules(object(), rules, limit)
    assert [r.order for r in ordered] == [BAN, FORCE, DRAW, LIMIT] and ordered[-1] is limit
    logp = torch.full((1, V), -30.0).index_fill(1, torch.tensor([EOS]), 0.0).log_softmax(-1)
    given = logp.clone()
    for rule in (rules[0], rules[2]):  # sampling, then the ban, as given
        given = rule.apply(1, given, torch.zeros(1, 1, dtype=torch.long))
    assert not given.isfinite().any()
    for rule in step_rules(object(), [rules[0], rules[2]], limit):
        logp = rule.apply(1, logp, torch.zeros(1, 1, dtype=torch.long))
    assert logp.isfinite().sum() == 1 and logp[0, EOS] == -math.inf


def test_sampling_with_a_ban_given_after_it_draws_what_the_ban_left(reverser):
    src, max_len = batch(sources(8, seed=3))
    hyps = greedy_search(reverser, src, max_len, bos_id=BOS, eos_id=EOS,
                         rules=[Sample(5.0, list(range(8)), "cpu"), EosBan(until=3)])
    assert all(math.isfinite(h.log_prob) for h in hyps)
    assert all(len(h.tokens) >= min(3, int(n) - 1) for h, n in zip(hyps, max_len, strict=True))


@pytest.mark.parametrize("beam", [1, 3])
def test_the_length_limit_has_the_last_word_over_a_ban_of_eos(reverser, beam):
    """eos banned at every step: each output still ends at its limit (eos, which the ban had ruled
    out, at log P 0) and beam search still has its n-best list."""
    src, max_len = batch(sources(5, seed=9))
    how = dict(bos_id=BOS, eos_id=EOS, rules=[EosBan()])
    nbests = ([[h] for h in greedy_search(reverser, src, max_len, **how)] if beam == 1 else
              beam_search(reverser, src, max_len, beam_size=beam, nbest=2, **how))
    for nbest, n in zip(nbests, max_len.tolist(), strict=True):
        assert len(nbest) == min(beam, 2)
        assert all(len(h.tokens) == n - 1 and math.isfinite(h.log_prob) for h in nbest)
