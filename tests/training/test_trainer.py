"""The training step: accumulated gradients equal one big batch's, and the Trainer walks each
epoch's batches in the order (seed, epoch) fixes, `accum_steps` batches per optimizer step."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY
from torch import nn

from attn_mt.config import TrainConfig, load_config
from attn_mt.data.batching import token_batches
from attn_mt.data.corpus import load_corpus
from attn_mt.models import build_model
from attn_mt.training.trainer import Trainer, TrainStep

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def corpus():
    cfg = load_config(None, TINY)
    return cfg, load_corpus(cfg, cfg.model.max_positions)


def model_for(cfg, corpus):
    torch.manual_seed(0)
    return build_model(cfg.model, **corpus.tok.sizes())


def test_accumulated_halves_give_the_whole_batch_gradient(corpus):
    cfg, corpus = corpus
    split = cfg.data.splits.train
    index = token_batches(*corpus.lengths(split), cfg.train.batch_tokens, 0, 0)[0]
    half = len(index) // 2
    whole, halves = model_for(cfg, corpus), model_for(cfg, corpus)
    n_tokens = sum(corpus.lengths(split)[1][i] + 1 for i in index)
    one, two = TrainStep(whole, cfg.train, CPU, "fp32"), TrainStep(halves, cfg.train, CPU, "fp32")
    loss_one = one.backward(corpus.batches(split, [index]), n_tokens)
    loss_two = two.backward(corpus.batches(split, [index[:half], index[half:]]), n_tokens)
    # the summed loss of the same tokens
    torch.testing.assert_close(loss_one, loss_two, rtol=1e-5, atol=0)
    for (name, a), b in zip(whole.named_parameters(), halves.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7, msg=lambda m,
                                   name=name: f"{name}: {m}")
    before = copy.deepcopy(whole.state_dict())
    assert one.update(loss_one, 1e-3) == pytest.approx(loss_one.item())
    assert all(p.grad is None for p in whole.parameters())  # the step cleared the gradients
    assert not torch.equal(whole.state_dict()["out_proj.weight"], before["out_proj.weight"])


@pytest.mark.parametrize("accum", [1, 2])
def test_trainer_walks_the_epoch_in_seeded_order(corpus, accum):
    cfg, corpus = corpus
    from dataclasses import replace

    cfg = replace(cfg, train=replace(cfg.train, accum_steps=accum))
    tr = Trainer(model_for(cfg, corpus), cfg, corpus, CPU, "fp32")
    lens = corpus.lengths(cfg.data.splits.train)
    plan = token_batches(*lens, cfg.train.batch_tokens, cfg.train.seed, 0)
    assert tr.epoch_batches() == plan
    expected, steps = [], 0
    while not tr.epoch_done:
        group = plan[tr.state.batch_in_epoch: tr.state.batch_in_epoch + accum]
        expected.append(sum(lens[1][i] + 1 for b in group for i in b))
        out = tr.step(lambda: 0.0)
        assert out.n_tokens == expected[-1] and out.loss is not None and out.lr > 0
        steps += 1
    assert steps == -(-len(plan) // accum) and tr.state.step == steps
    assert tr.state.tokens == sum(expected) == sum(t + 1 for t in lens[1])  # every pair once
    tr.next_epoch()
    assert (tr.state.epoch, tr.state.batch_in_epoch) == (1, 0)
    assert (tr.epoch_batches() == token_batches(*lens, cfg.train.batch_tokens, cfg.train.seed, 1)
            != plan)


def test_a_copy_of_the_trainer_state_replays_the_same_step(corpus):
    """Same weights, optimizer and place in the epoch: the same loss (what resume relies on)."""
    cfg, corpus = corpus
    a = Trainer(model_for(cfg, corpus), cfg, corpus, CPU, "fp32")
    a.step(lambda: 0.0)
    b = Trainer(copy.deepcopy(a.model), cfg, corpus, CPU, "fp32")
    b.opt.load_state_dict(a.opt.state_dict())
    b.state = copy.deepcopy(a.state)
    torch.manual_seed(1)
    x = a.step(lambda: 0.0).loss
    torch.manual_seed(1)
    assert b.step(lambda: 0.0).loss == x


@pytest.mark.parametrize("overrides", [{"accum_steps": 2}, {"subword_sampling": 0.2}])
def test_batches_built_ahead_in_a_thread_train_exactly_as_in_place(corpus, overrides):
    """The GPU path's prefetch thread (and pinned buffers, where pinning is possible) on the CPU:
    the same losses and weights, bit for bit, as building each step's batches when it starts."""
    from dataclasses import replace

    from attn_mt.data.prefetch import Prefetcher

    cfg, corpus = corpus
    cfg = replace(cfg, train=replace(cfg.train, **overrides))
    plain, ahead = (Trainer(model_for(cfg, corpus), cfg, corpus, CPU, "fp32") for _ in range(2))
    ahead.feed = Prefetcher()
    losses = []
    for tr in (plain, ahead):
        torch.manual_seed(5)
        losses.append([])
        while tr.state.epoch < 2:
            while not tr.epoch_done:
                losses[-1].append(tr.step(lambda: 0.0).loss)
            tr.next_epoch()
    ahead.feed.close()
    assert losses[0] == losses[1] and len(losses[0]) > 4
    for a, b in zip(plain.model.parameters(), ahead.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("skip_check", ["host", "device"])
def test_without_clipping_a_non_finite_gradient_skips_the_step_too(skip_check):
    """train.clip_norm: 0 used to leave the gradient norm unread: a finite loss with an infinite
    gradient was applied and every weight became NaN. The norm is checked, clipped or not, with
    either skip check."""
    layer = nn.Linear(2, 2)
    step = TrainStep(layer, TrainConfig(clip_norm=0.0, skip_check=skip_check), CPU, "fp32")
    before = [p.detach().clone() for p in layer.parameters()]
    layer.weight.grad, layer.bias.grad = torch.full((2, 2), float("inf")), torch.zeros(2)
    step.update(torch.tensor(1.0), lr=1e-3)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))
    layer.weight.grad, layer.bias.grad = torch.ones(2, 2), torch.ones(2)
    step.update(torch.tensor(1.0), lr=1e-3)
    assert torch.isfinite(layer.weight).all() and not torch.equal(before[0], layer.weight)
