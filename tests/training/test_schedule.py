"""The learning-rate schedule, the training budget and why a run stops: pure functions of step and
clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attn_mt.config import TrainConfig
from attn_mt.training.schedule import budget_spent, limit_reached, lr_at
from attn_mt.training.stops import Stop


def test_lr_warmup_then_inverse_sqrt():
    cfg = TrainConfig(lr=1e-3, warmup_steps=100)
    assert lr_at(1, cfg) == pytest.approx(1e-5)
    assert lr_at(50, cfg) == pytest.approx(5e-4)
    assert lr_at(100, cfg) == pytest.approx(1e-3)
    assert lr_at(400, cfg) == pytest.approx(5e-4)
    assert max(lr_at(s, cfg) for s in range(1, 1000)) == pytest.approx(1e-3)


def test_lr_linear_decay_to_zero_over_the_budget():
    cfg = TrainConfig(lr=1e-3, warmup_steps=100, schedule="linear")
    assert lr_at(50, cfg, 0.0) == pytest.approx(5e-4)
    assert lr_at(100, cfg, 0.0) == pytest.approx(1e-3)
    assert lr_at(5000, cfg, 0.25) == pytest.approx(7.5e-4)
    assert lr_at(5000, cfg, 1.0) == 0.0


def test_linear_warmup_never_outlasts_its_share_of_a_short_budget():
    cfg = TrainConfig(lr=1e-3, warmup_steps=500, schedule="linear", warmup_fraction=0.1,
                      max_steps=300)
    lrs = [lr_at(s, cfg, budget_spent(cfg, s - 1, 0.0, 0.0)) for s in range(1, 301)]
    peak = max(range(300), key=lambda i: lrs[i])
    assert 25 <= peak <= 35  # the warmup ends at 10% of 300 steps, not at step 500
    assert lrs[peak] == pytest.approx(1e-3 * (1 - peak / 300), rel=1e-6)
    assert lrs[-1] < 1e-5 and all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :], strict=False))
    long = TrainConfig(lr=1e-3, warmup_steps=500, schedule="linear", warmup_fraction=0.1,
                       max_steps=10_000)
    # a long budget: warmup_steps decide
    assert lr_at(250, long, 0.025) == pytest.approx(5e-4 * 0.975)
    assert lr_at(250, replace(cfg, warmup_fraction=0.0), 0.5) == pytest.approx(5e-4 * 0.5)


def test_wsd_holds_the_peak_then_decays_over_the_last_share_of_the_budget():
    cfg = TrainConfig(lr=1e-3, warmup_steps=100, schedule="wsd", decay_fraction=0.2, max_steps=1000)
    lrs = [lr_at(s, cfg, budget_spent(cfg, s, 0.0, 0.0)) for s in range(1, 1001)]
    assert lrs[49] == pytest.approx(5e-4) and lrs[99] == pytest.approx(1e-3)  # warmup
    assert all(x == pytest.approx(1e-3) for x in lrs[99:800])  # stable up to 80% of the budget
    assert lrs[899] == pytest.approx(5e-4) and lrs[-1] == 0.0  # then linear to 0 at its end


def test_a_token_budget_sets_the_schedule_and_stops_the_run():
    cfg = TrainConfig(max_epochs=100, max_tokens=50_000, max_minutes=10)
    # tokens lead
    assert budget_spent(cfg, step=3, seconds=6, epochs=0.1, tokens=40_000) == pytest.approx(0.8)
    assert limit_reached(cfg, 3, 6.0, 49_999) is None
    assert (limit_reached(cfg, 3, 6.0, 50_000) == Stop.max_tokens(cfg) == "reached "
            "train.max_tokens=50000")


def test_budget_spent_is_the_first_limit_to_end():
    cfg = TrainConfig(max_epochs=10, max_steps=1000, max_minutes=2)
    assert budget_spent(cfg, step=100, seconds=30, epochs=5) == pytest.approx(0.5)  # epochs lead
    assert budget_spent(cfg, step=800, seconds=30, epochs=1) == pytest.approx(0.8)  # steps lead
    assert budget_spent(cfg, step=10, seconds=90, epochs=1) == pytest.approx(0.75)  # minutes lead
    assert budget_spent(TrainConfig(max_epochs=4), step=10**6, seconds=10**6, epochs=8) == 1.0


def test_limits_name_the_key_that_ended_the_run():
    cfg = TrainConfig(max_steps=100, max_minutes=2.0)
    assert limit_reached(cfg, 99, 119.0) is None
    assert limit_reached(cfg, 100, 0.0) == Stop.max_steps(cfg) == "reached train.max_steps=100"
    assert limit_reached(cfg, 5, 120.0) == Stop.max_minutes(cfg) == "reached train.max_minutes=2.0"
    # no step or time limit: epochs decide
    assert limit_reached(TrainConfig(), 10**9, 10**9) is None
    assert Stop.max_epochs(TrainConfig(max_epochs=3)) == "reached train.max_epochs=3"
    assert Stop.patience(TrainConfig(patience=4)) == "no BLEU improvement in 4 evaluations"


def test_resume_reads_the_same_wording(tiny_cfg):
    """A finished run's stop reason comes from Stop, so resume and run agree on why it ended."""
    from attn_mt.training.resume import finished
    from attn_mt.training.schedule import TrainState

    tc = tiny_cfg("train.max_epochs=2", "train.patience=3").train
    assert finished(TrainState(epoch=2, stopped="x"), tc) == Stop.max_epochs(tc)
    assert finished(TrainState(epoch=1, bad_evals=3, stopped="x"), tc) == Stop.patience(tc)
    # Ctrl-C or a kill: not finished
    assert finished(TrainState(epoch=1, bad_evals=3, stopped=""), tc) is None
    # a larger budget
    assert finished(TrainState(epoch=1, stopped="x"), replace(tc, max_epochs=5)) is None
